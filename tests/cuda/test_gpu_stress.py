"""The H100 corruption, reproduced: a real model trains between batches, so the GPU lags behind the host
and the caching allocator recycles the model's freed activations, and every handed batch is compared
with the CPU loader's batch for the same seed. Skipped without CUDA and torchvision.

Run on a GPU machine with ``python -m pytest tests/cuda -q``.
"""

from __future__ import annotations

import pytest
import torch

import fastload
from fastload import transforms as T

from gpu_common import NEEDS_CUDA_AND_TORCHVISION
from conftest import packed_image_folder  # noqa: E402 (gpu_common puts tests/ on sys.path)

pytestmark = NEEDS_CUDA_AND_TORCHVISION

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
CLASSES = 8
EPOCHS = 3


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return packed_image_folder(tmp_path_factory.mktemp("stress"), classes=CLASSES, per_class=40, workers=4)


@pytest.fixture(scope="module")
def model():
    import torchvision

    m = torchvision.models.resnet18(num_classes=CLASSES).cuda().to(memory_format=torch.channels_last)
    return m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)


def train_step(model, opt, x, y):
    """ResNet-18, AMP bf16: enough work that the GPU runs far behind the host."""
    if x.dtype == torch.uint8:
        x = x.float().div_(255)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def check_epochs(loader_cpu, loader_gpu, model, normalize: bool, sync_debug: bool = False):
    m, opt = model
    for epoch in range(EPOCHS):
        ref = [(x.clone(), y.clone()) for x, y in loader_cpu]
        got = []
        if sync_debug:
            torch.cuda.set_sync_debug_mode("error")
        try:
            for x, y in loader_gpu:
                train_step(m, opt, x, y)
                got.append((x.clone(), y.clone()))  # on the consumer stream, after the step: what it saw
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        assert len(got) == len(ref), f"epoch {epoch}: {len(got)} batches, expected {len(ref)}"
        for b, ((rx, ry), (gx, gy)) in enumerate(zip(ref, got)):
            assert torch.equal(ry, gy.cpu()), f"epoch {epoch} batch {b}: labels differ"
            if normalize:
                assert (rx.float() - gx.float().cpu()).abs().max() < 2e-2, f"epoch {epoch} batch {b}: images differ"
            else:
                assert torch.equal(rx, gx.cpu()), f"epoch {epoch} batch {b}: images differ"


@pytest.mark.parametrize("num_workers", [0, 8])
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("normalize", [False, True])
def test_batches_under_a_training_load_equal_the_cpu_loaders(packed, model, num_workers, persistent, normalize):
    tail = [T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)] if normalize else []
    ds = fastload.open(packed, transforms={"image": [T.RandomResizedCrop(112), T.RandomHorizontalFlip()] + tail})
    kw = dict(batch_size=32, shuffle=True, drop_last=True, seed=7, num_workers=num_workers)
    cpu = fastload.DataLoader(ds, **kw)
    gpu = fastload.DataLoader(ds, device="cuda", persistent_workers=persistent and num_workers > 0, **kw)
    check_epochs(cpu, gpu, model, normalize)


def test_to_device_around_a_torch_loader_under_a_training_load(packed, model):
    ds = fastload.open(packed, transforms={"image": [T.Resize((112, 112))]})
    # a shuffling torch loader would differ between the two passes: both follow one fixed permutation
    perm = torch.randperm(len(ds), generator=torch.Generator().manual_seed(3)).tolist()
    sampler = torch.utils.data.BatchSampler(perm, 32, drop_last=True)
    fixed = torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=4, pin_memory=True)
    cpu = torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=4)
    check_epochs(cpu, fastload.to_device(fixed, "cuda"), model, normalize=False)


def test_no_host_sync_over_whole_epochs(packed, model):
    tail = [T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)]
    ds = fastload.open(packed, transforms={"image": [T.RandomResizedCrop(112), T.RandomHorizontalFlip()] + tail})
    kw = dict(batch_size=32, shuffle=True, drop_last=True, seed=11, num_workers=8)
    gpu = fastload.DataLoader(ds, device="cuda", persistent_workers=True, **kw)
    cpu = fastload.DataLoader(ds, **kw)
    next(iter(gpu))  # warm-up: the CUDA context, the ring, the Normalize constants
    next(iter(cpu))  # the same epoch skipped on the reference, so the next epochs line up
    check_epochs(cpu, gpu, model, normalize=True, sync_debug=True)
