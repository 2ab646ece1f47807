"""The simulated GPU itself (tests/sim_streams.py): each capability the device path's tests rely on, shown
on a case that only that capability can decide. test_ring.py runs fastload on it."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from fastload.fast.device import DevicePrefetcher, DeviceRing
from sim_streams import Race, SimGpu, _describe, _raw


def write(sim: SimGpu, t: torch.Tensor, value: int, what: str = "writer") -> None:
    sim.launch(lambda: t.fill_(value), writes=(t,), what=what)


def read(sim: SimGpu, t: torch.Tensor, seen: list, what: str = "reader") -> None:
    sim.launch(lambda: seen.append(t.clone()), reads=(t,), what=what)


# -- per-thread current stream, the legacy default stream ---------------------------------------------
def test_each_thread_starts_on_the_legacy_default_stream():
    """A stream made current in one thread is not current in another: a thread that picks none queues
    its work on the legacy default stream, unordered with the main thread's stream."""
    sim = SimGpu()
    user = sim.new_stream("user")
    x = sim.alloc((1024,), torch.uint8)
    where = []
    with sim.stream(user):
        t = threading.Thread(target=lambda: (where.append(sim.current_stream()), write(sim, x, 1)))
        t.start()
        t.join()
        assert sim.current_stream() == user  # a new object per call, as torch.cuda.current_stream()
        ev = sim.record(user)
    assert where == [sim.default]
    sim.wait(sim.side, ev)
    with sim.side_context():
        read(sim, x, [])
    with pytest.raises(Race, match="writer on default"):
        sim.run_all()


@pytest.mark.parametrize("blocking", [True, False])
def test_the_legacy_default_stream_orders_blocking_streams_only(blocking):
    """Work on the legacy default stream waits for earlier work on blocking streams (cudaStreamDefault),
    not for the non-blocking streams torch makes."""
    sim = SimGpu()
    other = sim.new_stream("other", blocking=blocking)
    x = sim.alloc((1024,), torch.uint8)
    with sim.stream(other):
        write(sim, x, 7)
    seen: list = []
    read(sim, x, seen)  # on the legacy default stream
    if blocking:
        sim.run(sim.default)  # waits for `other` first
        assert not seen and not sim.races
        sim.run_all()
        assert int(seen[0][0]) == 7
    else:
        with pytest.raises(Race):
            sim.run_all()


# -- copies from pageable host memory ------------------------------------------------------------------
def test_a_copy_from_pageable_memory_waits_for_the_stream():
    """cudaMemcpyAsync from pageable memory first waits for the stream (and what it waits on): a consumer
    stream lagging behind makes the host wait for its queued work. From pinned memory the host goes on."""
    sim = SimGpu()
    dst = sim.alloc((64,), torch.uint8)
    lagging = sim.alloc((64,), torch.uint8)
    write(sim, lagging, 3, "model step")  # queued on the consumer (legacy default) stream
    fence = sim.record(sim.default)
    with sim.side_context():
        sim.wait(sim.side, fence)
        pinned = sim.host_empty((64,), torch.uint8).fill_(1)
        sim.copy(dst, pinned)
        assert sim.waits_in() == [] and sim.default.ops  # queued, the model step has not run
        pageable = torch.full((64,), 2, dtype=torch.uint8)
        sim.copy(dst, pageable)
    waits = sim.waits_in()
    assert len(waits) == 1 and waits[0].ran >= 2 and waits[0].why == "copy from pageable memory"
    assert int(lagging[0]) == 3  # the host waited until the model step ran
    pageable.fill_(9)  # the bytes were staged when the copy was called
    sim.run_all()
    assert int(dst[0]) == 2


def test_a_copy_from_pageable_memory_on_an_idle_gpu_is_a_host_wait_too():
    """Nothing queued (the first batch of a process): the copy waits for nothing, yet it is a host sync, and
    ``waits_in()`` lists it (``busy=True`` leaves out the waits that ran no queued work)."""
    sim = SimGpu()
    dst = sim.alloc((64,), torch.uint8)
    with sim.side_context():
        sim.copy(dst, torch.full((64,), 2, dtype=torch.uint8))
    waits = sim.waits_in()
    assert len(waits) == 1 and waits[0].ran == 0 and waits[0].why == "copy from pageable memory"
    assert sim.waits_in(busy=True) == []


def test_waits_name_the_thread_that_blocked():
    sim = SimGpu()
    dst = sim.alloc((8,), torch.uint8)
    write(sim, dst, 1)

    def producer():
        sim.copy(dst, torch.ones(8, dtype=torch.uint8))

    t = threading.Thread(target=producer, name="producer")
    t.start()
    t.join()
    assert sim.waits_in() == [] and len(sim.waits_in("producer")) == 1


# -- the caching allocator: small and large pools, block splitting ------------------------------------
def test_small_requests_never_take_large_blocks():
    sim = SimGpu()
    big = sim.alloc((2 << 20,), torch.uint8)  # large pool
    addr = big.data_ptr()
    del big
    small = sim.alloc((512 << 10,), torch.uint8)
    assert small.data_ptr() != addr  # a new 2 MiB small segment
    large = sim.alloc((3 << 19,), torch.uint8)  # 1.5 MiB: split from the cached 20 MiB segment's block
    assert large.data_ptr() == addr


def test_a_freed_block_is_split_and_merged_again():
    sim = SimGpu()
    a = sim.alloc((4096,), torch.uint8)
    b = sim.alloc((4096,), torch.uint8)
    pa = a.data_ptr()
    assert b.data_ptr() == pa + 4096  # carved one after the other from one segment
    del a
    c = sim.alloc((1000,), torch.uint8)  # rounded to 1024, split from a's 4096 bytes
    assert c.data_ptr() == pa
    d = sim.alloc((3000,), torch.uint8)  # the 3072 left of a's block
    assert d.data_ptr() == pa + 1024
    del c, d, b
    e = sim.alloc((8192,), torch.uint8)  # the three merged (and the segment's tail)
    assert e.data_ptr() == pa


def test_a_block_given_back_after_its_recorded_streams_ran_is_reused_in_order():
    """A block recorded for the side stream goes back to its pool once the side stream's work at free time
    has run; the allocator learned that by an event query, so the next user of the block on the allocating
    stream comes after that work: no race (the checker reported one before the query joined the host clock)."""
    sim = SimGpu()
    x = sim.alloc((1024,), torch.uint8)
    sim.record_stream(x, sim.side)
    d = _describe(x)
    with sim.side_context():  # a kernel keeps no tensor alive: Python frees x below, its write still queued
        sim.launch(lambda: _raw(d).fill_(1), writes=(x,), what="side writer")
    addr = x.data_ptr()
    del x
    sim.run(sim.side)  # its work, and the event the free recorded after it
    y = sim.alloc((1024,), torch.uint8)
    assert y.data_ptr() == addr
    write(sim, y, 2)
    sim.run_all()
    assert not sim.races and int(y[0]) == 2


def test_a_freed_block_of_another_size_still_traps_an_unfenced_slot(monkeypatch):
    """The H100 trap with sizes that differ: a 64 KiB buffer the consumer's queued kernel still reads
    is freed; the prefetcher's first slot (about 1.5 KiB) is split from it. Without the fence the side
    stream's copy writes it under the queued read; with it, nothing races."""
    for fenced in (True, False):
        sim = SimGpu()
        if not fenced:
            real = sim.wait
            monkeypatch.setattr(sim, "wait", lambda s, ev: None if s is sim.side else real(s, ev))
        junk = sim.alloc((64 << 10,), torch.uint8)
        sim.model_step([junk], [], scratch=False)  # queued; keeps no reference (a kernel does not)
        del junk
        gc.collect()
        g = torch.Generator().manual_seed(0)
        batches = [[torch.randint(0, 256, (8, 3, 6, 6), dtype=torch.uint8, generator=g), torch.arange(8)]]
        pf = DevicePrefetcher(batches, depth=1, ring=DeviceRing("cpu", streams=sim))
        out = next(pf)
        if fenced:
            sim.run_all()
            assert not sim.races and torch.equal(out[0], batches[0][0])
        else:
            with pytest.raises(Race, match="model step"):
                sim.run_all()
        monkeypatch.undo()


def test_timing_events_report_the_simulated_time_of_late_execution():
    """Kernels advance their stream's simulated clock when they run, not when queued; a wait moves the clock
    to the awaited event's time; elapsed() between two events reads it, and refuses while one has not
    completed (as CUDA's elapsed_time does), so a test can make a GPU slow and code must query first."""
    sim = SimGpu()
    sim.cost = lambda what, nbytes: {"slow": 0.5}.get(what, 0.0)
    s, other = sim.new_stream("s"), sim.new_stream("other")
    start = sim.record(s, timing=True)
    with sim.stream(s):
        for _ in range(2):
            sim.launch(lambda: None, what="slow")
    end = sim.record(s, timing=True)
    with sim.stream(other):
        for _ in range(4):
            sim.launch(lambda: None, what="slow")
    sim.wait(s, sim.record(other))
    after = sim.record(s, timing=True)
    with pytest.raises(RuntimeError, match="not completed"):
        sim.elapsed(start, end)  # queued, not run: no time yet
    sim.run(s)  # runs up to the wait on the other stream
    assert sim.elapsed(start, end) == pytest.approx(1.0) and not after.complete
    sim.run_all()
    assert sim.elapsed(end, after) == pytest.approx(1.0)  # waited until the other stream's 2 s


# -- what queued work keeps alive, whose clock is whose -------------------------------------------------
def test_queued_work_keeps_no_device_tensor_alive():
    """On CUDA a launch returns with the kernels queued and the tensors its function captured die with it: a
    slot whose rows a queued kernel writes is free again (use counts back to their baseline) as soon as Python
    lets go of it. The simulator's late closure used to keep them alive until it ran (the slot stayed held, so
    no test reached a reused buffer); now it holds raw views of the bytes, and still writes them when it runs."""
    from fastload._ring import use_count

    sim = SimGpu()
    x = sim.alloc((1024,), torch.uint8)
    base = use_count(x)
    view = x[:512]
    sim.launch(lambda: view.fill_(3), writes=(view,))  # a closure cell
    sim.launch(lambda t=x[512:]: t.fill_(4), writes=(x[512:],))  # a default argument
    sim.launch(lambda ts=(x[:1],): ts[0].fill_(5), writes=(x[:1],))  # inside a tuple
    del view
    assert use_count(x) == base
    sim.run_all()
    assert int(x[0]) == 5 and int(x[1]) == 3 and int(x[600]) == 4
    seen: list = []
    read(sim, x, seen)  # a host list the function fills stays the caller's
    sim.run_all()
    assert len(seen) == 1


def test_two_streams_of_one_name_have_clocks_of_their_own():
    """Two loaders each fork a stream named 'rows': what the host learned of one must not order the other's work
    (keyed by name, it did, and hid a race)."""
    sim = SimGpu()
    a, b = sim.new_stream("rows"), sim.new_stream("rows")
    x = sim.alloc((1024,), torch.uint8)
    with sim.stream(b):
        write(sim, x, 1, what="b's writer")
    with sim.stream(a):
        for _ in range(5):
            write(sim, sim.alloc((16,), torch.uint8), 0)
        ev = sim.record(a)
    sim.run(a)
    assert sim.done(ev)  # the host learned a's clock, ahead of b's: nothing of b
    write(sim, x, 2, what="default's writer")
    sim.run(b)
    with pytest.raises(Race, match="b's writer on rows and write by default's writer"):
        sim.run(sim.default)
