"""Geometry of the plan: torchvision's inverse affine matrix, flips, and the policies' affine operations.

Matrices map output pixel coordinates to input pixel coordinates of the tile, in PIL's convention (pixel
``(x, y)`` covers ``[x, x+1) x [y, y+1)``, so its centre is ``(x + 0.5, y + 0.5)``) — what
``Image.transform(size, AFFINE, data)`` takes, and what torchvision's PIL backend builds with
``_get_inverse_affine_matrix`` around an absolute centre (the image centre ``(w/2, h/2)`` unless given).
The policies use: ShearX/ShearY about the corner ``(0, 0)`` with shear ``degrees(atan(m))``; TranslateX/Y by
``int(m)`` pixels; Rotate by ``m`` degrees counter-clockwise about the centre (``F.rotate``, i.e. the affine
formula with ``-angle``, which is PIL's ``Image.rotate`` matrix).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .plan import Augment, PlanBuilder, check_interpolation, check_p
from .type_fill import split_fill

__all__ = [
    "RandomAffine",
    "RandomHorizontalFlip",
    "RandomRotation",
    "RandomVerticalFlip",
    "inverse_affine",
    "rotate",
    "shear",
    "translate",
]


def inverse_affine(
    center: np.ndarray, angle: np.ndarray, translate_xy: np.ndarray, scale: np.ndarray, shear_xy: np.ndarray
) -> np.ndarray:
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


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _symmetric(value: Any, what: str, sizes: tuple[int, ...] = (2,)) -> tuple[float, ...]:
    """torchvision's ``_setup_angle``: a number d >= 0 means (-d, d); else a sequence of one of ``sizes``."""
    if _is_number(value):
        if value < 0:
            raise ValueError(f"{what}={value!r}: if it is a single number, it must be positive")
        return (-float(value), float(value))
    if isinstance(value, (list, tuple)) and len(value) in sizes and all(_is_number(v) for v in value):
        out = tuple(float(v) for v in value)
        if any(out[i] > out[i + 1] for i in range(0, len(out), 2)):
            raise ValueError(f"{what}={value!r} should be (min, max) pairs with min <= max")
        return out
    raise TypeError(f"{what}={value!r} should be a number or a sequence of {' or '.join(map(str, sizes))} numbers")


def _center(center: Any, what: str) -> tuple[float, float] | None:
    if center is None:
        return None
    if isinstance(center, (list, tuple)) and len(center) == 2 and all(_is_number(v) for v in center):
        return (float(center[0]), float(center[1]))
    raise TypeError(f"{what}: center={center!r} should be None or an (x, y) pair of pixel coordinates")


def _centers_or(center: tuple[float, float] | None, hw: np.ndarray) -> np.ndarray:
    return _centers(hw) if center is None else np.tile(center, (hw.shape[0], 1))


class _RandomGeometric(Augment):
    def _setup(self, interpolation: Any, fill: Any, center: Any) -> None:
        name = type(self).__name__
        self._interp = check_interpolation(interpolation, name)
        self.interpolation = "nearest" if self._interp == 0 else "bilinear"
        self.fill = fill
        self._fill, self._mask_fill = split_fill(fill, name)  # the image's, a mask's (type_fill.py)
        self.center = _center(center, name)


class RandomRotation(_RandomGeometric):
    """Rotate counter-clockwise by an angle drawn uniformly from ``degrees`` (d -> (-d, d)), about the tile's
    centre or ``center`` (x, y), keeping the size. ``expand=True`` is refused: a batch keeps one tile size."""

    def __init__(
        self, degrees: Any, interpolation: Any = "nearest", expand: bool = False, center: Any = None, fill: Any = 0
    ) -> None:
        self.degrees = _symmetric(degrees, "RandomRotation: degrees")
        if expand:
            raise ValueError(
                "RandomRotation: expand=True gives each sample its own output size, which a batch "
                "cannot hold; use expand=False (and a Resize/crop before it for the margins)"
            )
        self.expand = False
        self._setup(interpolation, fill, center)

    def _params(self) -> dict[str, Any]:
        return {
            "degrees": self.degrees,
            "interpolation": self.interpolation,
            "expand": self.expand,
            "center": self.center,
            "fill": self.fill,
        }

    def plan(self, b: PlanBuilder, index: np.ndarray, rng: np.random.Generator) -> None:
        angle = rng.uniform(self.degrees[0], self.degrees[1], index.size)
        hw = b.out_hw[index]
        k = index.size
        m = inverse_affine(_centers_or(self.center, hw), -angle, _zeros2(k), np.ones(k), _zeros2(k))
        b.affine(index, m, self._interp, self._fill, self._mask_fill)


class RandomAffine(_RandomGeometric):
    """torchvision's RandomAffine: angle from ``degrees``, translation ``round(U(-t*W, t*W))`` pixels, scale
    from ``scale``, shear x from ``shear[:2]`` and y from ``shear[2:]`` (a number s means x in (-s, s))."""

    def __init__(
        self,
        degrees: Any,
        translate: Any = None,
        scale: Any = None,
        shear: Any = None,
        interpolation: Any = "nearest",
        fill: Any = 0,
        center: Any = None,
    ) -> None:
        self.degrees = _symmetric(degrees, "RandomAffine: degrees")
        if translate is not None:
            if not (
                isinstance(translate, (list, tuple))
                and len(translate) == 2
                and all(_is_number(v) and 0.0 <= v <= 1.0 for v in translate)
            ):
                raise ValueError(f"RandomAffine: translate={translate!r} should be (fx, fy), fractions in [0, 1]")
            translate = (float(translate[0]), float(translate[1]))
        self.translate = translate
        if scale is not None:
            if not (
                isinstance(scale, (list, tuple))
                and len(scale) == 2
                and all(_is_number(v) and v > 0 for v in scale)
                and scale[0] <= scale[1]
            ):
                raise ValueError(f"RandomAffine: scale={scale!r} should be (min, max), positive, min <= max")
            scale = (float(scale[0]), float(scale[1]))
        self.scale = scale
        self.shear = None if shear is None else _symmetric(shear, "RandomAffine: shear", sizes=(2, 4))
        self._setup(interpolation, fill, center)

    def _params(self) -> dict[str, Any]:
        return {
            "degrees": self.degrees,
            "translate": self.translate,
            "scale": self.scale,
            "shear": self.shear,
            "interpolation": self.interpolation,
            "fill": self.fill,
            "center": self.center,
        }

    def plan(self, b: PlanBuilder, index: np.ndarray, rng: np.random.Generator) -> None:
        k = index.size
        hw = b.out_hw[index].astype(np.float64)
        angle = rng.uniform(self.degrees[0], self.degrees[1], k)
        tr = _zeros2(k)
        if self.translate is not None:
            max_dx, max_dy = self.translate[0] * hw[:, 1], self.translate[1] * hw[:, 0]
            tr[:, 0] = np.rint(rng.uniform(-max_dx, max_dx))  # int(round(...)): half to even
            tr[:, 1] = np.rint(rng.uniform(-max_dy, max_dy))
        scale = np.ones(k) if self.scale is None else rng.uniform(self.scale[0], self.scale[1], k)
        sh = _zeros2(k)
        if self.shear is not None:
            sh[:, 0] = rng.uniform(self.shear[0], self.shear[1], k)
            if len(self.shear) == 4:
                sh[:, 1] = rng.uniform(self.shear[2], self.shear[3], k)
        m = inverse_affine(_centers_or(self.center, b.out_hw[index]), angle, tr, scale, sh)
        b.affine(index, m, self._interp, self._fill, self._mask_fill)
