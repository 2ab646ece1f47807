"""The AVX2 bilinear and bicubic warps (csrc/warp.cc: four output pixels at a time in doubles) write the bytes of
the scalar walk and of PIL's ``Image.transform(AFFINE)``, on maps that test_augment_warp.py's transforms do not
draw: any rotation, scale, shear and fractional translation, maps reaching far outside the tile, tiles narrower
than four pixels and widths that leave a remainder, in which the groups of four go through the edge path (some
sample points outside the tile) and the remainder through the scalar walk.

Put back in turn, each of these fails them (7 of the 18 tests): the lower bilinear row not clamped to the tile, the
bicubic clip at 255 left out. (Reordering a rounding, e.g. ``a0 * xc + (a1 * yc + a2)`` or ``a * (1 - dx) + b * dx``,
changed no byte of 2.4 million on 224 x 224 photo tiles: these tests cannot see it, and nor would a user.)
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from augment_common import photo_tiles
from simd_common import assert_simd_levels_agree
from fastload._augment.engine_native import run_native
from fastload._augment.engine_pil import run_pil
from fastload._augment.plan import BICUBIC, BILINEAR, PlanBuilder

_C = pytest.importorskip("fastload._C")


def random_maps(n: int, h: int, w: int, seed: int) -> np.ndarray:
    """(n, 2, 3) inverse affine maps about the tile's centre: rotations of any angle, scales 0.3-3, shears, shifts
    up to the tile's size with fractional parts; every 5th a plain fractional translation, every 7th the identity."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, 2, 3))
    for i in range(n):
        t = np.radians(rng.uniform(-180, 180))
        s, sh = rng.uniform(0.3, 3.0, 2), rng.uniform(-0.6, 0.6, 2)
        rotation = np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]])
        m = rotation @ np.diag(s) @ np.array([[1, sh[0]], [sh[1], 1]])
        shift = rng.uniform(-1, 1, 2) * (w, h)
        if i % 5 == 4:
            m = np.eye(2)
            shift = rng.uniform(-0.3, 0.3, 2) * (w, h)
        if i % 7 == 6:
            m, shift = np.eye(2), np.zeros(2)
        c = np.array([w / 2.0, h / 2.0])
        out[i, :, :2] = m
        out[i, :, 2] = c - m @ c + shift
    return out


def warp_plan(n: int, h: int, w: int, interpolation: int, seed: int):
    b = PlanBuilder(np.tile([h, w], (n, 1)))
    b.affine(np.arange(n), random_maps(n, h, w, seed), interpolation, np.array([7.0, 250.0, 128.0]))
    return b.finish()


SIZES = [(1, 1), (1, 6), (2, 3), (5, 4), (9, 13), (31, 17), (48, 64), (23, 101)]


@pytest.mark.parametrize("interpolation", [BILINEAR, BICUBIC], ids=["bilinear", "bicubic"])
@pytest.mark.parametrize("hw", SIZES, ids=[f"{h}x{w}" for h, w in SIZES])
def test_warp_equals_pil(interpolation, hw):
    h, w = hw
    n = 24
    tiles = photo_tiles(n, max(h, 16), max(w, 16), seed=h * 131 + w)[:, :h, :w].copy()
    plan = warp_plan(n, h, w, interpolation, seed=h * 7 + w)
    ref = np.stack([run_pil(tiles[i], plan, i) for i in range(n)])
    out = run_native(tiles.copy(), plan)
    worst = np.abs(out.astype(int) - ref).max()
    assert np.array_equal(out, ref), f"{int((out != ref).sum())} bytes differ, max {worst}"


def test_warp_of_an_extreme_image_equals_pil():
    """Black/white checkerboards: the bicubic overshoots past 0 and 255 and is clipped there."""
    n, h, w = 16, 40, 52
    y, x = np.mgrid[0:h, 0:w]
    board = np.where(((y // 2) + (x // 3)) % 2 == 0, 255, 0).astype(np.uint8)
    tiles = np.repeat(np.stack([board, 255 - board, board], -1)[None], n, 0).copy()
    for interpolation in (BILINEAR, BICUBIC):
        plan = warp_plan(n, h, w, interpolation, seed=3)
        ref = np.stack([run_pil(tiles[i], plan, i) for i in range(n)])
        assert np.array_equal(run_native(tiles.copy(), plan), ref)


PROBE = """
import hashlib, numpy as np
from test_warp_simd import SIZES, photo_tiles, run_native, warp_plan, BILINEAR, BICUBIC
h = hashlib.sha256()
for hh, ww in SIZES + [(224, 224), (176, 176)]:
    tiles = photo_tiles(6, max(hh, 16), max(ww, 16), seed=3)[:, :hh, :ww].copy()
    for interpolation in (BILINEAR, BICUBIC):
        h.update(run_native(tiles.copy(), warp_plan(6, hh, ww, interpolation, seed=hh + ww)).tobytes())
print(h.hexdigest())
"""


def test_the_avx2_and_scalar_warps_write_the_same_bytes():
    """FASTLOAD_SIMD=scalar runs the scalar walk alone; the default the AVX2 kernels (where the CPU has AVX2)."""
    assert_simd_levels_agree(PROBE, cwd=os.path.dirname(os.path.abspath(__file__)))
