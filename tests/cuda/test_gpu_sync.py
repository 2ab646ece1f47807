"""No host sync in the training thread, in any configuration: ``next()`` returns in far less than the
100 ms of GPU work queued before it, and a fresh process runs whole epochs under
``torch.cuda.set_sync_debug_mode("error")`` from its first batch (every configuration in one new process:
gpu_common.FreshProcess). On the simulated GPU the same
property is ``SimGpu.waits_in()`` (tests/test_ring.py, tests/test_gpu_decoders_sim.py).

The latency check covers every decoder, within an epoch and across its boundary (StopIteration, the next epoch's
first ``next()``); the fresh-process check here the native decoder and
``to_device``, and tests/cuda/test_gpu_decoder_streams.py the GPU decoders (which no longer synchronise
their stream in the producer thread: they hand each batch on with an event). Skipped without CUDA.
"""

from __future__ import annotations

import textwrap
import time

import pytest
import torch

import fastload
from fastload import transforms as T

from gpu_common import MEAN, NEEDS_CUDA, STD, FreshProcess, decoder_param, lag
from conftest import packed_image_folder  # noqa: E402 (gpu_common puts tests/ on sys.path)

pytestmark = NEEDS_CUDA

QUEUED_MS = 100
LIMIT_S = 0.030  # "far below 100 ms": a next() that waited for the GPU takes ~100 ms


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return packed_image_folder(tmp_path_factory.mktemp("sync"), classes=3, per_class=12, workers=2)


def latencies(it, steps: int = 6) -> list[float]:
    for _ in range(2):  # warm-up: the first slots, the CUDA context, the producer thread
        next(it)
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        lag(QUEUED_MS)
        t = time.perf_counter()
        x, y = next(it)
        times.append(time.perf_counter() - t)
        del x, y
    torch.cuda.synchronize()
    return times


@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)], ids=["nw0", "nw2", "nw2-pers"])
@pytest.mark.parametrize("decoder", ["native", decoder_param("nvjpeg"), decoder_param("dali"), decoder_param("auto")])
def test_next_does_not_wait_for_queued_gpu_work(packed, decoder, num_workers, persistent):
    """decoder x num_workers: what decides whether ``next()`` can wait (who fills the slot, on which thread, and
    when the producer starts). Layout and Normalize change the work queued on the side stream, not who waits for
    it: tests/cuda/test_gpu_lag.py keeps them in its matrix, and the fresh-process check below runs them under
    the sync debug mode (which would raise on any host sync they added)."""
    tail = [T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)]
    ds = fastload.open(packed, transforms={"image": [T.RandomResizedCrop(48)] + tail})
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, num_workers=num_workers, decoder=decoder,
                                 persistent_workers=persistent, device="cuda")
    times = latencies(iter(loader))
    assert max(times) < LIMIT_S, [round(t * 1e3, 1) for t in times]


def boundary_latencies(loader) -> dict[str, list[float]]:
    """``next()`` across an epoch boundary, each with QUEUED_MS of GPU work queued first: every call of the
    epoch's end (the end of the batch sequence reaches the loader up to ``prefetch_factor`` batches before its
    StopIteration, and a non-persistent loader's epoch ends there), the StopIteration itself, and the next
    epoch's first calls (its producer starts at the first; the decoders are the epoch before's)."""
    it = iter(loader)
    for _ in range(2):  # warm-up: the first slots, the CUDA context, the decoders made
        next(it)
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {"end": [], "stop": [], "next epoch": []}
    while True:
        lag(QUEUED_MS)
        t = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:
            times["stop"].append(time.perf_counter() - t)
            break
        times["end"].append(time.perf_counter() - t)
        del x, y
    it = iter(loader)
    for _ in range(2):
        lag(QUEUED_MS)
        t = time.perf_counter()
        x, y = next(it)
        times["next epoch"].append(time.perf_counter() - t)
        del x, y
    del it
    torch.cuda.synchronize()
    return times


@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)], ids=["nw0", "nw2", "nw2-pers"])
@pytest.mark.parametrize("decoder", ["native", decoder_param("nvjpeg"), decoder_param("dali"), decoder_param("auto")])
def test_the_epoch_boundary_does_not_wait_for_queued_gpu_work(packed, decoder, num_workers, persistent):
    """StopIteration and the next epoch's first next() were never timed: a non-persistent loader closed its GPU
    decoders in the training thread there (DALI's pipeline destroyed: a device synchronize) and built them again
    for the next epoch's first batch (DALI's build, torchvision's probe decode). 36 samples, batches of 4: nine."""
    ds = fastload.open(packed, transforms={"image": [T.RandomResizedCrop(48)]})
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, num_workers=num_workers, decoder=decoder,
                                 persistent_workers=persistent, device="cuda")
    times = boundary_latencies(loader)
    assert len(times["end"]) == 7 and len(times["stop"]) == 1
    slow = {k: [round(t * 1e3, 1) for t in v] for k, v in times.items() if max(v) >= LIMIT_S}
    assert not slow, f"next() took (ms) {slow} with {QUEUED_MS} ms of GPU work queued"


@pytest.mark.parametrize("pin", [True, False], ids=["pinned", "unpinned"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_next_over_a_torch_loader_does_not_wait(pin, num_workers):
    tds = torch.utils.data.TensorDataset(torch.zeros(64, 3, 32, 32, dtype=torch.uint8), torch.arange(64))
    dl = torch.utils.data.DataLoader(tds, batch_size=4, num_workers=num_workers, pin_memory=pin)
    times = latencies(iter(fastload.to_device(dl, "cuda")))
    assert max(times) < LIMIT_S, [round(t * 1e3, 1) for t in times]


FRESH = FreshProcess(textwrap.dedent("""
    import torch, fastload
    from fastload import transforms as T

    def run(path, source, num_workers, layout, normalize):
        tail = [T.ToDtype(torch.float32, scale=True), T.Normalize({mean}, {std})] if normalize else []
        fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        if source == "fastload":
            ds = fastload.open(path, transforms={{"image": [T.RandomResizedCrop(48)] + tail}})
            loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, num_workers=num_workers, memory_format=fmt,
                                         device="cuda")
        else:
            tds = torch.utils.data.TensorDataset(torch.zeros(32, 3, 48, 48, dtype=torch.uint8), torch.arange(32) % 3)
            tl = torch.utils.data.DataLoader(tds, batch_size=4, num_workers=num_workers, pin_memory=source == "pinned")
            loader = fastload.to_device(tl, "cuda", transforms={{0: tail}} if tail else None)
        acc = torch.zeros((), device="cuda")  # the step's accumulator, before the mode
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # from the loader's very first batch: ring, constants, slots
        try:
            for epoch in range(2):
                for x, y in loader:
                    acc += x.float().mean() + y.float().mean()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        return "ok"
""").format(mean=MEAN, std=STD))

# to_device keeps the source's layout: its cases are channels_last only (a contiguous case would repeat them)
FRESH_CASES = [(source, nw, layout, normalize) for source in ("fastload", "pinned", "unpinned") for nw in (0, 2)
               for layout in ("channels_last", "contiguous") for normalize in (False, True)
               if source == "fastload" or layout == "channels_last"]


@pytest.mark.parametrize("source,num_workers,layout,normalize", FRESH_CASES)
def test_a_fresh_process_runs_under_sync_debug_error_from_its_first_batch(request, packed, source, num_workers, layout,
                                                                          normalize):
    """All cases in one new process (gpu_common.FreshProcess): CUDA starts once; each case's loader starts under
    the mode, from its first batch."""
    assert FRESH.result(request, path=str(packed)) == "ok"
