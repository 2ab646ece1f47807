"""Inline vs producer-thread filling on the fast path (fastload/fast/producer.py): cheap batches that the caller
waits on are filled by the calling thread whatever num_workers says, expensive ones (or ones the caller's
own work can hide) by a producer thread, and the switch (also mid-epoch) changes neither the batches nor
resume; a producer reset mid-stream lets go of every batch it had filled."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import fastload
from fastload._fill.batcher import Batcher
from fastload._ring import SlotRing
from fastload._front.stats import LoaderStats
from fastload.fast import producer as _fastiter
from fastload.fast.fill import Fill, Reservations
from fastload.fast.order import Jobs, Order
from fastload.fast.producer import FillPolicy, Produce
from fastload import transforms as T
from conftest import jpeg_bytes


def producers() -> int:
    return sum(t.name == "fastload-batcher" for t in threading.enumerate())


@pytest.fixture
def switches(monkeypatch):
    """(event, batch index) for every producer start and every hand-back to the calling thread."""
    seen = []
    start, back = _fastiter.Produce._start_producer, _fastiter.Produce._take_back

    def spy_start(self):
        seen.append(("start", self.done))
        return start(self)

    def spy_back(self):
        seen.append(("back", self.done))
        return back(self)

    monkeypatch.setattr(_fastiter.Produce, "_start_producer", spy_start)
    monkeypatch.setattr(_fastiter.Produce, "_take_back", spy_back)
    return seen


def epoch(loader, step: float = 0.0):
    seen = []
    for batch in loader:
        seen.append(batch)  # kept, not copied: a drain loop does (almost) nothing per batch
        if step:
            time.sleep(step)  # the caller's own work per batch
    return seen


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for p, q in zip(a, b) for x, y in zip(p, q))


@pytest.mark.parametrize("num_workers", [2, 8])
def test_cheap_batches_in_a_drain_loop_end_up_filled_inline(records, num_workers, switches):
    ref = epoch(fastload.DataLoader(records, batch_size=64, shuffle=True, seed=3))
    dl = fastload.DataLoader(records, batch_size=64, shuffle=True, seed=3, num_workers=num_workers)
    assert same(ref, epoch(dl))
    assert switches[0] == ("start", 0) and switches[1][0] == "back"  # overlap first, then measured: inline
    assert dl._fill_policy.fill_cost < _fastiter.INLINE_BELOW
    del switches[:]
    epoch(dl)
    assert switches == []  # the next epoch knows: no producer thread at all


def test_a_caller_with_work_of_its_own_keeps_the_producer(records, switches):
    dl = fastload.DataLoader(records, batch_size=64, shuffle=True, seed=3, num_workers=2)
    ref = epoch(fastload.DataLoader(records, batch_size=64, shuffle=True, seed=3))
    assert same(ref, epoch(dl, step=0.003))  # a 3 ms step hides every fill
    assert switches == [("start", 0)]


def test_expensive_batches_keep_the_producer(records, monkeypatch, switches):
    monkeypatch.setattr(_fastiter, "INLINE_BELOW", 0.0)  # every batch counts as expensive
    dl = fastload.DataLoader(records, batch_size=64, shuffle=True, seed=3, num_workers=2)
    epoch(dl)
    epoch(dl)
    assert switches == [("start", 0), ("start", 0)]


def test_switches_mid_epoch_keep_batches_and_resume_exact(records, monkeypatch, switches):
    mode = {"threaded": False}  # the policy's verdict, scripted so that the switches happen where we say
    monkeypatch.setattr(_fastiter.FillPolicy, "threaded", lambda self, now: mode["threaded"])
    dl = fastload.DataLoader(records, batch_size=64, shuffle=True, seed=5, num_workers=2)
    ref = epoch(fastload.DataLoader(records, batch_size=64, shuffle=True, seed=5))
    it = iter(dl)
    got = [[t.clone() for t in next(it)] for _ in range(3)]  # inline
    mode["threaded"] = True
    got += [[t.clone() for t in next(it)] for _ in range(6)]  # a producer from batch 3 on
    mode["threaded"] = False
    got += [[t.clone() for t in next(it)] for _ in range(6)]  # handed back after the queued ones
    state = dl.state_dict()
    rest = [[t.clone() for t in b] for b in it]
    assert [k for k, _ in switches] == ["start", "back"] and switches[0][1] == 4, switches  # after batch 3
    assert 9 < switches[1][1] <= 15
    assert producers() == 0
    assert same(ref, got + rest)
    resumed = fastload.DataLoader(records, batch_size=64, shuffle=True, seed=5)
    resumed.load_state_dict(state)
    assert same(epoch(resumed), rest)


def test_policy_decisions():
    p = _fastiter.FillPolicy()
    assert p.threaded(True) and not p.threaded(False)  # unknown: keep the mode
    p.fills.extend([2e-4] * 3)
    p.steps.extend([1e-5] * 3)
    assert not p.threaded(True) and not p.threaded(False)  # cheap, caller waits: inline
    p.steps.extend([5e-3] * 8)
    assert p.threaded(False) and p.threaded(True)  # the caller works: overlap
    p.steps.extend([1.5e-4] * 8)  # between half the fill and the fill: stay where we are
    assert p.threaded(True) and not p.threaded(False)
    p.fills.extend([2e-3] * 8)
    assert p.threaded(False)  # expensive: always a producer


def test_images_keep_the_producer_thread(tmp_path, switches):
    for c in range(2):  # photo-sized pictures: decoding 16 of them costs several ms
        d = tmp_path / "src" / f"class_{c}"
        d.mkdir(parents=True)
        for k in range(24):
            (d / f"{k}.jpg").write_bytes(jpeg_bytes(360, 480, seed=100 * c + k))
    fastload.pack(tmp_path / "src", tmp_path / "ds", workers=0)
    ds = fastload.open(tmp_path / "ds", transforms={"image": [T.RandomResizedCrop(224)]})
    dl = fastload.DataLoader(ds, batch_size=16, num_workers=2)
    epoch(dl)
    epoch(dl)
    cost = dl._fill_policy.fill_cost
    assert cost >= _fastiter.INLINE_BELOW, f"16 photo decodes took {cost * 1e3:.3f} ms: INLINE_BELOW is too high"
    assert switches == [("start", 0), ("start", 0)]


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


@pytest.mark.parametrize("persistent", [False, True])
def test_the_native_threads_outlive_an_epoch_and_per_sample_workers_do_not(records, monkeypatch, persistent):
    """Starting a pool's threads each epoch cost more than an epoch of small batches (bench/suite.py's tiny
    records ran 8-21% slower at num_workers=2 than at 0): every loader keeps its pool across epochs, and its
    decoders (a DALI pipeline built again each epoch made the first next() wait: issue 28). A non-persistent one
    ends, at each epoch's end, what torch's workers would take with them (``ImageDecoding.end_epoch``: its
    per-sample transform workers; its GPU decoders' unused memory, given back off the training thread,
    tests/test_gpu_decoder_threads_sim.py), never the whole ``ImageDecoding`` (``close``); a persistent one keeps
    them."""
    closed = []
    real_end = fastload._fill.images.ImageDecoding.end_epoch
    monkeypatch.setattr(fastload._fill.images.ImageDecoding, "end_epoch",
                        lambda self: (closed.append(1), real_end(self)))
    monkeypatch.setattr(fastload._fill.images.ImageDecoding, "close", lambda self: closed.append("decoders"))
    loader = fastload.DataLoader(records, batch_size=256, num_workers=2, persistent_workers=persistent)
    pools, closes = [], []
    for _ in range(3):
        epoch(loader)
        pools.append(loader._batcher.pool)  # the pool the fills used (made at the first fill)
        closes.append(len(closed))
    assert pools[0] is not None and all(p is pools[0] for p in pools)
    assert closes == [0, 0, 0] if persistent else 0 < closes[0] < closes[1] < closes[2]
    assert "decoders" not in closed


def test_a_producer_reset_mid_stream_drops_its_queue_and_starts_over(records):
    batcher = Batcher(records, 100, 0)
    order = Order(len(records), 100, kind="random", seed=2)
    reserved, stats, policy = Reservations(), LoaderStats(), FillPolicy()
    fill = Fill(Jobs(order, 0, 0, needs_rng=False), batcher, batcher.pool, SlotRing(batcher.new_slot), reserved,
                policy.fills)
    produce = Produce(fill, policy, stats, threads=True, always=True, depth=3, timeout=0, release=reserved.release)
    first = next(produce)  # handed on and not collated: its slot stays reserved
    deadline = time.monotonic() + 10
    while produce.producer.queue.qsize() < 3 and time.monotonic() < deadline:
        time.sleep(0.01)  # the producer thread has filled the batches it may keep ready (and one more in hand)
    produce.reset({"source": {"source": {"batch": 17}}})  # Produce <- Fill <- Jobs
    second = next(produce)
    assert np.array_equal(second[0].arrays["label"][:second[1]], list(order.batches(0, 0))[17])
    for item in produce._stop_producer():  # the new thread's queue, dropped here as reset drops one
        if isinstance(item, tuple):  # a filled slot; the end-of-epoch marker when batches 17-19 are all done
            reserved.release(item[0])
    # every batch the first thread had filled, queued or in hand, was let go: only the two handed on are held
    assert reserved.ids == {id(first[0]), id(second[0])}


def test_a_finished_or_closed_producer_never_waits():
    """next() after the producer thread's last batch, or after close(), raises StopIteration (it waited forever on
    the queue of a thread that had ended); close() from another thread wakes a next() waiting there."""
    def bounded(fn, seconds=10.0):
        out = []
        t = threading.Thread(target=lambda: out.append(_outcome(fn)), daemon=True)
        t.start()
        t.join(seconds)
        assert not t.is_alive(), "next() still waits (a hang)"
        return out[0]

    p = Produce(iter(range(3)), FillPolicy(), LoaderStats(), threads=True, always=True, depth=2, timeout=0)
    assert [next(p) for _ in range(3)] == [0, 1, 2]
    assert bounded(lambda: next(p)) == bounded(lambda: next(p)) == "StopIteration"

    class Slow:
        def __next__(self):
            time.sleep(0.5)
            return "late"

    p = Produce(Slow(), FillPolicy(), LoaderStats(), threads=True, always=True, depth=2, timeout=0)
    threading.Timer(0.1, p.close).start()  # while next() below waits for the slow item
    assert bounded(lambda: next(p)) == "StopIteration"
    assert bounded(lambda: next(p)) == "StopIteration"


def _outcome(fn):
    try:
        return fn()
    except StopIteration:
        return "StopIteration"
