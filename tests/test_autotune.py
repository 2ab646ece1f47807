"""_autotune: ``num_workers="auto"`` measures the thread counts once per dataset and machine, then caches."""

from __future__ import annotations

import json
import os

import pytest

import fastload
from fastload._front import autotune as _autotune

from conftest import open_train


def test_auto_workers_measures_once_then_uses_the_cache(image_shards, tmp_path, monkeypatch, capsys):
    from fastload._front import autotune as _autotune

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    dl = fastload.DataLoader(open_train(image_shards), batch_size=8, num_workers="auto")
    err = capsys.readouterr().err
    assert "num_workers='auto' chose" in err and "measured" in err
    assert dl.num_workers in _autotune.candidates(os.cpu_count() or 1)
    assert _autotune.cache_path().exists()
    assert sum(1 for _ in dl) == len(dl)

    def no_measuring(*a, **k):
        raise AssertionError("the cached choice should be used")

    monkeypatch.setattr(_autotune, "measure", no_measuring)
    again = fastload.DataLoader(open_train(image_shards), batch_size=8, num_workers="auto")
    assert again.num_workers == dl.num_workers and "cached" in capsys.readouterr().err
    assert _autotune.choose({0: 100.0, 1: 180.0, 2: 185.0}) == 1  # within 5%: fewer threads


@pytest.mark.parametrize("rates, chosen", [
    ({1: 100.0, 4: 300.0, 8: 200.0}, 4),
    ({1: 95.0, 2: 100.0}, 1),  # exactly 95% of the best still counts as as fast
    ({1: 94.0, 2: 100.0}, 2),
    ({8: 100.0, 2: 100.0, 4: 100.0}, 2),
    ({3: 10.0}, 3),
], ids=["clear best", "at 95%", "under 95%", "a tie", "one count"])
def test_choose_takes_the_fewest_threads_within_5_percent_of_the_best(rates, chosen):
    assert _autotune.choose(rates) == chosen


@pytest.mark.parametrize("cpus, counts", [(1, [0, 1]), (2, [0, 1, 2]), (6, [0, 1, 2, 4, 6]), (8, [0, 1, 2, 4, 8])])
def test_candidates_are_no_thread_one_the_powers_of_two_and_every_cpu(cpus, counts):
    assert _autotune.candidates(cpus) == counts


def test_the_cache_lives_under_xdg_cache_home_else_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _autotune.cache_path() == tmp_path / "xdg" / "fastload" / "autotune.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _autotune.cache_path() == tmp_path / "home" / ".cache" / "fastload" / "autotune.json"


@pytest.fixture
def measured(monkeypatch):
    """``autotune`` with a stand-in ``measure`` (no batches filled): records each call, returns fixed rates."""
    calls = []

    def measure(batcher, order, threads, budget_s):
        calls.append(threads)
        return {0: 50.0, 2: 190.0, 1: 120.0, 4: 200.0}

    monkeypatch.setattr(_autotune, "measure", measure)
    return calls


def test_autotune_says_what_it_chose_with_the_rates_by_thread_count(small_images, tmp_path, monkeypatch, capsys,
                                                                   measured):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _autotune.autotune(None, None, fastload.open(small_images), 4) == 2
    err = capsys.readouterr().err
    assert err == ("fastload: num_workers='auto' chose 2 thread(s) (measured; samples/s by threads: 0: 50/s, "
                   "1: 120/s, 2: 190/s, 4: 200/s)\n")
    saved = json.loads(_autotune.cache_path().read_text())
    (entry,) = saved.values()
    assert entry["num_workers"] == 2 and entry["dataset"] == str(small_images)
    assert _autotune.autotune(None, None, fastload.open(small_images), 4) == 2
    assert "(cached; samples/s by threads: 0: 50/s, 1: 120/s, 2: 190/s, 4: 200/s)" in capsys.readouterr().err
    assert len(measured) == 1


def test_another_batch_size_or_transform_is_measured_afresh(small_images, tmp_path, monkeypatch, measured):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _autotune.autotune(None, None, fastload.open(small_images), 4)
    _autotune.autotune(None, None, fastload.open(small_images), 8)
    _autotune.autotune(None, None, open_train(small_images), 8)
    _autotune.autotune(None, None, open_train(small_images), 8)
    assert len(measured) == 3
    assert len(json.loads(_autotune.cache_path().read_text())) == 3


def test_a_pipeline_that_differs_only_in_normalize_is_measured_afresh(small_images, tmp_path, monkeypatch, measured):
    """The key holds the transforms as declared: the same steps given as an ImagePipeline instead of a list key
    alike only when every stage does (the pipeline's repr once left out ToDtype/Normalize)."""
    import torch

    from fastload import transforms as T

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def opened(mean):
        steps = [T.Resize(16), T.ToDtype(torch.float32, scale=True), T.Normalize(mean, [0.5] * 3)]
        return fastload.open(small_images, transforms={"image": T.ImagePipeline(steps)})

    assert _autotune._key(opened([0.5] * 3), 4) == _autotune._key(opened([0.5] * 3), 4)
    _autotune.autotune(None, None, opened([0.5] * 3), 4)
    _autotune.autotune(None, None, opened([0.4] * 3), 4)
    assert len(measured) == 2


@pytest.mark.parametrize("content", ["{not json", "[]", '{"KEY": {"num_workers": "2"}}'],
                         ids=["broken", "a list", "a str count"])
def test_a_damaged_cache_is_measured_over_and_rewritten(small_images, tmp_path, monkeypatch, measured, content):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ds = fastload.open(small_images)
    content = content.replace("KEY", _autotune._key(ds, 4))
    _autotune.cache_path().parent.mkdir(parents=True)
    _autotune.cache_path().write_text(content)
    assert _autotune.autotune(None, None, ds, 4) == 2 and len(measured) == 1
    assert json.loads(_autotune.cache_path().read_text())[_autotune._key(ds, 4)]["num_workers"] == 2


def test_a_cache_that_cannot_be_written_does_not_stop_training(small_images, tmp_path, monkeypatch, measured,
                                                               capsys):
    (tmp_path / "a file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a file"))  # its fastload/ folder cannot be made
    with pytest.warns(RuntimeWarning, match="could not save its measurement to .*each new loader will measure again"):
        assert _autotune.autotune(None, None, fastload.open(small_images), 4) == 2
    assert "chose 2 thread(s) (measured" in capsys.readouterr().err


def test_each_thread_count_is_measured_as_the_loader_would_run_it(monkeypatch):
    """0 threads is measured with the copy helpers a loader at num_workers=0 copies large batches with
    (``copy_helpers_for``), any other count with the pool's own threads."""
    import numpy as np
    import torch

    from fastload._front.autotune import measure

    seen = []

    class Batcher:
        def new_slot(self):
            return None

        def fill(self, slot, idx, rng, pool):
            seen.append((pool.size, pool.copy_helpers))

    class Order:
        def batches(self, epoch, start):
            return [np.arange(4)]

        def batch_rng(self, epoch, b):
            return None

    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        measure(Batcher(), Order(), [0, 2], 0.002)
    finally:
        torch.set_num_threads(old)
    helpers = 1 if (os.cpu_count() or 1) > 1 else 0
    assert set(seen) == {(0, helpers), (2, 0)}
