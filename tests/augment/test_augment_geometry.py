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
