"""Shared by test_timm_mixup.py (timm stand-ins, CI) and test_timm_real.py's Mixup tests (timm's own objects):
the same comparison run against either."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from fastload._augment.timm_mix import TimmMixup

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def samples(n=8, h=12, w=10, num_classes=5, seed=0):
    """``n`` (uint8 CHW numpy image, class index) samples, as timm's ``ToNumpy`` gives them to its collate."""
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 256, (3, h, w), dtype=np.uint8), int(rng.integers(0, num_classes))) for _ in range(n)]


def normalize(u8: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """timm's PrefetchLoader's arithmetic in its ``img_dtype``: minus mean * 255, over std * 255."""
    mean = torch.tensor([m * 255 for m in MEAN], dtype=dtype).view(1, 3, 1, 1)
    std = torch.tensor([s * 255 for s in STD], dtype=dtype).view(1, 3, 1, 1)
    return u8.to(dtype).sub_(mean).div_(std)


def versus_collate(collate_mixup, seed: int, n=8, dtype: torch.dtype = torch.float32):
    """(timm's batch, fastload's batch) for one batch of ``samples``: timm's ``FastCollateMixup`` collating and
    mixing the uint8 samples, then normalized; fastload's ``TimmMixup`` over the same object mixing the
    normalized uint8 batch, from the same numpy global state. Each is (images, soft targets)."""
    batch = samples(n)
    # before timm's collate, which in mode 'pair' pastes CutMix's boxes into the samples it is given
    x = normalize(torch.stack([torch.from_numpy(a.copy()) for a, _ in batch]), dtype)
    np.random.seed(seed)
    u8, want_y = collate_mixup(batch)
    want_x = normalize(u8, dtype)
    y = torch.tensor([c for _, c in batch])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one note on FastCollateMixup's rounding
        fastload_mixup = TimmMixup(collate_mixup)
    np.random.seed(seed)
    got_x, got_y = fastload_mixup(x, y)
    return (want_x, want_y), (got_x, got_y)


def half_level() -> float:
    """timm's rounding of a blend to uint8, after normalizing: half a level over the smallest std."""
    return 0.5 / (255 * min(STD)) + 1e-5
