"""Segmentation masks follow their images' geometry (flips, affine; nearest, their own fill) and skip pixel
operations, in both engines."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from augment_common import H, W
from fastload._augment.color import ColorJitter
from fastload._augment.engine_pil import run_pil, run_pil_mask
from fastload._augment.engine_torch import run_torch, run_torch_mask
from fastload._augment.geometry import RandomAffine, RandomVerticalFlip
from fastload._augment.plan import plan_batch
from fastload._augment.policies import TrivialAugmentWide

N = 48


def _masks(n=N, seed=0):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:H, 0:W]
    out = np.zeros((n, H, W), np.uint8)
    for i in range(n):
        for label in range(1, 6):  # five blobs with labels 1-5 on background 0
            cy, cx, r = rng.uniform(0, H), rng.uniform(0, W), rng.uniform(4, 15)
            out[i][(y - cy) ** 2 + (x - cx) ** 2 < r * r] = label
    return out


@pytest.mark.parametrize("seed", range(3))
def test_masks_follow_the_images_geometry_in_both_engines(seed):
    masks = _masks(seed=seed)
    plan = plan_batch([RandomVerticalFlip(), TrivialAugmentWide(), ColorJitter(0.4, 0.4),
                       RandomAffine(15, translate=(0.1, 0.1), interpolation="bilinear")],
                      np.tile([H, W], (N, 1)), np.random.default_rng(seed))
    out = run_torch_mask(torch.from_numpy(masks), plan, fill=255).numpy()
    ref = np.stack([run_pil_mask(masks[i], plan, i, fill=255) for i in range(N)])
    assert np.mean(out != ref) <= 1e-3  # nearest: pixel-edge ties only
    assert set(np.unique(out)) <= {0, 1, 2, 3, 4, 5, 255}  # labels stay labels: no blending, no colour ops
    moved = plan.geometry.has_affine
    assert (out[moved] == 255).any() and not (out[~moved] == 255).any()


def test_a_mask_moves_exactly_like_an_image_resampled_nearest():
    """An image whose pixels are its mask's labels, under a nearest-only plan with no pixel operation,
    comes out equal to the mask wherever it was not filled."""
    masks = _masks(16, seed=4)
    plan = plan_batch([RandomVerticalFlip(), TrivialAugmentWide()], np.tile([H, W], (16, 1)),
                      np.random.default_rng(4))
    plan.steps = []  # geometry only
    img = np.repeat(masks[..., None] * 40, 3, axis=3)
    img_out = run_torch(torch.from_numpy(img).permute(0, 3, 1, 2).contiguous(), plan)[:, 0].numpy()
    mask_out = run_torch_mask(torch.from_numpy(masks), plan, fill=255).numpy()
    inside = mask_out != 255
    assert np.array_equal(img_out[inside], mask_out[inside] * 40)
    assert np.array_equal(run_pil(img[3], plan, 3)[..., 0][inside[3]], mask_out[3][inside[3]] * 40)


def test_mask_shapes_and_fill_are_checked():
    plan = plan_batch([], np.tile([H, W], (2, 1)), np.random.default_rng(0))
    with pytest.raises(TypeError, match=r"masks should be a uint8 \(N, H, W\) or \(N, 1, H, W\) tensor"):
        run_torch_mask(torch.zeros(2, 3, H, W, dtype=torch.uint8), plan)
    with pytest.raises(ValueError, match="fill=300 should be an int in"):
        run_torch_mask(torch.zeros(2, H, W, dtype=torch.uint8), plan, fill=300)
    with pytest.raises(TypeError, match=r"mask should be an \(H, W\) uint8 array"):
        run_pil_mask(np.zeros((H, W, 3), np.uint8), plan, 0)
    out = run_torch_mask(torch.ones(2, 1, H, W, dtype=torch.uint8), plan)
    assert out.shape == (2, 1, H, W) and int(out.min()) == 1
