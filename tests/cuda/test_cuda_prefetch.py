"""CUDA tests, skipped cleanly where no GPU is present. These call ``.cpu()`` per batch, which drains the
GPU: they check values and layouts, not stream ordering (test_gpu_lag.py forces the lag for that).

Run on a GPU machine with ``python -m pytest tests/cuda -q``.
"""

from __future__ import annotations

import pytest
import torch

import fastload
from fastload import transforms as T

from gpu_common import NEEDS_CUDA
from conftest import packed_image_folder  # noqa: E402 (gpu_common puts tests/ on sys.path)

pytestmark = NEEDS_CUDA

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
GEO = [T.RandomResizedCrop(32), T.RandomHorizontalFlip()]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return packed_image_folder(tmp_path_factory.mktemp("cuda"), classes=4, per_class=16, workers=2)


def test_device_batches_equal_cpu_batches(packed):
    ds = fastload.open(packed, transforms={"image": GEO})
    cpu = [(x.clone(), y.clone()) for x, y in fastload.DataLoader(ds, batch_size=8, seed=1, num_workers=2)]
    gpu = [(x.cpu(), y.cpu()) for x, y in fastload.DataLoader(ds, batch_size=8, seed=1, num_workers=2, device="cuda")]
    assert len(cpu) == len(gpu)
    for (a, la), (b, lb) in zip(cpu, gpu):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_normalize_on_device_matches_cpu(packed):
    tail = [T.ToDtype(torch.float16, scale=True), T.Normalize(MEAN, STD)]
    ds = fastload.open(packed, transforms={"image": GEO + tail})
    cpu = [x.clone() for x, _ in fastload.DataLoader(ds, batch_size=8, seed=2)]
    for ref, (x, _) in zip(cpu, fastload.DataLoader(ds, batch_size=8, seed=2, device="cuda")):
        assert x.is_cuda and x.dtype == torch.float16 and x.is_contiguous(memory_format=torch.channels_last)
        assert (x.float().cpu() - ref.float()).abs().max() < 2e-2


def test_training_loop_has_no_host_sync(packed):
    ds = fastload.open(packed, transforms={"image": GEO + [T.ToDtype(torch.float32, scale=True)]})
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(8, 4)).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dl = fastload.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, device="cuda", drop_last=True)
    next(iter(dl))  # warm-up: allocations and the CUDA context
    torch.cuda.set_sync_debug_mode("error")
    try:
        for x, y in dl:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


def test_to_device_around_a_torch_loader():
    tds = torch.utils.data.TensorDataset(torch.arange(64, dtype=torch.float32).view(16, 4))
    dl = torch.utils.data.DataLoader(tds, batch_size=4, pin_memory=True)
    out = [b[0].cpu() for b in fastload.to_device(dl, "cuda")]
    assert torch.cat(out).view(-1).tolist() == list(range(64))
