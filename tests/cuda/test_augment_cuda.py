"""The batched augmentation engine and MixUp/CutMix on the GPU give what they give on the CPU (skipped without CUDA).

Bounds: pixel operations within 1 level (CUDA may fuse multiply-adds, moving a float by an ulp across a
rounding boundary), nearest affine within 0.1% of values (pixel-edge ties), mean differences <= 0.05."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "augment"))

from augment_common import H, W, photo_tiles, to_batch  # noqa: E402
from fastload._augment.color import ColorJitter  # noqa: E402
from fastload._augment.engine_torch import run_torch  # noqa: E402
from fastload._augment.filters import GaussianBlur, RandomErasing  # noqa: E402
from fastload._augment.mix import CutMix, MixUp  # noqa: E402
from fastload._augment.plan import plan_batch  # noqa: E402
from fastload._augment.policies import RandAugment, TrivialAugmentWide  # noqa: E402

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

RECIPES = [[TrivialAugmentWide(), RandomErasing(0.25)], [RandAugment()], [ColorJitter(0.4, 0.4, 0.4, 0.1)],
           [GaussianBlur(7)]]


def engine_on(device: str) -> None:
    x = to_batch(photo_tiles(32))
    for transforms in RECIPES:
        plan = plan_batch(transforms, np.tile([H, W], (32, 1)), np.random.default_rng(0))
        cpu = run_torch(x, plan).to(torch.int64)
        dev = run_torch(x.to(device), plan)
        assert dev.device.type == torch.device(device).type
        d = (dev.cpu().to(torch.int64) - cpu).abs()
        assert (d > 1).float().mean().item() <= 1e-3 and d.float().mean().item() <= 0.05, transforms


def mix_on(device: str) -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(8, 3, 16, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
    for t in (MixUp(alpha=0.2, num_classes=4), CutMix(num_classes=4)):
        a = t(x, y, np.random.default_rng(1))
        b = t(x.to(device), y.to(device), np.random.default_rng(1))
        assert b[0].device.type == torch.device(device).type == b[1].device.type
        assert torch.allclose(a[0], b[0].cpu(), atol=1e-6) and torch.allclose(a[1], b[1].cpu(), atol=1e-6)


def test_engine_on_cuda_matches_cpu():
    engine_on("cuda")


def test_mix_on_cuda_matches_cpu():
    mix_on("cuda")
