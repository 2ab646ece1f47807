"""The slot ring with consumers on more than one stream (tests/sim_streams.py's simulated GPU): a training loop
that switches streams between epochs or every step, and loaders over one dataset that share its Normalize,
each on a side stream of its own. Each test was shown to fail with the fence, the record or the per-stream
constants it is about put back (named in the test)."""

from __future__ import annotations

import gc

import pytest
import torch

import fastload
from fastload import transforms as T
from fastload.fast.device import DevicePrefetcher, DeviceRing
from sim_streams import SimGpu
from test_ring import MEAN, STD, host_batches, photos, sim_cuda  # noqa: F401  (fixtures)


# -- a consumer that switches streams --------------------------------------------------------------------
@pytest.mark.parametrize("switch", ["between epochs", "every step"])
def test_a_consumer_that_switches_streams_is_fenced_where_it_read(switch):
    """One ring iterated on the default stream, then under ``torch.cuda.stream(user)`` (or alternating
    every step), the GPU lagging: a slot last read on one stream and reused while the other is current must
    be written after the reads on the stream it was handed to, not only after the current stream's."""
    sim = SimGpu()
    user = sim.new_stream("user")
    ring = DeviceRing("cpu", streams=sim)
    src = host_batches(8)
    seen: list = []
    for epoch in range(2):
        it = DevicePrefetcher(src, depth=2, ring=ring)
        for k in range(len(src)):
            on = user if (epoch if switch == "between epochs" else k) % 2 else sim.default
            with sim.stream(on):  # next() and the step on the same stream, as a training loop does
                sim.model_step(list(next(it)), seen)
            sim.run(sim.side)
            if k % 3 == 2:
                sim.run(on)  # that stream catches up now and then; the other one keeps lagging
    sim.run_all()
    assert not sim.races
    refs = [b for _ in range(2) for b in src]
    assert all(torch.equal(x, s[0]) and torch.equal(y, s[1]) for (x, y), s in zip(refs, seen))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_whose_consumer_switches_streams_between_epochs(sim_cuda, photos, num_workers):
    """tests/cuda/test_gpu_lag.py's stream-switch test on the simulated GPU, step for step: epoch 0 on the
    default stream, epoch 1 under torch.cuda.stream(user), epoch 2 on the default stream again; each step
    queues its work (the lag, the comparison) on the current stream and drops the batch at once; a stream
    catches up every third step only. Nothing orders the two consumer streams: a wait_stream at the switch
    would make the new stream's fence cover the old stream's reads, and the test could not fail without the
    fence on the stream that received each slot (``slot.receiver``)."""
    sim = sim_cuda
    ds = fastload.open(photos, transforms={"image": [T.RandomResizedCrop(16), T.RandomHorizontalFlip()]})
    kw = dict(batch_size=8, shuffle=True, seed=5, num_workers=num_workers, persistent_workers=num_workers > 0)
    cpu = fastload.DataLoader(ds, **kw)
    refs = [(x.clone(), y.clone()) for _ in range(3) for x, y in cpu]
    loader = fastload.DataLoader(ds, device="cuda", **kw)
    seen: list = []
    for stream in (sim.default, sim.new_stream("user"), sim.default):
        with sim.stream(stream):
            for k, (x, y) in enumerate(loader):
                sim.model_step([x, y], seen)
                del x, y
                sim.run(sim.side)
                if k % 3 == 2:
                    sim.run(stream)
    sim.run_all()
    assert not sim.races and not sim.waits_in()
    assert len(seen) == len(refs) == 15  # 36 images: a partial last batch of 4 each epoch
    for (x, y), (sx, sy) in zip(refs, seen):
        assert torch.equal(x, sx) and torch.equal(y, sy)


def test_a_slots_new_buffers_are_recorded_for_a_stream_that_read_its_old_ones():
    """What ``slot.readers.clear()`` (DevicePrefetcher._buffer) protects. A slot read on the default stream is
    refilled with a partial batch while the user stream is current: its new buffers are allocated there. With
    depth 2 a batch is queued one step before it is handed out, and the consumer switches every step, so this
    one is handed out on the default stream, which read the slot's old buffers, not these: they must be
    recorded for it once more (``record_stream``), or when they are freed (the loader dropped) the allocator
    gives their memory to the user stream while the default stream's reads of them are still queued."""
    sim = SimGpu()
    user = sim.new_stream("user")
    src = host_batches(2) + host_batches(1, size=5)
    pf = DevicePrefetcher(src, depth=2, ring=DeviceRing("cpu", streams=sim))
    seen: list = []
    for k, on in enumerate((sim.default, user, sim.default)):
        with sim.stream(on):
            sim.model_step(list(next(pf)), seen, scratch=False)
        if k == 0:
            sim.run_all()  # slot 0's batch copied and read: the next step refills it
    slot = pf.ring.slots[0]
    assert [len(slot.tensors[i, "in"]) for i in (0, 1)] == [5, 5]  # new device buffers, made on user
    for stream in (sim.default, user, sim.side):  # the copies run (their host memory may go); the default
        sim.run(stream)  # stream stops at its wait for the last batch's copy: its read of the batch stays queued
    del pf, slot
    gc.collect()
    sim.run(sim.side)
    with sim.stream(user):  # what the user stream's allocations may take now
        reuse = sim.alloc((5, 3, 6, 6), torch.uint8)
        sim.launch(lambda: reuse.fill_(0xA5), writes=(reuse,), what="a kernel on user")
    sim.run_all()
    assert not sim.races
    assert all(torch.equal(x, s[0]) and torch.equal(y, s[1]) for (x, y), s in zip(src, seen))


# -- Normalize's constants ----------------------------------------------------------------------------------
def normalized(batches, pipe):
    return [pipe.apply(x.contiguous()) for x, _ in batches]


def test_loaders_sharing_a_pipeline_never_read_each_others_normalize_constants():
    """Every loader over one dataset shares its TensorPipeline; each runs it on a side stream of its own. One
    loader consumed on another stream (under torch.cuda.stream(s): a validation loop, a loader made for the
    next epoch) lags; a second loader's first batch must not read constants that the first one's side stream
    has queued but not written yet. Nothing orders the two side streams: the second one waits on its own
    consumer only. The constants are made per side stream, by fill kernels through the streams backend (where
    the checker sees them). (With one consumer stream for both, its wait on the first loader's batch ordered
    the first side stream's fills before the second loader's fence.)"""
    sim = SimGpu()
    pipe = T.ImagePipeline([T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)]).tensor
    src = host_batches(4)
    seen: list = []
    first = DevicePrefetcher(src, depth=2, transforms={0: pipe}, ring=DeviceRing("cpu", streams=sim.fork("first")))
    with sim.stream(sim.new_stream("user")):
        sim.model_step(list(next(first)), seen, scratch=False)  # queued; neither it nor the first side stream runs
    second = DevicePrefetcher(src, depth=2, transforms={0: pipe},
                              ring=DeviceRing("cpu", streams=sim.fork("second")))
    for batch in second:  # on the default stream
        sim.model_step(list(batch), seen, scratch=False)
        sim.run(second.streams.side)  # the second loader's copies and kernels run; the first's lag behind
        sim.run(sim.default)
    del batch
    sim.run_all()
    assert not sim.races and not sim.waits_in()
    want = normalized(src[:1] + src, pipe)
    assert len(seen) == len(want) == 5
    assert all((w - s[0]).abs().max() < 1e-5 for w, s in zip(want, seen))


def test_the_first_batch_never_makes_the_training_thread_wait_even_on_an_idle_gpu():
    """The first batch of a process with Normalize, on an idle GPU: a copy of the constants from pageable
    memory would wait for nothing queued (cheap here) but it is a host sync all the same, one that
    ``set_sync_debug_mode('error')`` refuses from the first batch. ``waits_in`` counts every host wait, not
    only those that ran queued work."""
    sim = SimGpu()
    pipe = T.ImagePipeline([T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)]).tensor
    src = host_batches(1)
    pf = DevicePrefetcher(src, depth=1, transforms={0: pipe}, ring=DeviceRing("cpu", streams=sim))
    seen: list = []
    sim.model_step(list(next(pf)), seen, scratch=False)
    assert not sim.waits_in(), sim.host_waits
    sim.run_all()
    assert not sim.races and (seen[0][0] - normalized(src, pipe)[0]).abs().max() < 1e-5
