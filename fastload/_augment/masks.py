"""A mask field moved with its image's plan: the geometry only (crop box, resize, flips, a padded RandomCrop's
window, the affine), NEAREST, with the mask's own fill (``type_fill.py``); pixel operations skip masks.

Two engines that agree exactly: the PIL reference (``move_mask``, ``engine_pil.run_pil_mask`` from the stored
mask), which ``ds[i]`` and the tests run, and one native call per batch (``decode_masks``: csrc/mask.cc, libpng
decode and Pillow's nearest arithmetic on the pool's threads, GIL released). The mask kind itself (how it is
stored and checked, its part of a batch) is ``fields/mask.py``'s, which knows no engine: ``ds[i]`` hands it
``moved_mask`` (``ReadContext.moved_mask``), the batcher ``decode_masks`` (``Batcher.move_masks``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._native import native
from .plan import AugmentPlan, PlanBuilder
from .type_fill import MASK_FILL

__all__ = ["decode_masks", "geometry_of", "move_mask", "moved_mask"]


def geometry_of(plan: Any) -> AugmentPlan:
    """The ``AugmentPlan`` whose geometry a mask executes, crop boxes included, for a ``transforms.Plan``."""
    if plan.augment is not None:
        return plan.augment  # begun from the crop plan (``Plan.with_augment``): its crop boxes are there
    return PlanBuilder.from_crop_plan(plan).finish()


def move_mask(
    mask: np.ndarray, geometry: AugmentPlan, k: int, fill: int | None = None, frame: Any = None
) -> np.ndarray:
    """Sample ``k``'s mask (the source's size, which its image has: the caller checks) moved by the plan
    ``geometry`` (``geometry_of``). ``fill`` None: each transform's mask fill, from the plan. ``frame``: the image
    plan's ``Plan.frames`` row for it (a resize then a crop of its pixels, as torchvision moves the mask), or None."""
    from .engine_pil import run_pil_mask  # PIL only when a mask is moved: fastload imports without PIL

    return run_pil_mask(mask, geometry, k, fill=fill, source=True, frame=frame)


def moved_mask(mask: np.ndarray, plan: Any) -> np.ndarray:
    """``ds[i]``'s mask moved by its image's one-sample plan (a ``transforms.Plan``)."""
    return move_mask(mask, geometry_of(plan), 0, frame=plan.frame_of(0))


def decode_masks(
    pool: Any, sources: tuple, meta: np.ndarray, plan: Any, out: np.ndarray, fill: int | None = None
) -> list:
    """The batch's masks (``sources``: ``(regions, region, offset, length)``, ``meta``: (n, 2) stored sizes) moved
    with ``plan`` (a ``transforms.Plan``) into ``out`` (n, H, W) uint8, natively on ``pool`` (csrc/mask.cc, equal
    to ``move_mask``'s PIL reference). ``fill`` None: each transform's mask fill, from the plan. Returns the
    failures ``[(k, message)]``."""
    geo = geometry_of(plan).geometry
    n, (oh, ow) = len(meta), out.shape[1:]
    pad = geo.pad
    fills: Any = fill  # the given fill for every sample, or
    if fill is None:  # per sample: the padded window's fill, the affine's (csrc/mask.cc reads both)
        fills = np.stack(
            [
                np.full(n, MASK_FILL) if pad is None or pad.mask_fill is None else pad.mask_fill,
                np.full(n, MASK_FILL) if geo.mask_fill is None else geo.mask_fill,
            ],
            axis=1,
        ).astype(np.uint8)
    if pad is None:
        padded = np.zeros(n, np.uint8)
        box_hw = geo.out_hw
        rows, cols = np.zeros((n, oh), np.int32), np.zeros((n, ow), np.int32)
    else:
        padded = pad.active.astype(np.uint8)
        box_hw = np.where(pad.active[:, None], pad.decode_hw, geo.out_hw)
        rows, cols = pad.rows, pad.cols
    regions, region, offset, length = sources
    return native().decode_mask_batch(
        pool,
        regions,
        region,
        offset,
        length,
        meta,
        plan.crops,
        box_hw,
        padded,
        rows,
        cols,
        geo.hflip.astype(np.uint8),
        geo.vflip.astype(np.uint8),
        geo.has_affine.astype(np.uint8),
        geo.affine.reshape(n, 6),
        fills,
        out,
        frames=None if plan.frames is None else np.ascontiguousarray(plan.frames, dtype=np.int32),
    )
