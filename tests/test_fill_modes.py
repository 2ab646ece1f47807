"""Inline vs producer-thread filling on the fast path (fastload/_loader.py, INLINE_BELOW): cheap batches are
filled by the calling thread whatever num_workers says, expensive ones by a producer thread, and the
switch (also mid-epoch) changes neither the batches nor resume."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import fastload
from fastload import _loader
from fastload import transforms as T
from conftest import jpeg_bytes


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    root = tmp_path_factory.mktemp("fill")
    rng = np.random.default_rng(0)
    fastload.pack({"tokens": rng.integers(0, 1000, (2000, 16), dtype=np.int32),
                   "label": np.arange(2000, dtype=np.int64)}, root / "ds")
    return fastload.open(root / "ds")


def producers() -> int:
    return sum(t.name == "fastload-batcher" for t in threading.enumerate())


@pytest.fixture
def starts(monkeypatch):
    """The batch index at which each iterator started its producer thread."""
    seen = []
    real = _loader._FastIterator._start_producer

    def spy(self):
        seen.append(self.done)
        return real(self)

    monkeypatch.setattr(_loader._FastIterator, "_start_producer", spy)
    return seen


def epoch(loader):
    seen = []
    for batch in loader:
        seen.append([t.clone() for t in batch])
        seen[-1].append(producers())
    return seen


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for p, q in zip(a, b) for x, y in zip(p[:2], q[:2]))


@pytest.mark.parametrize("num_workers", [2, 8])
def test_cheap_batches_are_filled_inline_whatever_num_workers_says(records, num_workers):
    ref = epoch(fastload.DataLoader(records, batch_size=64, shuffle=True, seed=3))
    dl = fastload.DataLoader(records, batch_size=64, shuffle=True, seed=3, num_workers=num_workers)
    got = epoch(dl)
    assert same(ref, got)
    assert all(b[-1] == 0 for b in got)  # no producer thread: the hand-off would cost more than the work
    assert dl._fill_cost < _loader.INLINE_BELOW


def test_expensive_batches_get_a_producer_thread_once_measured(records, monkeypatch, starts):
    monkeypatch.setattr(_loader, "INLINE_BELOW", 0.0)  # every batch counts as expensive
    ref = epoch(fastload.DataLoader(records, batch_size=64, shuffle=True, seed=3))
    dl = fastload.DataLoader(records, batch_size=64, shuffle=True, seed=3, num_workers=2)
    got = epoch(dl)
    assert same(ref, got)
    assert starts == [_loader.FILL_SAMPLES]  # the first batches were filled inline, and measured
    again = epoch(dl)
    assert starts == [_loader.FILL_SAMPLES, 0]  # the next epoch knows the cost: a producer from its first batch


def test_the_switch_mid_epoch_keeps_resume_exact(records, monkeypatch, starts):
    dl = fastload.DataLoader(records, batch_size=64, shuffle=True, seed=5, num_workers=2)
    it = iter(dl)
    for _ in range(4):
        next(it)  # inline so far
    monkeypatch.setattr(_loader, "INLINE_BELOW", 0.0)  # from here on batches are "expensive"
    next(it)
    assert starts == [5]
    state = dl.state_dict()
    rest = [[t.clone() for t in b] for b in it]
    assert producers() == 0  # the producer ended with its epoch
    ref = fastload.DataLoader(records, batch_size=64, shuffle=True, seed=5)
    ref.load_state_dict(state)
    assert same([list(b) for b in ref], rest)


def test_images_take_the_producer_thread(tmp_path, starts):
    for c in range(2):  # photo-sized pictures: decoding 16 of them costs several ms
        d = tmp_path / "src" / f"class_{c}"
        d.mkdir(parents=True)
        for k in range(24):
            (d / f"{k}.jpg").write_bytes(jpeg_bytes(360, 480, seed=100 * c + k))
    fastload.pack(tmp_path / "src", tmp_path / "ds", workers=0)
    ds = fastload.open(tmp_path / "ds", transforms={"image": [T.RandomResizedCrop(224)]})
    dl = fastload.DataLoader(ds, batch_size=16, num_workers=2)
    for _ in dl:
        pass
    if dl._fill_cost >= _loader.INLINE_BELOW:  # 16 decodes cost more than 1 ms on any machine we run on
        for _ in dl:
            pass
        assert starts == [_loader.FILL_SAMPLES, 0]
    else:
        pytest.fail(f"16 photo decodes took {dl._fill_cost * 1e3:.3f} ms per batch: INLINE_BELOW is too high")


def test_fast_path_worker_advice_speaks_of_threads(records):
    import os
    import warnings

    cpus = len(os.sched_getaffinity(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fastload.DataLoader(records, batch_size=64, num_workers=cpus + 6)
        fastload.DataLoader(records, batch_size=64, num_workers=cpus)
    messages = [str(w.message) for w in caught]
    assert not any("worker processes in total" in m for m in messages)  # torch's advice is for processes
    assert sum("native decode threads" in m and f"may use {cpus} CPUs" in m for m in messages) == 1
    with warnings.catch_warnings(record=True) as caught:  # the generic path keeps torch's own advice
        warnings.simplefilter("always")
        fastload.DataLoader(list(range(10)), batch_size=2, num_workers=cpus + 6)
    assert any("worker processes in total" in str(w.message) for w in caught)
