"""Geometry of the plan: torchvision's inverse affine matrix, flips, and the policies' affine operations.

status: groundwork for issue 21, not wired into the loader yet.

Matrices map output pixel coordinates to input pixel coordinates of the tile, in PIL's convention (pixel
``(x, y)`` covers ``[x, x+1) x [y, y+1)``, so its centre is ``(x + 0.5, y + 0.5)``) — what
``Image.transform(size, AFFINE, data)`` takes, and what torchvision's PIL backend builds with
``_get_inverse_affine_matrix`` around an absolute centre (the image centre ``(w/2, h/2)`` unless given).
The policies use: ShearX/ShearY about the corner ``(0, 0)`` with shear ``degrees(atan(m))``; TranslateX/Y by
``int(m)`` pixels; Rotate by ``m`` degrees counter-clockwise about the centre (``F.rotate``, i.e. the affine
formula with ``-angle``, which is PIL's ``Image.rotate`` matrix).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .plan import Augment, PlanBuilder, check_p

__all__ = ["RandomHorizontalFlip", "RandomVerticalFlip", "inverse_affine", "rotate", "shear", "translate"]


def inverse_affine(center: np.ndarray, angle: np.ndarray, translate_xy: np.ndarray, scale: np.ndarray,
                   shear_xy: np.ndarray) -> np.ndarray:
    """torchvision's ``_get_inverse_affine_matrix`` for k samples at once (angles and shears in degrees).

    The forward map is ``T * C * R(angle) * Shear * Scale * C^-1``; this returns its inverse as (k, 2, 3)."""
    rot = np.radians(np.asarray(angle, dtype=np.float64))
    sx, sy = np.radians(np.asarray(shear_xy, dtype=np.float64)).T
    cx, cy = np.asarray(center, dtype=np.float64).T
    tx, ty = np.asarray(translate_xy, dtype=np.float64).T
    scale = np.asarray(scale, dtype=np.float64)
    a = np.cos(rot - sy) / np.cos(sy)
    b = -np.cos(rot - sy) * np.tan(sx) / np.cos(sy) - np.sin(rot)
    c = np.sin(rot - sy) / np.cos(sy)
    d = -np.sin(rot - sy) * np.tan(sx) / np.cos(sy) + np.cos(rot)
    m = np.zeros((rot.size, 2, 3))
    m[:, 0, 0], m[:, 0, 1] = d / scale, -b / scale
    m[:, 1, 0], m[:, 1, 1] = -c / scale, a / scale
    m[:, 0, 2] = m[:, 0, 0] * (-cx - tx) + m[:, 0, 1] * (-cy - ty) + cx
    m[:, 1, 2] = m[:, 1, 0] * (-cx - tx) + m[:, 1, 1] * (-cy - ty) + cy
    return m


def _zeros2(k: int) -> np.ndarray:
    return np.zeros((k, 2))


def shear(magnitude: np.ndarray, axis: int) -> np.ndarray:
    """ShearX (axis 0) / ShearY (axis 1) as the policies apply it: about (0, 0), shear = degrees(atan(m))."""
    m = np.asarray(magnitude, dtype=np.float64)
    sh = _zeros2(m.size)
    sh[:, axis] = np.degrees(np.arctan(m))
    return inverse_affine(_zeros2(m.size), np.zeros(m.size), _zeros2(m.size), np.ones(m.size), sh)


def translate(pixels: np.ndarray, axis: int, hw: np.ndarray) -> np.ndarray:
    """TranslateX (axis 0) / TranslateY (axis 1) by ``int(m)`` pixels (truncated toward zero, as Python's int)."""
    t = np.trunc(np.asarray(pixels, dtype=np.float64))
    tr = _zeros2(t.size)
    tr[:, axis] = t
    return inverse_affine(_centers(hw), np.zeros(t.size), tr, np.ones(t.size), _zeros2(t.size))


def rotate(degrees: np.ndarray, hw: np.ndarray) -> np.ndarray:
    """Rotate counter-clockwise by ``degrees`` about the tile's centre, same size (torchvision's F.rotate)."""
    a = np.asarray(degrees, dtype=np.float64)
    return inverse_affine(_centers(hw), -a, _zeros2(a.size), np.ones(a.size), _zeros2(a.size))


def _centers(hw: np.ndarray) -> np.ndarray:
    hw = np.asarray(hw, dtype=np.float64)
    return np.stack([hw[:, 1] * 0.5, hw[:, 0] * 0.5], axis=1)


class RandomHorizontalFlip(Augment):
    """Mirror left-right with probability ``p`` (one uniform draw per sample)."""

    _horizontal = True

    def __init__(self, p: float = 0.5) -> None:
        self.p = check_p(p, type(self).__name__)

    def _params(self) -> dict[str, Any]:
        return {"p": self.p}

    def plan(self, b: PlanBuilder, index: np.ndarray, rng: np.random.Generator) -> None:
        b.flip(index[rng.random(index.size) < self.p], horizontal=self._horizontal)


class RandomVerticalFlip(RandomHorizontalFlip):
    """Mirror top-bottom with probability ``p`` (one uniform draw per sample)."""

    _horizontal = False
