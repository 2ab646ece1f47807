"""PIL's ImageEnhance.Color / Contrast as plan operations (``fastload/_augment/pil_enhance.py``, csrc/pil_enhance.cc):
every engine against PIL's own ``ImageEnhance`` byte for byte, over every factor timm's Color/Contrast ops can draw
(``(m / 10) * 1.8 + 0.1`` for a magnitude up to any ``mmax``, their Increasing variants' ``max(0.1, 1 +- 0.9 m /
10)``) and beyond (negative factors), on tiles built here whose widths leave loop tails. The other luma than the
installed PIL's is held to a numpy model of PIL's arithmetic (a model this file first holds to the installed PIL).
Needs no timm (test_timm_policies_real.py holds timm's own ops to the same)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance

from augment_common import photo_tiles, smooth_tiles, to_batch
from fastload._augment.engine_native import run_native
from fastload._augment.engine_pil import run_pil
from fastload._augment.engine_torch import run_torch
from fastload._augment.pil_enhance import EDGE, LUMA_PILLOW, LUMA_SIMD, luma_numpy, pil_luma
from fastload._augment.plan import PlanBuilder
from fastload._augment.timm_policies import TimmOp

pytest.importorskip("fastload._C")

#: timm's factors at magnitudes 0..30 (mmax up to 30), the Increasing variants', and negative ones
M = np.linspace(0.0, 30.0, 61)
FACTORS = np.unique(np.concatenate([
    M / 10 * 1.8 + 0.1,
    np.maximum(0.1, 1.0 + M / 10 * 0.9), np.maximum(0.1, 1.0 - M / 10 * 0.9),
    [0.0, 1.0, 2.8, 3.1, 3.7, 1e-7, 0.5000001],
    -np.linspace(0.05, 3.0, 12),
]))
KIND = {"pil_color": "Color", "pil_contrast": "Contrast"}


def tiles(n: int, h: int, w: int) -> np.ndarray:
    """Half smooth, half photo-like (smooth only below 16 pixels: the photos' shapes need room), one row of
    full-range noise in each (every luma rounding case)."""
    photos = n // 2 if min(h, w) >= 16 else 0
    t = smooth_tiles(n - photos, h, w, seed=5)
    if photos:
        t = np.concatenate([t, photo_tiles(photos, h, w, seed=6)])
    t[:, h // 2] = np.random.default_rng(h * w).integers(0, 256, (n, w, 3), dtype=np.uint8)
    return t


def plan_of(op: str, factors: np.ndarray, h: int, w: int, luma: int):
    b = PlanBuilder(np.tile([h, w], (factors.size, 1)))
    b.add(op, np.arange(factors.size), factor=factors, luma=np.full(factors.size, luma))
    return b.finish()


def model(op: str, tile: np.ndarray, factor: float, luma: int) -> np.ndarray:
    """PIL's arithmetic in numpy: ``(uint8)(d + (float)f * (v - d))`` in float32, clamped."""
    lum = luma_numpy(tile, luma)
    d = lum[..., None] if op == "pil_color" else np.full((1, 1, 1), int(lum.sum() / lum.size + 0.5))
    d = np.broadcast_to(d, tile.shape).astype(np.float32)
    v = d + np.float32(factor) * (tile.astype(np.float32) - d)
    return np.clip(v, 0, 255).astype(np.uint8)


def test_the_probe_names_the_installed_pils_luma():
    rgb = np.random.default_rng(1).integers(0, 256, (8, 1027, 3), dtype=np.uint8)
    assert np.array_equal(np.asarray(Image.fromarray(rgb).convert("L")), luma_numpy(rgb, pil_luma()))
    # the two lumas differ (else the probe could not tell them apart, and the variant tests below say nothing)
    assert not np.array_equal(luma_numpy(rgb, LUMA_PILLOW), luma_numpy(rgb, LUMA_SIMD))
    edge = np.array([[EDGE] * 5], np.uint8)
    assert luma_numpy(edge, LUMA_PILLOW).tolist() == [[17] * 5]
    assert luma_numpy(edge, LUMA_SIMD).tolist() == [[16, 16, 16, 16, 17]]  # the tail: Pillow's


@pytest.mark.parametrize("hw", [(40, 56), (37, 53), (3, 5), (9, 130)])
@pytest.mark.parametrize("op", sorted(KIND))
def test_every_engine_is_pils_imageenhance_at_every_factor(op, hw):
    h, w = hw
    t = tiles(FACTORS.size, h, w)
    plan = plan_of(op, FACTORS, h, w, pil_luma())
    native = run_native(t.copy(), plan)
    torch_out = run_torch(to_batch(t), plan).permute(0, 2, 3, 1).numpy()
    changed = 0
    for k, f in enumerate(FACTORS.tolist()):
        theirs = np.asarray(getattr(ImageEnhance, KIND[op])(Image.fromarray(t[k])).enhance(f))
        for engine, got in (("native", native[k]), ("torch", torch_out[k]), ("pil", run_pil(t[k], plan, k))):
            d = np.abs(got.astype(np.int64) - theirs)
            assert d.max() == 0, f"{engine} {op} factor {f!r} on {h}x{w}: {int((d > 0).sum())} values off, max {d.max()}"
        assert np.array_equal(model(op, t[k], f, pil_luma()), theirs), (op, f)
        changed += not np.array_equal(theirs, t[k])
    assert changed > FACTORS.size - 5  # all but factor 1 (and a flat tile here and there)


@pytest.mark.parametrize("op", sorted(KIND))
def test_the_other_luma_is_the_model_of_pils_arithmetic(op):
    """The luma the installed PIL does not compute, in the native (both SIMD paths: test_augment_native.py's
    probe) and torch kernels, against the model the test above holds to PIL."""
    other = LUMA_SIMD if pil_luma() == LUMA_PILLOW else LUMA_PILLOW
    h, w = 37, 53
    t = tiles(FACTORS.size, h, w)
    plan = plan_of(op, FACTORS, h, w, other)
    native = run_native(t.copy(), plan)
    torch_out = run_torch(to_batch(t), plan).permute(0, 2, 3, 1).numpy()
    for k, f in enumerate(FACTORS.tolist()):
        want = model(op, t[k], f, other)
        assert np.array_equal(native[k], want) and np.array_equal(torch_out[k], want), (op, f)


@pytest.mark.parametrize("name, m", [("Color", 15.0), ("Contrast", 20.0), ("Color", 20.0), ("ContrastIncreasing", 9.0),
                                     ("ColorIncreasing", 3.0)])
def test_timms_ops_with_a_large_mmax_are_pils(name, m):
    """timm's ``rand-m15-mmax20``: Color at magnitude 15 is a factor of 2.8, Contrast at 20 one of 3.7 (torchvision's
    kernels were 2-3 levels off PIL there)."""
    n, h, w = 6, 40, 56
    t = tiles(n, h, w)
    b = PlanBuilder(np.tile([h, w], (n, 1)))
    op = TimmOp(name, 1.0, m, magnitude_max=20.0)
    negate = np.arange(n) % 2 == 1
    op.apply(b, np.arange(n), np.full(n, m), negate, np.zeros(n, bool))
    plan = b.finish()
    (step,) = plan.steps
    native = run_native(t.copy(), plan)
    for k in range(n):
        f = float(step.params["factor"][k])
        theirs = np.asarray(getattr(ImageEnhance, name.replace("Increasing", ""))(Image.fromarray(t[k])).enhance(f))
        assert np.array_equal(native[k], theirs), (name, f, int(np.abs(native[k].astype(int) - theirs).max()))


def test_a_bad_luma_is_refused_before_any_pixel_changes():
    t = tiles(2, 8, 8)
    plan = plan_of("pil_color", np.array([2.0, 3.0]), 8, 8, 2)
    before = t.copy()
    with pytest.raises(ValueError, match=r"pil_color.*luma 2 should be 0 \(Pillow's\) or 1 \(pillow-simd's\)"):
        run_native(t, plan)
    assert np.array_equal(t, before)


def test_the_torch_kernels_refuse_float_rows():
    plan = plan_of("pil_contrast", np.array([2.0]), 8, 8, pil_luma())
    with pytest.raises(TypeError, match="the pil_contrast operation runs on uint8 images only"):
        run_torch(torch.rand(1, 3, 8, 8), plan)


def test_a_pil_with_another_luma_is_said_once_and_gets_pillows(monkeypatch):
    real = Image.Image.convert

    def shifted(self, mode=None, *args, **kw):  # a convert("L") neither Pillow's nor Pillow-SIMD's
        out = real(self, mode, *args, **kw)
        return Image.fromarray(np.asarray(out) ^ 1) if mode == "L" else out

    monkeypatch.setattr(Image.Image, "convert", shifted)
    pil_luma.cache_clear()
    try:
        with pytest.warns(UserWarning, match=r"convert\('L'\) .* matches neither Pillow's nor Pillow-SIMD's"):
            assert pil_luma() == LUMA_PILLOW
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert pil_luma() == LUMA_PILLOW  # probed once
    finally:
        pil_luma.cache_clear()  # the next caller probes the real PIL again
