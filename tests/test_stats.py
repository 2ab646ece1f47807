"""_stats.LoaderStats: the stall counters behind ``loader.stats()`` and the one-line ``stats_summary()``."""

from __future__ import annotations

import pytest

import fastload
from fastload._front import stats as _stats
from fastload._front.stats import LoaderStats

from conftest import open_train


def test_stats_say_whether_the_loop_is_input_bound(image_shards):
    import time

    dl = fastload.DataLoader(open_train(image_shards), batch_size=4, num_workers=1)
    for _ in dl:
        time.sleep(0.02)  # a slow "training step": the loader keeps up
    s = dl.stats()
    assert s["batches"] == len(dl) and s["samples"] == 48 and s["step_s"] > 0.15
    assert s["fill_s"] > 0 and 0 <= s["wait_fraction"] < 1
    assert s["hybrid"] is None  # native threads alone: no CPU/GPU split to report (tests/test_gpu_decoders_sim.py)
    assert "not input-bound" in dl.stats_summary() or "INPUT-BOUND" in dl.stats_summary()
    fast = fastload.DataLoader(open_train(image_shards), batch_size=4, num_workers=0)
    for _ in fast:
        pass  # no step at all: the loop only waits for data
    assert "INPUT-BOUND" in fast.stats_summary()


@pytest.fixture
def clock(monkeypatch):
    """A hand-driven ``perf_counter``: ``clock.now`` is what the stats read, so the sums are exact."""
    class Clock:
        now = 0.0
    c = Clock()
    monkeypatch.setattr(_stats.time, "perf_counter", lambda: c.now)
    return c


def step(stats, clock, step_s, wait_s, samples=4, ready=0, fill_s=0.0):
    """The training step runs ``step_s``, then ``__next__`` waits ``wait_s`` for the next batch."""
    clock.now += step_s
    started = clock.now
    clock.now += wait_s
    stats.took(started, samples, ready=ready, fill_s=fill_s)


def test_the_sums_count_waits_steps_fills_and_queue_depth(clock):
    s = LoaderStats()
    step(s, clock, step_s=5.0, wait_s=1.0, ready=2, fill_s=0.5)  # the time before the first batch is no step
    step(s, clock, step_s=3.0, wait_s=0.5, samples=2, ready=1, fill_s=0.25)
    d = s.as_dict()
    assert (d["batches"], d["samples"]) == (2, 6)
    assert (d["wait_s"], d["step_s"], d["fill_s"]) == (1.5, 3.0, 0.75)
    assert d["wait_fraction"] == pytest.approx(1.5 / 4.5)
    assert d["samples_per_s"] == pytest.approx(6 / 4.5)
    assert d["mean_queue_depth"] == 1.5 and d["fill_ms_per_batch"] == pytest.approx(375.0)


def test_the_gap_between_epochs_is_no_training_step(clock):
    s = LoaderStats()
    step(s, clock, step_s=0.0, wait_s=1.0)
    s.end_epoch()
    step(s, clock, step_s=60.0, wait_s=1.0)  # a validation pass between epochs
    assert s.as_dict()["step_s"] == 0.0
    step(s, clock, step_s=2.0, wait_s=1.0)
    assert s.as_dict()["step_s"] == 2.0


def test_reset_clears_every_counter(clock):
    s = LoaderStats()
    step(s, clock, step_s=0.0, wait_s=1.0, ready=3, fill_s=1.0)
    s.reset()
    assert s.as_dict() == LoaderStats().as_dict()
    step(s, clock, step_s=7.0, wait_s=1.0)
    assert s.as_dict()["step_s"] == 0.0  # the step before the first batch after reset() is not counted


def test_no_batches_reads_as_zeros_not_a_division_by_zero():
    d = LoaderStats().as_dict()
    assert d["wait_fraction"] == d["samples_per_s"] == d["mean_queue_depth"] == d["fill_ms_per_batch"] == 0.0
    assert LoaderStats().summary() == "fastload: no batches yet"


@pytest.mark.parametrize("wait_s, bound", [(0.5, True), (0.05, False), (0.1, False)],
                         ids=["waits a third", "waits 5%", "waits exactly 10%"])
def test_summary_says_input_bound_when_the_loop_waits_over_a_tenth(clock, wait_s, bound):
    s = LoaderStats()
    step(s, clock, step_s=0.0, wait_s=wait_s)
    step(s, clock, step_s=1.0 - wait_s, wait_s=0.0)  # a loop of 1 s in all
    text = s.summary()
    assert text.startswith("fastload: 2 batches, 8 samples/s; the loop waited")
    assert f"{wait_s:.2f} s of 1.00 s" in text
    if bound:
        assert "INPUT-BOUND" in text and "num_workers" in text and "fastload bench" in text
    else:
        assert text.endswith(": not input-bound")
