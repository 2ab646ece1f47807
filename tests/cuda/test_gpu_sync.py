"""No host sync in the training thread, in any configuration: ``next()`` returns in far less than the
100 ms of GPU work queued before it, and a fresh process runs whole epochs under
``torch.cuda.set_sync_debug_mode("error")`` from its first batch. On the simulated GPU the same
property is ``SimGpu.waits_in()`` (tests/test_ring.py, tests/test_gpu_decoders_sim.py).

The latency check covers every decoder, within an epoch and across its boundary (StopIteration, the next epoch's
first ``next()``); the fresh-process check here the native decoder and
``to_device``, and tests/cuda/test_gpu_decoder_streams.py the GPU decoders (which no longer synchronise
their stream in the producer thread: they hand each batch on with an event). Skipped without CUDA.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import fastload
from fastload import transforms as T

from gpu_common import MEAN, NEEDS_CUDA, STD, decoder_param, lag
from conftest import packed_image_folder  # noqa: E402 (gpu_common puts tests/ on sys.path)

pytestmark = NEEDS_CUDA

QUEUED_MS = 100
LIMIT_S = 0.030  # "far below 100 ms": a next() that waited for the GPU takes ~100 ms
ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.parametrize("normalize", [False, True], ids=["uint8", "normalize"])
@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)], ids=["nw0", "nw2", "nw2-pers"])
@pytest.mark.parametrize("decoder", ["native", decoder_param("nvjpeg"), decoder_param("dali"), decoder_param("auto")])
def test_next_does_not_wait_for_queued_gpu_work(packed, decoder, num_workers, persistent, layout, normalize):
    tail = [T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)] if normalize else []
    ds = fastload.open(packed, transforms={"image": [T.RandomResizedCrop(48)] + tail})
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, num_workers=num_workers, decoder=decoder,
                                 persistent_workers=persistent, memory_format=fmt, device="cuda")
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


FRESH = textwrap.dedent("""
    import sys, torch, fastload
    from fastload import transforms as T
    path, workers, layout, normalize, source = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1", sys.argv[5]
    tail = [T.ToDtype(torch.float32, scale=True), T.Normalize({mean}, {std})] if normalize else []
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    if source == "fastload":
        ds = fastload.open(path, transforms={{"image": [T.RandomResizedCrop(48)] + tail}})
        loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, num_workers=workers, memory_format=fmt,
                                     device="cuda")
    else:
        tds = torch.utils.data.TensorDataset(torch.zeros(32, 3, 48, 48, dtype=torch.uint8), torch.arange(32) % 3)
        tl = torch.utils.data.DataLoader(tds, batch_size=4, num_workers=workers, pin_memory=source == "pinned")
        loader = fastload.to_device(tl, "cuda", transforms={{0: tail}} if tail else None)
    acc = torch.zeros((), device="cuda")  # the CUDA context and the step's accumulator, before the mode
    torch.cuda.set_sync_debug_mode("error")  # from the very first batch: ring, constants, slots
    for epoch in range(2):
        for x, y in loader:
            acc += x.float().mean() + y.float().mean()
    torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    print("ok")
""").format(mean=MEAN, std=STD)


@pytest.mark.parametrize("source", ["fastload", "pinned", "unpinned"])
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
@pytest.mark.parametrize("normalize", [False, True], ids=["uint8", "normalize"])
def test_a_fresh_process_runs_under_sync_debug_error_from_its_first_batch(packed, source, num_workers, layout,
                                                                          normalize):
    if source != "fastload" and layout == "contiguous":
        pytest.skip("to_device keeps the source's layout")
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    r = subprocess.run([sys.executable, "-c", FRESH, str(packed), str(num_workers), layout, str(int(normalize)),
                        source], capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
