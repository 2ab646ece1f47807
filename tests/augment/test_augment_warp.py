"""The native geometry (csrc/warp.cc through engine_native.run_native): vertical flips and affine warps on the
tile against the PIL reference (engine_pil.run_pil, ``Image.transform(AFFINE)``), and its argument checks.

Measured over 48 tiles of 48x64 (smooth and photo-like) per case, 3 seeds: max 0 for every case below -- the
native warp reproduces PIL's arithmetic (16.16 fixed point for nearest maps with rotation or shear, per-row and
per-column tables for scale/translate-only maps, PIL's bilinear filter with its edge clamping and truncation).
A bug put back fails these tests: the fixed-point rounding without ``+ 0.5`` (the nearest rotation and affine
cases), bilinear rounding instead of truncating (the bilinear cases), the fill not written (every fill case),
bicubic's taps or its clipping changed (the timm cases).
"""

from __future__ import annotations

import numpy as np
import pytest

from augment_common import photo_tiles, smooth_tiles
from fastload._augment.engine_native import run_native
from fastload._augment.engine_pil import run_pil
from fastload._augment.geometry import RandomAffine, RandomHorizontalFlip, RandomRotation, RandomVerticalFlip
from fastload._augment.plan import plan_batch
from fastload._augment.policies import AutoAugment
from fastload._augment.plan import BICUBIC
from fastload._augment.timm_policies import RANDOM, TimmOp, TimmRandAugment

_C = pytest.importorskip("fastload._C")

N, H, W = 48, 48, 64

CASES = {
    "vflip": [RandomVerticalFlip(0.5)],
    "rotate nearest": [RandomRotation(40, fill=(250, 3, 128))],
    "rotate bilinear": [RandomRotation(40, interpolation="bilinear", fill=(10, 200, 30))],
    "affine nearest": [RandomAffine(20, translate=(0.2, 0.2), scale=(0.7, 1.3), shear=(-10, 10, -5, 5), fill=7)],
    "affine bilinear": [RandomAffine(20, translate=(0.2, 0.2), scale=(0.7, 1.3), shear=10, interpolation="bilinear")],
    "translate only (scale path)": [RandomAffine(0, translate=(0.3, 0.3), fill=99)],
    "scale only": [RandomAffine(0, scale=(0.5, 1.5), fill=(1, 2, 3))],
    "flips after a rotation": [RandomRotation(30), RandomHorizontalFlip(0.5), RandomVerticalFlip(0.5)],
    # timm's policies: PIL's bicubic transform (a = -1, clamped taps, clipped and truncated), and its random choice
    "timm bicubic": [TimmRandAugment([TimmOp(name, 1.0, 9, magnitude_std=2.0, interpolation=BICUBIC, fill=(124, 116, 104))
                                      for name in ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateY")], 2)],
    "timm random interpolation": [TimmRandAugment([TimmOp("Rotate", 1.0, 10, interpolation=RANDOM, fill=(5, 5, 5))], 1)],
}


def native_and_reference(tiles: np.ndarray, plan) -> tuple[np.ndarray, np.ndarray]:
    ref = np.stack([run_pil(tiles[i], plan, i) for i in range(plan.n)]).astype(np.int64)
    t = tiles.copy()  # the native engine runs after the decoder, which did the horizontal flips
    t[plan.geometry.hflip] = t[plan.geometry.hflip][:, :, ::-1]
    return run_native(np.ascontiguousarray(t), plan).astype(np.int64), ref


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_geometry_equals_pil(case, seed):
    tiles = photo_tiles(N, H, W, seed=seed) if seed % 2 else smooth_tiles(N, H, W, seed=seed)
    plan = plan_batch(CASES[case], np.tile([H, W], (N, 1)), np.random.default_rng(seed))
    assert plan.geometry.has_affine.any() or plan.geometry.vflip.any()
    out, ref = native_and_reference(tiles, plan)
    assert np.abs(out - ref).max() == 0


def test_policy_geometry_equals_pil_on_a_large_tile():
    """AutoAugment's rotations and shears on 224x224 tiles (where fixed-point steps accumulate)."""
    tiles = smooth_tiles(8, 224, 224)
    plan = plan_batch([RandomAffine(30, shear=(-20, 20, -20, 20), translate=(0.1, 0.1))],
                      np.tile([224, 224], (8, 1)), np.random.default_rng(5))
    out, ref = native_and_reference(tiles, plan)
    assert np.abs(out - ref).max() == 0
    plan = plan_batch([AutoAugment()], np.tile([224, 224], (8, 1)), np.random.default_rng(6))
    geo_only = plan.take(0, 8)
    geo_only.steps = []  # the policy's geometry alone: its pixel operations follow torch's formulas, not PIL's
    out, ref = native_and_reference(tiles, geo_only)
    assert np.abs(out - ref).max() == 0


def test_threads_do_not_change_the_result():
    tiles = smooth_tiles(16)
    plan = plan_batch([RandomRotation(30, interpolation="bilinear"), RandomVerticalFlip()], np.tile([H, W], (16, 1)),
                      np.random.default_rng(0))
    one = run_native(tiles.copy(), plan, pool=_C.Pool(0))
    four = run_native(tiles.copy(), plan, pool=_C.Pool(4))
    assert np.array_equal(one, four)


def test_bad_geometry_is_refused_before_any_pixel_changes():
    tiles = smooth_tiles(3)
    before = tiles.copy()
    plan = plan_batch([RandomRotation(30)], np.tile([H, W], (3, 1)), np.random.default_rng(0))
    plan.geometry.affine[2, 0, 1] = np.nan
    with pytest.raises(ValueError, match=r"sample 2's geometry: affine matrix entry 1 .* finite"):
        run_native(tiles, plan)
    assert np.array_equal(tiles, before)
    plan.geometry.affine[2, 0, 1] = 0.0
    plan.geometry.fill[1] = 300.0
    with pytest.raises(ValueError, match=r"sample 1's geometry: fill 300.* \[0, 255\]"):
        run_native(tiles, plan)
    assert np.array_equal(tiles, before)
