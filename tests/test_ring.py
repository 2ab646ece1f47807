"""The slot ring's protocol (fastload/_ring.py) on a simulated GPU whose queued work runs late.

tests/sim_streams.py runs copies and kernels only when a test advances a stream, hands the consumer
stream memory that its queued kernels still use (as the CUDA caching allocator does), and fails on any
unordered pair of accesses. The tests named ``..._catches_...`` put a protocol bug back and show the
simulator fails: the other tests would fail the same way if the bug came back.
"""

from __future__ import annotations

import gc
import mmap
import multiprocessing
import os

import numpy as np
import pytest
import torch

import fastload
from fastload import _ring
from fastload.fast import device as device_stage
from fastload.fast import collate as _collate_stage
from fastload.fast import fill as fill_stage
from fastload.fast import producer as producer_stage
from fastload import transforms as T
from fastload.fast.device import DevicePrefetcher, DeviceRing
from sim_streams import Race, SimGpu
from conftest import packed_image_folder
from forking import in_child

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def host_batches(n: int, size: int = 8):
    g = torch.Generator().manual_seed(0)
    return [[torch.randint(0, 256, (size, 3, 6, 6), dtype=torch.uint8, generator=g), torch.arange(size) + 100 * k]
            for k in range(n)]


def lagging_loop(sim: SimGpu, batches, lag_every: int = 3):
    """A training loop whose GPU lags: each step's kernels are queued, the copy engine runs ahead, the
    consumer stream catches up only every ``lag_every`` steps. Returns what each step's kernel saw."""
    seen: list = []
    for k, batch in enumerate(batches):
        sim.model_step(list(batch), seen)
        sim.run(sim.side)
        if k % lag_every == lag_every - 1:
            sim.run(sim.default)
    sim.run_all()
    return [[t for t in s] for s in seen]


def test_lagging_gpu_sees_every_batch_intact():
    src = host_batches(12)
    sim = SimGpu()
    seen = lagging_loop(sim, DevicePrefetcher(src, depth=2, ring=DeviceRing("cpu", streams=sim)))
    assert len(seen) == 12 and not sim.races
    for (x, y), (sx, sy) in zip(src, seen):
        assert torch.equal(x, sx) and torch.equal(y, sy)
    assert sim.syncs == 0  # the protocol never waits on the host


def test_simulator_catches_a_side_stream_write_without_the_allocation_fence(monkeypatch):
    """The H100 bug: buffers allocated on the consumer stream, written on the side stream with no fence.
    Drop the side stream's waits on consumer events (the fence) and the checker must fail."""
    sim = SimGpu()
    real_wait = sim.wait
    monkeypatch.setattr(sim, "wait", lambda stream, ev: None if stream is sim.side else real_wait(stream, ev))
    with pytest.raises(Race, match="model step"):
        lagging_loop(sim, DevicePrefetcher(host_batches(12), depth=2, ring=DeviceRing("cpu", streams=sim)))


def test_simulator_catches_a_fence_recorded_before_the_allocation(monkeypatch):
    """A fence that only covers the previous batch (the old code's ``release_event``, None for a new
    slot) is not enough: the allocation itself needs one."""
    sim = SimGpu()
    pf = DevicePrefetcher(host_batches(12), depth=2, ring=DeviceRing("cpu", streams=sim))
    fresh = []
    real_empty = sim.empty

    def empty(*a, **k):
        fresh.append(True)
        return real_empty(*a, **k)

    real_record = sim.record

    def record(stream):  # no fence for a slot whose buffers were just allocated
        if fresh and stream == sim.default:
            fresh.clear()
            return None
        return real_record(stream)

    monkeypatch.setattr(sim, "empty", empty)
    monkeypatch.setattr(sim, "record", record)
    with pytest.raises(Race):
        lagging_loop(sim, pf)


@pytest.mark.parametrize("record_stream", [True, False])
def test_freed_ring_memory_waits_for_the_side_stream(monkeypatch, record_stream):
    """Dropping the loader with copies still queued must not let the consumer reuse their memory early;
    without ``record_stream`` on the ring's buffers (the bug put back) the checker fails."""
    sim = SimGpu(raise_on_race=False)
    if not record_stream:
        monkeypatch.setattr(sim, "record_stream", lambda t, stream: None)
    pf = DevicePrefetcher(host_batches(4), depth=3, ring=DeviceRing("cpu", streams=sim))
    out = next(pf)  # three batches queued on the side stream, none run
    nbytes = sum(s.nbytes for s in pf.ring.slots)
    del out, pf
    gc.collect()
    seen: list = []
    # the freed slots merge into one cached block: a buffer as large as all of them is carved from it
    sim.model_step([sim.alloc((nbytes,), torch.uint8)], seen)
    sim.run(sim.default)
    sim.run_all()
    assert bool(sim.races) != record_stream, sim.races


def test_held_batches_survive_a_lagging_gpu():
    """Batches kept by the caller are never rewritten, even when the GPU runs far behind."""
    src = host_batches(10)
    sim = SimGpu()
    pf = DevicePrefetcher(src, depth=2, ring=DeviceRing("cpu", streams=sim))
    held = list(pf)
    seen: list = []
    for b in held:
        sim.model_step(list(b), seen)
    sim.run_all()
    assert all(torch.equal(x, s[0]) for (x, _), s in zip(src, seen))
    assert len(pf.ring) >= 10


def device_bytes(sim: SimGpu) -> int:
    """Device memory in use (blocks allocated and not yet back in the allocator's cache)."""
    return sum(b[0] for b in sim.blocks.values())


def recycled_pinned(sim: SimGpu, n: int, size: int = 8):
    """Batches in pinned host buffers that are refilled as soon as nobody references them, as the fast
    path's host ring does: a host batch let go before its copy ran is overwritten under the DMA."""
    ring = _ring.SlotRing(lambda: _ring.Slot({"x": sim.host_empty((size, 3, 6, 6), torch.uint8),
                                               "y": sim.host_empty((size,), torch.int64)}))
    for b in host_batches(n, size):
        slot = ring.acquire()
        slot.tensors["x"].copy_(b[0])
        slot.tensors["y"].copy_(b[1])
        yield [slot.tensors["x"][:], slot.tensors["y"][:]]


@pytest.mark.parametrize("source", ["pageable", "pinned"])
def test_a_lagging_gpu_never_grows_the_ring_past_its_bound(source):
    """The consumer stream never catches up (the host runs 40 batches ahead) while the caller drops each
    batch: the ring stays at depth + MARGIN slots (device memory with it), reusing slots on the device, not
    by a host wait; every batch arrives intact, and host memory a pending copy reads is not refilled."""
    sim = SimGpu()
    src = host_batches(40)
    ring = DeviceRing("cpu", streams=sim)
    it = DevicePrefetcher(recycled_pinned(sim, 40) if source == "pinned" else src, depth=2, ring=ring)
    seen: list = []
    sizes, used = [], []
    for batch in it:
        sim.model_step(list(batch), seen, scratch=False)
        del batch
        sim.run(sim.side)  # the copy engine goes as far as it may; the consumer stream lags all along
        sizes.append(len(ring))
        used.append(device_bytes(sim))
    assert max(sizes) == 2 + DeviceRing.MARGIN, sizes
    assert max(used) == used[4]  # no growth once the ring is full
    assert len(ring.holds)  # copies still queued: their host memory is kept
    sim.run_all()
    ring.reclaim()
    assert not len(ring.holds)
    assert not sim.races and not sim.waits_in(busy=False) and sim.syncs == 0
    assert len(seen) == 40
    for (x, y), (sx, sy) in zip(src, seen):
        assert torch.equal(x, sx) and torch.equal(y, sy)


def test_the_ring_shrinks_after_a_quick_epoch_that_followed_a_lagging_one():
    """A lagging epoch fills the ring to its bound; a quick one needs fewer slots; the next pass lets the
    others go, and their device memory goes back to the allocator once their queued work ran."""
    sim = SimGpu()
    src = host_batches(12)
    ring = DeviceRing("cpu", streams=sim)
    seen: list = []
    for batch in DevicePrefetcher(src, depth=2, ring=ring):  # lagging
        sim.model_step(list(batch), seen, scratch=False)
        sim.run(sim.side)
    del batch
    sim.run_all()
    grown, before = len(ring), device_bytes(sim)
    assert grown == 2 + DeviceRing.MARGIN
    for batch in DevicePrefetcher(src, depth=2, ring=ring):  # quick: the GPU keeps up every step
        sim.model_step(list(batch), seen, scratch=False)
        sim.run_all()
    del batch
    it = DevicePrefetcher(src, depth=2, ring=ring)
    assert len(ring) == 3 < grown  # the quick epoch's batch in use + the two prefetched
    sim.run_all()
    assert device_bytes(sim) == before * 3 // grown
    for batch in it:  # the ring still serves the next epoch intact
        sim.model_step(list(batch), seen, scratch=False)
    del batch, it
    sim.run_all()
    assert not sim.races and len(seen) == 36
    for (x, y), (sx, sy) in zip(src * 3, seen):
        assert torch.equal(x, sx) and torch.equal(y, sy)


# -- the whole loader on the simulated GPU ----------------------------------------------------------------
class _NoPinning:
    @staticmethod
    def available() -> bool:
        return False


class SimPinning:
    """The fast path's host slots pinned by the simulated GPU (copies from them run late, as DMA)."""

    def __init__(self, sim: SimGpu):
        self.sim = sim

    @staticmethod
    def available() -> bool:
        return True

    @staticmethod
    def parent_initialised() -> bool:
        return False

    def empty(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        return self.sim.host_empty(shape, dtype)


def install_sim(monkeypatch, sim):
    """Make ``sim`` the device fastload.DataLoader(device='cuda') runs on, host slots pinned as on a GPU machine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(device_stage, "streams_for", lambda device: sim)
    monkeypatch.setattr(_ring, "PINNED", SimPinning(sim))
    monkeypatch.setattr(_ring, "_pinned_by", None)
    return sim


@pytest.fixture
def sim_cuda(monkeypatch):
    """fastload.DataLoader(device='cuda') running on a SimGpu, host slots pinned as on a GPU machine."""
    return install_sim(monkeypatch, SimGpu())


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return packed_image_folder(tmp_path_factory.mktemp("ring"), classes=3, per_class=12)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("normalize", [False, True])
def test_loader_on_a_lagging_gpu_hands_out_the_cpu_loaders_batches(sim_cuda, photos, num_workers, persistent,
                                                                    normalize):
    tail = [T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)] if normalize else []
    ds = fastload.open(photos, transforms={"image": [T.RandomResizedCrop(16), T.RandomHorizontalFlip()] + tail})
    kw = dict(batch_size=4, shuffle=True, drop_last=True, seed=7, num_workers=num_workers)
    cpu = fastload.DataLoader(ds, **kw)
    gpu = fastload.DataLoader(ds, device="cuda", persistent_workers=persistent and num_workers > 0, **kw)
    for epoch in range(3):
        ref = [(x.clone(), y.clone()) for x, y in cpu]
        seen = lagging_loop(sim_cuda, gpu)
        assert len(seen) == len(ref) == 9
        for (x, y), (sx, sy) in zip(ref, seen):
            assert torch.equal(y, sy)
            assert torch.equal(x, sx) if not normalize else torch.allclose(x, sx, atol=1e-5)
    assert not sim_cuda.races and sim_cuda.syncs == 0
    assert not sim_cuda.waits_in()  # the training thread never waited for the GPU
    assert len(gpu._device_ring) <= 6  # the device ring is kept across epochs, not made again


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_loaders_device_ring_stays_bounded_when_the_gpu_never_catches_up(sim_cuda, photos, num_workers):
    """A whole epoch with the consumer stream never run until its end: the loader's device slots stay at
    prefetch depth + MARGIN (one per batch before), and the batches are the CPU loader's. (Its pinned host
    slots are bounded by the producer thread: the next test.)"""
    ds = fastload.open(photos, transforms={"image": [T.RandomResizedCrop(16)]})
    kw = dict(batch_size=2, shuffle=True, seed=3, num_workers=num_workers)
    ref = [(x.clone(), y.clone()) for x, y in fastload.DataLoader(ds, **kw)]
    gpu = fastload.DataLoader(ds, device="cuda", **kw)
    seen = lagging_loop(sim_cuda, gpu, lag_every=len(ref) + 1)
    assert len(gpu._device_ring) == 2 + DeviceRing.MARGIN < len(ref)
    assert not sim_cuda.races and not sim_cuda.waits_in()
    assert len(seen) == len(ref) == 18
    for (x, y), (sx, sy) in zip(ref, seen):
        assert torch.equal(x, sx) and torch.equal(y, sy)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_loaders_host_ring_stays_bounded_when_the_gpu_never_catches_up(sim_cuda, monkeypatch, photos,
                                                                         num_workers):
    """36 batches, the consumer stream never run by the loop: each host batch is kept until its copy ran, so
    without a bound every batch took a new pinned slot (36). With a producer thread (num_workers=2, made to
    fill every batch there) the host ring stops at ``host_limit(depth)`` slots: the producer waits for the
    oldest pending copy (a host wait in that thread, which runs the queued GPU work in the simulator) and the
    training thread never waits. A fill in the calling thread (num_workers=0) must not block the loop as
    early: it grows up to INLINE_FACTOR times the limit, and only then waits there (fill.py's decision,
    documented there). Batches are the CPU loader's either way."""
    monkeypatch.setattr(producer_stage, "INLINE_BELOW", 0.0)  # num_workers=2: every fill in the producer thread
    ds = fastload.open(photos, transforms={"image": [T.RandomResizedCrop(16)]})
    kw = dict(batch_size=1, shuffle=True, seed=5, num_workers=num_workers)
    ref = [(x.clone(), y.clone()) for x, y in fastload.DataLoader(ds, **kw)]
    gpu = fastload.DataLoader(ds, device="cuda", **kw)
    sizes: list = []
    seen: list = []
    for x, y in gpu:
        sim_cuda.model_step([x, y], seen)
        sim_cuda.run(sim_cuda.side)  # the copy engine runs ahead; the consumer stream never catches up
        sizes.append(len(gpu._ring))
    sim_cuda.run_all()
    limit = fill_stage.host_limit(2)
    in_loop, in_producer = sim_cuda.waits_in(), sim_cuda.waits_in("fastload-batcher")
    if num_workers:
        assert max(sizes) <= limit < len(ref) == 36, sizes
        assert not in_loop, in_loop  # the training thread never waited for the GPU
        assert in_producer and all(w.why == "event synchronize" for w in in_producer)
    else:
        assert max(sizes) == limit * fill_stage.INLINE_FACTOR < len(ref), sizes
        assert in_loop and not in_producer  # past the larger cap the calling thread waits
        assert sizes.index(max(sizes)) >= limit * fill_stage.INLINE_FACTOR - 3  # not before the ring got there
    assert not sim_cuda.races
    assert len(seen) == len(ref)
    for (x, y), (sx, sy) in zip(ref, seen):
        assert torch.equal(x, sx) and torch.equal(y, sy)


def test_host_slot_is_not_refilled_under_its_copy(sim_cuda, photos):
    """The copy engine runs late (only every fifth step) while the producer thread refills host slots as
    soon as it may: every batch must still arrive intact."""
    ds = fastload.open(photos, transforms={"image": [T.RandomResizedCrop(16)]})
    kw = dict(batch_size=4, shuffle=True, seed=3, num_workers=2, prefetch_factor=4)
    ref = [(x.clone(), y.clone()) for x, y in fastload.DataLoader(ds, **kw)]
    seen: list = []
    loader = fastload.DataLoader(ds, device="cuda", **kw)  # alive until its copies ran (see sim_streams.py)
    for k, (x, y) in enumerate(loader):
        sim_cuda.model_step([x, y], seen, scratch=False)
        if k % 5 == 4:
            sim_cuda.run_all()
    sim_cuda.run_all()
    assert len(seen) == len(ref)
    for (x, y), (sx, sy) in zip(ref, seen):
        assert torch.equal(x, sx) and torch.equal(y, sy)


@pytest.mark.parametrize("pinned", [True, False])
@pytest.mark.parametrize("normalize", [False, True])
def test_contiguous_images_and_unpinned_slots_never_make_the_loop_wait(sim_cuda, monkeypatch, photos, pinned,
                                                                      normalize):
    """memory_format=contiguous_format on the device, host slots pinned or not (a forked child, a locked
    memory limit): the transpose runs on the device and pageable bytes go through pinned staging, so no
    copy from pageable memory makes the training thread wait for the lagging GPU."""
    if not pinned:
        monkeypatch.setattr(_ring, "PINNED", _NoPinning())
    tail = [T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)] if normalize else []
    ds = fastload.open(photos, transforms={"image": [T.RandomResizedCrop(16)] + tail})
    kw = dict(batch_size=5, shuffle=True, seed=4, memory_format=torch.contiguous_format)
    ref = [(x.clone(), y.clone()) for x, y in fastload.DataLoader(ds, **kw)]
    gpu = fastload.DataLoader(ds, device="cuda", **kw)
    on_cpu = []
    monkeypatch.setattr(_collate_stage, "contiguous_images", lambda batch, keys: on_cpu.append(keys) or batch)
    seen = lagging_loop(sim_cuda, gpu)
    assert not on_cpu  # the training thread did not transpose the batches
    assert not sim_cuda.waits_in(), sim_cuda.waits_in()
    assert len(seen) == len(ref) == 8  # 36 images: a partial last batch
    for (x, y), (sx, sy) in zip(ref, seen):
        assert x.is_contiguous() and sx.is_contiguous() and torch.equal(y, sy)
        assert torch.equal(x, sx) if not normalize else torch.allclose(x, sx, atol=1e-5)
    assert not sim_cuda.races


# -- to_device ----------------------------------------------------------------------------------------
def test_to_device_is_iterable_again_and_again():
    batches = host_batches(5)
    d = fastload.to_device(batches, "cpu")
    first = [b[1].clone() for b in d]
    second = [b[1].clone() for b in d]
    assert len(first) == len(second) == len(d) == 5
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_to_device_over_a_one_shot_iterator_says_so_on_the_second_pass():
    d = fastload.to_device(iter(host_batches(3)), "cpu")
    assert len(list(d)) == 3
    with pytest.raises(TypeError, match="one-shot iterator"):
        iter(d)


def test_to_device_over_a_torch_loader_runs_each_epoch(sim_cuda):
    tds = torch.utils.data.TensorDataset(torch.arange(64, dtype=torch.int64).view(16, 4))
    d = fastload.to_device(torch.utils.data.DataLoader(tds, batch_size=4, shuffle=True), "cuda")
    for _ in range(2):
        seen = lagging_loop(sim_cuda, d)
        assert sorted(torch.cat([s[0] for s in seen]).view(-1).tolist()) == list(range(64))
    assert not sim_cuda.races
    assert not sim_cuda.waits_in()  # torch's loader without pin_memory: pageable batches, staged


def test_to_device_over_pageable_batches_of_any_layout(sim_cuda):
    """Pageable sources in several layouts (channels_last, a transposed view, a slice) arrive intact and
    in their layout, through pinned staging, with no wait in the training thread."""
    base = torch.arange(4 * 3 * 5 * 6, dtype=torch.int32).view(4, 3, 5, 6)
    batches = [[base.contiguous(memory_format=torch.channels_last) + k, base[:, :, 1:4].clone().transpose(2, 3) + k,
                base[::2] + k] for k in range(6)]
    seen = lagging_loop(sim_cuda, fastload.to_device(batches, "cuda"))
    assert not sim_cuda.waits_in() and not sim_cuda.races
    for b, s in zip(batches, seen):
        assert all(torch.equal(x, y) for x, y in zip(b, s))


# -- fork after pinning ---------------------------------------------------------------------------------
class SharedPinnedPool:
    """Pinned memory as the CUDA driver maps it: one region shared with every child forked afterwards, and
    an allocator whose state the children inherit (so they are handed the same pages)."""

    def __init__(self, nbytes: int = 32 << 20):
        self.mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_SHARED)
        self.top = 0

    @staticmethod
    def available() -> bool:
        return True

    @staticmethod
    def parent_initialised() -> bool:
        return False  # leave the detection to fastload's own record of who pinned

    def empty(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        n = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
        off, self.top = self.top, self.top + -(-n // 64) * 64
        return torch.frombuffer(self.mm, dtype=torch.uint8, count=n, offset=off).view(dtype).view(shape)


@pytest.fixture
def shared_pinning(monkeypatch):
    monkeypatch.setattr(_ring, "PINNED", SharedPinnedPool())
    monkeypatch.setattr(_ring, "_pinned_by", None)
    monkeypatch.setattr(_ring, "_warned", set())


def _epoch(path, seed: int) -> list:
    ds = fastload.open(path, transforms={"image": [T.RandomResizedCrop(16), T.RandomHorizontalFlip()]})
    return [(x.clone(), y.clone()) for x, y in fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=seed,
                                                                   num_workers=2)]


def test_children_forked_after_pinning_do_not_share_slots(shared_pinning, photos):
    """Two children forked after the parent pinned: one holds a batch while the other runs a whole
    epoch. With pinned slots from the shared pool the second child would overwrite the first's batch."""
    _epoch(photos, 0)  # the parent pins (and so would have initialised CUDA)
    assert _ring._pinned_by == os.getpid()
    ctx = multiprocessing.get_context("fork")
    holding, finished = ctx.Event(), ctx.Event()
    results = ctx.Queue()

    def holder():
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ds = fastload.open(photos, transforms={"image": [T.RandomResizedCrop(16)]})
            it = iter(fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=1, num_workers=0))
            x, _ = next(it)
            before = x.clone()
            holding.set()
            finished.wait(60)
            results.put(("holder", torch.equal(x, before), [str(w.message) for w in caught]))

    def writer():
        holding.wait(60)
        _epoch(photos, 2)
        finished.set()
        results.put(("writer", True, []))

    procs = [ctx.Process(target=holder), ctx.Process(target=writer)]
    for p in procs:
        p.start()
    got = {name: (ok, warned) for name, ok, warned in (results.get(timeout=60) for _ in procs)}
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert got["holder"][0], "a child's batch was overwritten by its sibling: slots were shared after fork"
    assert any("forked after its parent" in w for w in got["holder"][1])


def test_a_loader_used_in_a_forked_child_leaves_the_parents_slots_alone(shared_pinning, photos):
    ds = fastload.open(photos, transforms={"image": [T.RandomResizedCrop(16)]})
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=5)
    x, y = next(iter(loader))
    first = x.clone()
    del x, y  # the slot is free: a child that reused it would write into the parent's (shared) pages
    slot = loader._ring.slots[0]

    def child():
        for _ in loader:  # another epoch: another order, written into this process's own slots
            pass

    assert in_child(child) == 0
    assert torch.equal(slot.tensors["image"][:4].permute(0, 3, 1, 2), first)


# -- the device is the one current at the first iteration --------------------------------------------------
def test_cuda_is_resolved_at_the_first_iteration(sim_cuda, monkeypatch, photos):
    """A loader built before torch.cuda.set_device(local_rank) sends the batches to the rank's GPU."""
    current = [0]
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    ds = fastload.open(photos, transforms={"image": [T.RandomResizedCrop(16)]})
    loader = fastload.DataLoader(ds, batch_size=4, device="cuda")
    current[0] = 3  # torch.cuda.set_device(3) after the loader was made
    next(iter(loader))
    assert loader._device_ring.device == torch.device("cuda", 3)
    assert loader._batcher.images.device is None  # native decoding: no device rows


def test_to_device_resolves_cuda_at_the_first_pass(sim_cuda, monkeypatch):
    """to_device(loader, 'cuda') wrapped before torch.cuda.set_device(local_rank): the rank's GPU, not cuda:0."""
    current = [0]
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    src = host_batches(3)
    d = fastload.to_device(src, "cuda")
    current[0] = 3  # torch.cuda.set_device(3)
    seen = lagging_loop(sim_cuda, d)
    assert d.device == d.ring.device == torch.device("cuda", 3)
    assert all(torch.equal(x, s[0]) for (x, _), s in zip(src, seen)) and not sim_cuda.races


def test_cuda_availability_is_asked_through_nvml(monkeypatch):
    """torch.cuda.is_available() initialises the CUDA runtime unless asked through NVML; a process forked
    after that (DataLoader workers) cannot use CUDA and may hang. A user's own setting is kept."""
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    seen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: seen.append(os.environ.get(
        "PYTORCH_NVML_BASED_CUDA_CHECK")) or False)
    assert _ring.PINNED.available() is False and seen == ["1"]
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "0")
    _ring.cuda_available()
    assert seen[-1] == "0"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_generic_path_on_a_lagging_gpu_never_makes_the_loop_wait(sim_cuda, num_workers):
    """The generic path hands pageable batches (torch's collate at num_workers=0, shared-memory slots with
    workers): they go through pinned staging, so the training thread never waits for the GPU."""
    g = torch.Generator().manual_seed(1)
    tds = torch.utils.data.TensorDataset(torch.randint(0, 256, (30, 3, 6, 6), dtype=torch.uint8, generator=g),
                                         torch.arange(30))
    ref = [(x.clone(), y.clone()) for x, y in torch.utils.data.DataLoader(tds, batch_size=4)]
    loader = fastload.DataLoader(tds, batch_size=4, num_workers=num_workers, device="cuda")
    assert not loader.fast_path
    seen = lagging_loop(sim_cuda, loader)
    assert not sim_cuda.waits_in() and not sim_cuda.races
    assert len(seen) == len(ref) == 8
    for (x, y), (sx, sy) in zip(ref, seen):
        assert torch.equal(x, sx) and torch.equal(y, sy)


def test_staged_batches_are_let_go_at_once_and_staging_waits_for_its_copy():
    """A pageable batch is copied into the slot's pinned staging: the caller's batch is not needed after
    that (a shared-memory lease goes back at once), but the staging is refilled only after its copy ran,
    although the caller dropped the device batch (the copy engine lags here)."""
    sim = SimGpu()
    src = host_batches(8)
    pf = DevicePrefetcher(src, depth=2, ring=DeviceRing("cpu", streams=sim))
    seen: list = []
    for k, batch in enumerate(pf):
        assert not len(pf.ring.holds)
        sim.model_step(list(batch), seen, scratch=False)
        del batch
        if k % 3 == 2:
            sim.run_all()
    sim.run_all()
    assert all(torch.equal(x, s[0]) and torch.equal(y, s[1]) for (x, y), s in zip(src, seen))
    pinned = [[sim.host_empty(t.shape, t.dtype).copy_(t) for t in b] for b in host_batches(2)]
    pf = DevicePrefetcher(pinned, depth=2, ring=DeviceRing("cpu", streams=sim))
    next(pf)
    assert len(pf.ring.holds) == 2  # DMA reads them: kept until it ran


def _vm_flags(addr: int) -> list[str]:
    """The VmFlags of this process's mapping that holds ``addr`` (/proc/self/smaps)."""
    inside, flags = False, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "VmFlags:":
                flags = line.split()[1:]
                break
    assert flags is not None, f"no mapping holds {addr:#x}"
    return flags


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE") or not os.path.exists("/sys/kernel/mm/transparent_hugepage"),
                    reason="transparent huge pages are Linux's, with THP built into the kernel")
def test_large_unpinned_slot_buffers_ask_for_huge_pages():
    """A 9.6 MB raw image slot lies in a mapping marked MADV_HUGEPAGE (smaps' ``hg``), whatever the THP mode
    (in ``madvise`` mode, this machine's, torch.empty's memory gets none); a small buffer stays torch's."""
    big = _ring.host_empty((64, 3, 224, 224), torch.uint8, False)
    assert big.shape == (64, 3, 224, 224) and big.dtype == torch.uint8 and big.is_contiguous()
    assert big.data_ptr() % _ring.HUGE_PAGE == 0
    assert "hg" in _vm_flags(big.data_ptr())
    wide = _ring.host_empty((1024, 1024, 3), torch.bfloat16, False)  # a dtype numpy has not
    wide.fill_(2)
    assert wide.shape == (1024, 1024, 3) and float(wide.sum()) == 2 * wide.numel()
    slot = _ring.Slot({"x": big})
    view = big[:3]
    assert slot.held()
    del view
    assert not slot.held()
    small = _ring.host_empty((1024,), torch.int64, False)
    assert small.untyped_storage().nbytes() == 8192
