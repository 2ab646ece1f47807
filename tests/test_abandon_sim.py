"""A loader abandoned mid-epoch on a lagging GPU (issue 19, item 2): ``break``, ``del it`` or a new ``iter(loader)``
must not make the training thread wait for the device.

With ``device='cuda'`` the producer thread keeps the pinned host ring bounded: at its limit it waits on the host
for the oldest pending copy (``_ring.CopyHolds.wait_oldest``, ``fast/fill.py``). Abandoning the iteration stops
that thread and joins it in the training thread (``fast/producer.py``), so a producer still waiting there made
the training thread wait for the GPU to drain: a host sync at ``break``.

``SimGpu.wait_host`` runs the awaited work at once in the waiting thread (the GPU catches up the moment the host
waits), so it cannot show a thread blocked behind another one's wait. ``FrozenGpu`` can: while frozen, the device
runs nothing by itself and a host wait polls until the device ran past its event, as a host waiting for a
busy GPU does. The tests freeze it with the consumer stream far behind, let the producer reach the host ring's
bound and block there, abandon the iteration, and thaw the device only once that returned, or after a few
seconds from a watchdog (a training thread that waited for the GPU, which the tests then report). The batches
handed out before and in the next epoch must be exactly those of the same loader abandoned at the same batch
on a device that keeps up.
"""

from __future__ import annotations

import gc
import threading
import time

import pytest
import torch

import fastload
from fastload import _ring, decoders
from fastload import transforms as T
from fastload.decoders import hybrid
from fastload.fast import producer as producer_stage
from sim_streams import HostWait, SimGpu
from test_gpu_decoders_sim import dali_on_sim, more_batches_than_slots, nvjpeg_on_sim, others  # noqa: F401
from test_ring import install_sim

pytestmark = pytest.mark.timeout(120)

PATIENCE = 3.0  # seconds the watchdog lets the training thread wait for a frozen device before thawing it
TAKEN = 4  # batches the loop takes before abandoning the epoch (the producer is at the host ring's bound by then)


class FrozenGpu(SimGpu):
    """A simulated GPU that, while ``frozen``, runs nothing unless a test runs it: a host wait then blocks until
    another thread made the device run past its event (or the wait's ``stop`` says to give up), as a host that
    waits for a busy GPU does. ``blocked`` is set when a thread other than the main one starts such a wait."""

    def __init__(self):
        super().__init__()
        self.frozen = False
        self.blocked = threading.Event()

    def wait_host(self, event, stop=None) -> None:
        if event is None:
            return
        if not self.frozen:
            return super().wait_host(event)
        if threading.current_thread() is not threading.main_thread():
            self.blocked.set()
        while self.frozen and not event.complete and not (stop is not None and stop()):
            time.sleep(1e-3)
        if not event.complete and not self.frozen:
            return super().wait_host(event)  # thawed while waiting: the device catches up now
        self.done(event)  # the host learned it completed (or gave up: then it learned nothing)
        self.host_waits.append(HostWait(threading.current_thread().name, event.stream.name, "event synchronize",
                                        int(event.complete)))

    def thaw(self) -> None:
        self.frozen = False
        self.run_all()


@pytest.fixture
def sim_cuda(monkeypatch):
    """fastload.DataLoader(device='cuda') on a FrozenGpu (test_ring.py's fixture of that name, which the GPU
    decoders' fixtures build on, with this device)."""
    return install_sim(monkeypatch, FrozenGpu())


class Watchdog:
    """Started when the training thread abandons the epoch with the device frozen, ``stop``ped once that returned:
    thaws the device after ``PATIENCE`` seconds if it has not by then, and ``stop`` then fails the test (the
    training thread waited for the GPU)."""

    def __init__(self, sim: FrozenGpu, patience: float = PATIENCE):
        self.sim, self.patience, self.returned, self.fired = sim, patience, threading.Event(), False
        self.thread = threading.Thread(target=self._watch, name="watchdog")
        self.start = time.monotonic()
        self.thread.start()

    def _watch(self) -> None:
        if not self.returned.wait(self.patience):
            self.fired = True
            self.sim.thaw()

    def stop(self, strict: bool = True) -> None:
        took = time.monotonic() - self.start
        self.returned.set()
        self.thread.join()
        assert not (strict and self.fired), f"abandoning the epoch waited for the GPU ({took:.1f} s, until the " \
                                            f"device ran)"


def first_steps(sim: FrozenGpu, it, seen: list) -> None:
    """``TAKEN`` steps queued on a consumer stream that never runs; the copy engine and decoders run ahead as far
    as they can (not far: every copy waits for the consumer's fence)."""
    for _ in range(TAKEN):
        x, y = next(it)
        sim.model_step([x, y], seen)
        others(sim, sim.default)


def epoch(sim: FrozenGpu, loader, seen: list) -> None:
    """The rest of an epoch, the consumer stream catching up every third step (the device running by itself)."""
    for k, (x, y) in enumerate(loader):
        sim.model_step([x, y], seen)
        others(sim, sim.default)
        if k % 3 == 2:
            sim.run(sim.default)
    sim.run_all()


def reference(sim: FrozenGpu, ds, kw: dict) -> list:
    """What the same loader hands out for the abandoned epoch's first batches and for the next epoch when the
    device keeps up (the consumer stream runs after every step)."""
    seen: list = []
    loader = fastload.DataLoader(ds, **kw)
    it = iter(loader)
    for _ in range(TAKEN):
        x, y = next(it)
        sim.model_step([x, y], seen)
        sim.run_all()
    del it
    for x, y in loader:
        sim.model_step([x, y], seen)
        sim.run_all()
    return seen


def on_sim(request, monkeypatch, decoder: str):
    """The frozen simulated GPU with ``decoder``'s stand-in installed (test_gpu_matrix_sim.py's ``on_sim``)."""
    sim = request.getfixturevalue({"native": "sim_cuda", "dali": "dali_on_sim"}.get(decoder, "nvjpeg_on_sim"))
    if decoder == "auto":  # nvjpeg as the GPU half; the split held at half (timings would move it)
        monkeypatch.setattr(hybrid, "_installed_gpu_decoder", lambda: (decoders.kind("nvjpeg"), []))
        monkeypatch.setattr(hybrid.HybridSplit, "_update", lambda self, *a: None)
    return sim


@pytest.mark.parametrize("how", ["break", "del it", "new iter"])
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("decoder", ["native", "nvjpeg", "dali", "auto"])
def test_abandoning_an_epoch_on_a_lagging_gpu_never_waits_for_it(request, monkeypatch, more_batches_than_slots,
                                                                  decoder, num_workers, how):
    """The producer blocked at the host ring's bound (17 batches an epoch, 7 host slots; 4 taken, 2 in flight on
    the device, 2 queued, the first copy done: the next fill waits for a copy that waits for the frozen consumer
    stream); abandoning
    the epoch returns without the device, no host wait in the training thread, and every batch (the abandoned
    epoch's queued steps, the next epoch's) is the one a device that keeps up gets. At num_workers=0 the native decoder fills in the
    training thread (no producer thread to join): the same checks, nothing blocked."""
    sim = on_sim(request, monkeypatch, decoder)
    monkeypatch.setattr(producer_stage, "INLINE_BELOW", 0.0)  # num_workers=2: every fill in the producer thread
    ds = fastload.open(more_batches_than_slots,
                       transforms={"image": [T.RandomResizedCrop(16), T.RandomHorizontalFlip()]})
    kw = dict(batch_size=2, shuffle=True, seed=3, num_workers=num_workers, decoder=decoder, on_error="skip",
              device="cuda")
    ref = reference(sim, ds, kw)
    loader = fastload.DataLoader(ds, **kw)
    producer = num_workers > 0 or decoder != "native"
    del sim.host_waits[:]
    sim.frozen = True
    seen: list = []
    if how == "break":
        for k, (x, y) in enumerate(loader):
            sim.model_step([x, y], seen)
            others(sim, sim.default)
            if k == TAKEN - 1:
                assert sim.blocked.wait(10) or not producer, "the producer never reached the host ring's bound"
                guard = Watchdog(sim)
                break  # the for loop drops its iterator here
        guard.stop()
    else:
        it = iter(loader)
        first_steps(sim, it, seen)
        assert sim.blocked.wait(10) or not producer, "the producer never reached the host ring's bound"
        guard = Watchdog(sim)
        if how == "del it":
            del it
        else:
            it = iter(loader)  # the old iterator is dropped here, mid-epoch
        guard.stop()
    assert not sim.waits_in(), sim.waits_in()
    # the next epoch starts with the device still frozen: its producer fills every slot it may while the abandoned
    # epoch's copies are pending (a slot let go under one of them would be refilled now, and its queued step see
    # the new bytes). Its first batch may need more slots than are free: the loop then waits for the GPU, as any
    # loop that runs the host ring's size ahead of its GPU does (fill.py), until the watchdog thaws the device
    it = it if how == "new iter" else iter(loader)
    guard = Watchdog(sim, patience=0.5)
    x, y = next(it)
    guard.stop(strict=False)
    sim.model_step([x, y], seen)
    others(sim, sim.default)
    assert not sim.waits_in(), sim.waits_in()
    sim.thaw()
    epoch(sim, it, seen)
    assert not sim.races and not sim.waits_in(), sim.waits_in()
    assert len(seen) == len(ref) == TAKEN + 17
    for (x, y), (sx, sy) in zip(ref, seen):
        assert torch.equal(y, sy) and torch.equal(x, sx)
    gc.collect()


class _Pending:
    """A CUDA event whose work never runs (``Event.query`` stays False)."""

    @staticmethod
    def query() -> bool:
        return False


def test_the_cuda_host_wait_gives_up_when_told_to_stop_and_keeps_what_the_copy_reads():
    """``CudaStreams.wait_host`` (the real backend's poll of ``Event.query``) returns once ``stop`` says so, and
    ``CopyHolds`` keeps the host batch the pending copy reads: giving up frees nothing. A poll without the stop
    predicate ran until the GPU did."""
    streams = _ring.CudaStreams.__new__(_ring.CudaStreams)  # no side stream (no GPU): only its host wait runs
    holds = _ring.CopyHolds(streams)
    batch = torch.zeros(4)
    holds.keep(_Pending(), batch)
    stop = threading.Event()
    waiter = threading.Thread(target=holds.wait_oldest, args=(stop.is_set,), daemon=True)
    waiter.start()
    time.sleep(0.05)
    assert waiter.is_alive()  # waiting: the copy has not run
    stop.set()
    waiter.join(5)
    assert not waiter.is_alive(), "the host wait did not give up when told to stop"
    assert len(holds) == 1 and holds.items[0][1] is batch
