"""ThreeAugment (DeiT III): what it plans, how far its blur is from DeiT's PIL blur, and engine agreement."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageFilter

from augment_common import H, W, chi2_uniform, differences, ks_critical, ks_uniform, photo_tiles
from fastload._augment.filters import _blur_pil
from fastload._augment.plan import plan_batch
from fastload._augment.policies import ThreeAugment

N = 6000


def _plan(t, n=N, seed=0):
    return plan_batch([t], np.tile([H, W], (n, 1)), np.random.default_rng(seed))


def test_one_of_three_per_sample_then_color_jitter():
    plan = _plan(ThreeAugment())
    picked = {op: np.concatenate([s.index for s in plan.steps if s.op == op])
              for op in ("grayscale", "solarize", "gaussian_blur")}
    together = np.sort(np.concatenate(list(picked.values())))
    assert np.array_equal(together, np.arange(N))  # exactly one each
    stat, crit = chi2_uniform(np.array([v.size for v in picked.values()]))
    assert stat < crit
    assert all((s.params["threshold"] == 128.0).all() for s in plan.steps if s.op == "solarize")
    sigma = np.concatenate([s.params["sigma"][:, 0] for s in plan.steps if s.op == "gaussian_blur"])
    assert ks_uniform(sigma, 0.1, 2.0) < ks_critical(sigma.size)
    assert all((s.params["ksize"] == 13).all() for s in plan.steps if s.op == "gaussian_blur")
    for op in ("brightness", "contrast", "saturation"):
        f = np.concatenate([s.params["factor"] for s in plan.steps if s.op == op])
        assert f.size == N and ks_uniform(f, 0.7, 1.3) < ks_critical(N)
    # The jitter comes after the choice for every sample.
    for i in range(20):
        names = [n for n, _ in plan.ops_of(i)]
        assert names[0] in picked and set(names[1:]) == {"brightness", "contrast", "saturation"}
    assert not any(s.op == "brightness" for s in _plan(ThreeAugment(color_jitter=0), n=50).steps)


def test_blur_is_close_to_deits_pil_blur():
    """DeiT blurs with ImageFilter.GaussianBlur(radius=sigma): away from the borders, within half a level on
    average (max 6) over sigma 0.1-2; at sigma 0.1 identical."""
    tiles = photo_tiles(8)
    for sigma in (0.1, 0.5, 1.0, 2.0):
        d = []
        for tile in tiles:
            deit = np.asarray(Image.fromarray(tile).filter(ImageFilter.GaussianBlur(sigma))).astype(int)
            ours = np.asarray(_blur_pil(Image.fromarray(tile), {"ksize": np.array([13, 13]),
                                                               "sigma": np.array([sigma, sigma])})).astype(int)
            d.append(np.abs(deit - ours)[8:-8, 8:-8])
        d = np.concatenate(d)
        assert d.max() <= 6 and d.mean() <= 0.6, (sigma, d.max(), d.mean())


def test_engines_agree_on_three_augment():
    tiles = photo_tiles(48)
    for seed in range(2):
        _, mean_d, _ = differences(tiles, _plan(ThreeAugment(), n=48, seed=seed))
        assert mean_d <= 0.6
