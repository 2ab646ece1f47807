"""Shared by test_timm_loader.py (stand-ins, CI) and test_timm_loader_real.py (timm's own create_loader)."""

from __future__ import annotations

import warnings

import torch

import fastload

# Resize against PIL's, in levels of 255, as test_tvfolder.py bounds it
MEAN_LEVELS, IMAGE_LEVELS = 1.5, 2.5
STD = (0.229, 0.224, 0.225)


def quietly(fn, *args, **kw):
    """``fn(*args, **kw)`` and the messages of the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args, **kw)
    return out, [str(w.message) for w in caught]


def levels(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Each image's mean absolute difference in levels of 255, from two normalized float batches."""
    std = torch.tensor(STD).view(1, 3, 1, 1) * 255
    return ((x.float() - ref.float()).abs() * std).flatten(1).mean(1)


def assert_same_batches(ours, theirs):
    """The same number of batches, labels equal, images within the resize bounds."""
    ours, theirs = list(ours), list(theirs)
    assert len(ours) == len(theirs) > 0
    per_image = []
    for (x, y), (rx, ry) in zip(ours, theirs):
        assert x.shape == rx.shape and x.dtype == rx.dtype
        assert torch.equal(y, ry), (y, ry)
        per_image.append(levels(x, rx))
    lv = torch.cat(per_image)
    assert lv.mean() < MEAN_LEVELS and lv.max() < IMAGE_LEVELS, lv


def fast(loader) -> bool:
    inner = getattr(loader, "loader", loader)
    return isinstance(inner, fastload.DataLoader) and inner.fast_path_reason is None
