"""The policies' affine matrices are the ones torchvision's PIL backend uses (the engine tests only show that
both engines execute the same matrix; these show it is the right one)."""

from __future__ import annotations

import numpy as np
from PIL import Image

from augment_common import H, W, photo_tiles
from fastload._augment import geometry as G
from fastload._augment.engine_pil import run_pil
from fastload._augment.plan import NEAREST, PlanBuilder


def _run(tile, matrix, fill=(0, 0, 0)):
    b = PlanBuilder(np.array([[tile.shape[0], tile.shape[1]]]))
    b.affine(np.arange(1), matrix, NEAREST, np.asarray(fill, dtype=float))
    return run_pil(tile, b.finish(), 0)


def test_rotate_is_pils_rotate_about_the_centre():
    """torchvision's Rotate (F.rotate on a PIL image) is ``Image.rotate(angle, NEAREST, fillcolor=fill)``."""
    tile = photo_tiles(1)[0]
    for angle in (-135.0, -30.0, 9.0, 45.0, 100.5):
        ours = _run(tile, G.rotate(np.array([angle]), np.array([[H, W]])), fill=(3, 4, 5))
        ref = np.asarray(Image.fromarray(tile).rotate(angle, Image.NEAREST, fillcolor=(3, 4, 5)))
        assert np.mean(ours != ref) <= 1e-3, angle  # PIL rounds its matrix to 15 digits: rare edge ties


def test_shear_and_translate_matrices_are_torchvisions():
    """ShearX(m): about (0, 0) with shear degrees(atan(m)) -> input x = x + m*y; TranslateX(t): x - int(t)."""
    m = np.array([0.3, -0.99])
    assert np.allclose(G.shear(m, 0), [[[1, 0.3, 0], [0, 1, 0]], [[1, -0.99, 0], [0, 1, 0]]])
    assert np.allclose(G.shear(m, 1), [[[1, 0, 0], [0.3, 1, 0]], [[1, 0, 0], [-0.99, 1, 0]]])
    hw = np.array([[H, W], [H, W]])
    assert np.allclose(G.translate(np.array([12.9, -7.5]), 0, hw), [[[1, 0, -12], [0, 1, 0]], [[1, 0, 7], [0, 1, 0]]])
    assert np.allclose(G.translate(np.array([3.2, 0.0]), 1, hw), [[[1, 0, 0], [0, 1, -3]], [[1, 0, 0], [0, 1, 0]]])


def test_translate_moves_the_picture_right_and_fills():
    tile = photo_tiles(1)[0]
    out = _run(tile, G.translate(np.array([5.0]), 0, np.array([[H, W]])), fill=(9, 9, 9))
    assert np.array_equal(out[:, 5:], tile[:, :-5]) and (out[:, :5] == 9).all()


def test_inverse_affine_undoes_the_forward_map():
    """Compose torchvision's forward map (T C R Sh S C^-1) with the inverse we build: identity."""
    rng = np.random.default_rng(0)
    k = 20
    center, angle, tr = rng.uniform(0, 50, (k, 2)), rng.uniform(-180, 180, k), rng.uniform(-9, 9, (k, 2))
    scale, shear = rng.uniform(0.5, 2, k), rng.uniform(-30, 30, (k, 2))
    inv = G.inverse_affine(center, angle, tr, scale, shear)
    for i in range(k):
        rot, sx, sy = np.radians(angle[i]), np.radians(shear[i, 0]), np.radians(shear[i, 1])
        rss = np.array([[np.cos(rot - sy) / np.cos(sy), -np.cos(rot - sy) * np.tan(sx) / np.cos(sy) - np.sin(rot)],
                        [np.sin(rot - sy) / np.cos(sy), -np.sin(rot - sy) * np.tan(sx) / np.cos(sy) + np.cos(rot)]])
        fwd = np.eye(3)
        fwd[:2, :2] = rss * scale[i]
        c = np.eye(3)
        c[:2, 2] = center[i]
        t = np.eye(3)
        t[:2, 2] = tr[i]
        forward = t @ c @ fwd @ np.linalg.inv(c)
        back = np.vstack([inv[i], [0, 0, 1]])
        assert np.allclose(back @ forward, np.eye(3), atol=1e-9)


def test_random_rotation_is_pils_rotate_by_a_uniform_angle():
    from augment_common import ks_critical, ks_uniform
    from fastload._augment.plan import plan_batch

    n = 3000
    plan = plan_batch([G.RandomRotation((-20, 50), fill=[1, 2, 3])], np.tile([H, W], (n, 1)), np.random.default_rng(0))
    m = plan.geometry.affine
    # PIL's rotate matrix is [cos r, sin r, ., -sin r, cos r, .] with r = -radians(angle).
    angle = np.degrees(np.arctan2(-m[:, 0, 1], m[:, 0, 0]))
    assert np.allclose(m[:, 0, 0], m[:, 1, 1]) and np.allclose(m[:, 0, 1], -m[:, 1, 0])
    assert ks_uniform(angle, -20, 50) < ks_critical(n)
    tile = photo_tiles(1)[0]
    for i in range(5):
        ours = run_pil(tile, plan, i)
        ref = np.asarray(Image.fromarray(tile).rotate(angle[i], Image.NEAREST, fillcolor=(1, 2, 3)))
        assert np.mean(ours != ref) <= 1e-3


def test_random_affine_draws_like_torchvision():
    from augment_common import ks_critical, ks_uniform
    from fastload._augment.plan import plan_batch

    n = 3000
    t = G.RandomAffine(degrees=0, translate=(0.1, 0.2), scale=(0.8, 1.2), shear=(-5, 5, -10, 10))
    seen = {}
    real = G.inverse_affine

    def spy(center, angle, tr, scale, shear):
        seen.update(center=center, angle=angle, tr=tr, scale=scale, shear=shear)
        return real(center, angle, tr, scale, shear)

    G.inverse_affine = spy
    try:
        t.plan(PlanBuilder(np.tile([H, W], (n, 1))), np.arange(n), np.random.default_rng(1))
    finally:
        G.inverse_affine = real
    assert np.array_equal(seen["tr"], np.rint(seen["tr"]))  # whole pixels
    assert np.abs(seen["tr"][:, 0]).max() <= round(0.1 * W) and np.abs(seen["tr"][:, 1]).max() <= round(0.2 * H)
    assert ks_uniform(seen["scale"], 0.8, 1.2) < ks_critical(n)
    assert ks_uniform(seen["shear"][:, 0], -5, 5) < ks_critical(n)
    assert ks_uniform(seen["shear"][:, 1], -10, 10) < ks_critical(n)
    assert np.allclose(seen["center"], [W / 2, H / 2]) and (seen["angle"] == 0).all()
    plan = plan_batch([t], np.tile([H, W], (2, 1)), np.random.default_rng(1))
    assert plan.geometry.has_affine.all()


def test_expand_and_bad_geometry_arguments_are_refused():
    import pytest

    with pytest.raises(ValueError, match="expand=True gives each sample its own output size"):
        G.RandomRotation(10, expand=True)
    with pytest.raises(ValueError, match=r"translate=\(0.1, 2\) should be \(fx, fy\), fractions in \[0, 1\]"):
        G.RandomAffine(0, translate=(0.1, 2))
    with pytest.raises(ValueError, match="degrees=-3: if it is a single number, it must be positive"):
        G.RandomAffine(-3)
    with pytest.raises(TypeError, match="shear=.1, 2, 3. should be a number or a sequence of 2 or 4 numbers"):
        G.RandomAffine(0, shear=(1, 2, 3))
    with pytest.raises(TypeError, match=r"center='middle' should be None or an \(x, y\) pair"):
        G.RandomRotation(5, center="middle")
