"""The crop plan's own geometric transforms, under torchvision's (v1) names, defaults and semantics:
RandomResizedCrop, Resize, CenterCrop and RandomHorizontalFlip. Each folds into the batch's virtual images
(``crop_plan._State``, see "Composition" in ``fastload/transforms.py``'s docstring), never touching pixels;
exported from ``fastload.transforms``."""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import numpy as np

from .._augment.random_crop import padded_window
from .._augment.random_resize import check_resize as _interpolation
from .base import Transform, _positive_int, _setup_size
from .crop_plan import _State

_ATTEMPTS = 10  # torchvision's RandomResizedCrop.get_params tries 10 boxes before its fallback


def _min_max(value: Any, what: str) -> tuple[float, float]:
    """A ``(min, max)`` pair of numbers, e.g. RandomResizedCrop's ``scale``; its order is checked by the caller."""
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        try:
            return (float(value[0]), float(value[1]))
        except (TypeError, ValueError):
            pass
    raise TypeError(f"{what}={value!r} should be a (min, max) pair of numbers")


class RandomResizedCrop(Transform):
    """Crop a random area and aspect ratio, then resize to ``size`` (torchvision's algorithm).

    ``interpolation``: "bilinear", "bicubic" (PIL's, antialiased), or "random": each sample bilinear or bicubic
    with probability 1/2 (timm's ``RandomResizedCropAndInterpolation(interpolation='random')``), one more draw per
    sample after the crop's."""

    def __init__(
        self,
        size: int | Sequence[int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        interpolation: Any = "bilinear",
        antialias: bool = True,
    ) -> None:
        self.size = _setup_size(size, "RandomResizedCrop")
        self.scale = _min_max(scale, "RandomResizedCrop: scale")
        self.ratio = _min_max(ratio, "RandomResizedCrop: ratio")
        if not 0.0 <= self.scale[0] <= self.scale[1]:
            raise ValueError(f"RandomResizedCrop: scale={scale!r} must be (min, max) with 0 <= min <= max")
        if not 0.0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"RandomResizedCrop: ratio={ratio!r} must be (min, max) with 0 < min <= max")
        self.interpolation = _interpolation(interpolation, antialias, "RandomResizedCrop", random=True)
        self.antialias = True

    def _params(self) -> dict[str, Any]:
        return {
            "size": list(self.size),
            "scale": list(self.scale),
            "ratio": list(self.ratio),
            "interpolation": self.interpolation,
            "antialias": self.antialias,
        }

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self.size}, scale={tuple(round(s, 4) for s in self.scale)}, "
            f"ratio={tuple(round(r, 4) for r in self.ratio)}, interpolation={self.interpolation}, "
            f"antialias={self.antialias})"
        )

    def _apply(self, state: _State, rng: np.random.Generator) -> None:
        if state.checking:  # any image takes it (its fallback is the whole image): only the output size matters
            state.sized(self.size)
            return
        top, left, h, w, _ = _rrc_params(state.h, state.w, self.scale, self.ratio, rng)
        state.crop(top, left, h, w)
        mode: Any = self.interpolation
        if mode == "random":  # timm: random.choice((BILINEAR, BICUBIC)) per image
            mode = rng.integers(0, 2, size=h.shape[0]).astype(np.uint8)
        state.resize(np.full_like(h, self.size[0]), np.full_like(w, self.size[1]), mode)

    def _static_size(self, hw: tuple[int, int] | None) -> tuple[int, int] | None:
        return self.size


def _rrc_params(
    height: np.ndarray,
    width: np.ndarray,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """torchvision's ``RandomResizedCrop.get_params`` for a batch: (top, left, h, w, fell_back).

    All 10 attempts are drawn for every sample at once (2 x (n, 10) uniforms), the first valid one per
    row wins; rows with none take the centre-crop fallback. Then one position draw per sample.
    """
    n = height.shape[0]
    area = (height * width).astype(np.float64)[:, None]
    u_area = rng.random((n, _ATTEMPTS))
    u_ratio = rng.random((n, _ATTEMPTS))
    target = area * (scale[0] + (scale[1] - scale[0]) * u_area)
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(lo + (hi - lo) * u_ratio)
    ws = np.rint(np.sqrt(target * aspect)).astype(np.int64)  # rint: half to even, like round()
    hs = np.rint(np.sqrt(target / aspect)).astype(np.int64)
    ok = (ws > 0) & (ws <= width[:, None]) & (hs > 0) & (hs <= height[:, None])
    found = ok.any(axis=1)
    first = ok.argmax(axis=1)
    rows = np.arange(n)
    h, w = hs[rows, first], ws[rows, first]
    # Fallback: centre crop at the nearest allowed aspect ratio (or the whole image).
    in_ratio = width / height
    too_tall, too_wide = in_ratio < ratio[0], in_ratio > ratio[1]
    fb_h = np.where(too_tall, np.rint(width / ratio[0]).astype(np.int64), height)
    fb_w = np.where(too_wide, np.rint(height * ratio[1]).astype(np.int64), width)
    h, w = np.where(found, h, fb_h), np.where(found, w, fb_w)
    top = rng.integers(0, height - h + 1)
    left = rng.integers(0, width - w + 1)
    top = np.where(found, top, (height - h) // 2)
    left = np.where(found, left, (width - w) // 2)
    return top, left, h, w, ~found


def _resized_hw(
    height: np.ndarray, width: np.ndarray, size: tuple[int, ...], max_size: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """torchvision's ``_compute_resized_output_size``, vectorized; returns (new_h, new_w)."""
    if len(size) == 2:
        return np.full_like(height, size[0]), np.full_like(width, size[1])
    short, long = np.minimum(height, width), np.maximum(height, width)
    new_short = np.full_like(short, size[0])
    new_long = np.floor(size[0] * long / short).astype(np.int64)  # int(s * long / short)
    if max_size is not None:
        over = new_long > max_size
        new_short = np.where(over, np.floor(max_size * new_short / new_long).astype(np.int64), new_short)
        new_long = np.where(over, max_size, new_long)
    portrait = width <= height
    return np.where(portrait, new_long, new_short), np.where(portrait, new_short, new_long)


class Resize(Transform):
    """Resize: int ``size`` -> shorter side becomes ``size`` (longer capped by ``max_size``); (h, w) exact."""

    def __init__(
        self,
        size: int | Sequence[int],
        interpolation: Any = "bilinear",
        max_size: int | None = None,
        antialias: bool = True,
    ) -> None:
        if isinstance(size, Sequence) and not isinstance(size, str):
            if len(size) not in (1, 2):
                raise ValueError(f"Resize: size={size!r} must be an int, [int] or (h, w)")
            self.size: int | tuple[int, ...] = tuple(_positive_int(s, "Resize size") for s in size)
            self._size = self.size
        else:
            self.size = _positive_int(size, "Resize size")
            self._size = (self.size,)
        self.max_size = None if max_size is None else _positive_int(max_size, "Resize max_size")
        if self.max_size is not None:
            if len(self._size) != 1:
                raise ValueError(
                    f"Resize: max_size={max_size} is only allowed when size is an int "
                    f"(the shorter side), got size={size!r}"
                )
            if self.max_size <= self._size[0]:
                raise ValueError(
                    f"Resize: max_size={max_size} must be strictly greater than the "
                    f"requested shorter side size={self._size[0]}"
                )
        self.interpolation = _interpolation(interpolation, antialias, "Resize")
        self.antialias = True

    def _params(self) -> dict[str, Any]:
        size = self.size if isinstance(self.size, int) else list(self.size)
        return {
            "size": size,
            "interpolation": self.interpolation,
            "max_size": self.max_size,
            "antialias": self.antialias,
        }

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self.size}, interpolation={self.interpolation}, "
            f"max_size={self.max_size}, antialias={self.antialias})"
        )

    def _apply(self, state: _State, rng: np.random.Generator) -> None:
        nh, nw = _resized_hw(state.h, state.w, self._size, self.max_size)
        keep = state.refuse(
            self,
            (nh <= 0) | (nw <= 0),
            "a result of at least one pixel per side",
            lambda i: f"{state.describe(i)}, which it would make {int(nh[i])}x{int(nw[i])}",
            "raise max_size, or leave such images (extreme aspect ratios) out of the dataset",
        )
        if keep is not None:
            nh, nw = nh[keep], nw[keep]
        state.resize(nh, nw, self.interpolation)

    def _static_size(self, hw: tuple[int, int] | None) -> tuple[int, int] | None:
        if len(self._size) == 2:
            return (self._size[0], self._size[1])
        if hw is None:
            return None
        nh, nw = _resized_hw(np.array([hw[0]]), np.array([hw[1]]), self._size, self.max_size)
        return (int(nh[0]), int(nw[0]))


class CenterCrop(Transform):
    """Crop the centre ``size`` (int or (h, w)); an image smaller than that is zero-padded first, as torchvision's
    ``F.center_crop`` pads it (``(crop - size) // 2`` pixels before, the rest after), masks with 0 too."""

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _setup_size(size, "CenterCrop")

    def _params(self) -> dict[str, Any]:
        return {"size": list(self.size)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size})"

    def _apply(self, state: _State, rng: np.random.Generator) -> None:
        ch, cw = self.size
        small = (state.h < ch) | (state.w < cw)
        later = next((t for t in state.rest if not isinstance(t, RandomHorizontalFlip)), None)
        if later is not None:  # the padded window is the tile: nothing may resample or crop it after
            keep = state.refuse(
                self,
                small,
                f"an image of at least {ch}x{cw} (h x w) at this step when {later!r} follows it",
                state.describe,
                f"torchvision would zero-pad, which fastload does only when nothing but "
                f"RandomHorizontalFlip follows CenterCrop among the crops and resizes; put a Resize of at least "
                f"the crop size before CenterCrop, or move {later!r} before it",
            )
            if keep is not None:
                small = small[keep]
        # torchvision: pad (crop - size) // 2 before (then crop at 0 in the padded image), else crop at the centre
        top = np.where(state.h < ch, -((ch - state.h) // 2), np.rint((state.h - ch) / 2.0)).astype(np.int64)
        left = np.where(state.w < cw, -((cw - state.w) // 2), np.rint((state.w - cw) / 2.0)).astype(np.int64)
        if not small.any():
            state.crop(top, left, np.full_like(top, ch), np.full_like(left, cw))
            return
        if state.checking:  # only flips follow: the window's size is all the check needs (not its index maps)
            state.sized(self.size, padded=True)
            return
        padded_window(state, top, left, (ch, cw), (state.h, state.w), "constant", np.zeros(3), 0)

    def _static_size(self, hw: tuple[int, int] | None) -> tuple[int, int] | None:
        return self.size


class RandomHorizontalFlip(Transform):
    """Mirror left-right with probability ``p`` (one uniform draw per sample)."""

    p: float

    def __init__(self, p: float = 0.5) -> None:
        if isinstance(p, bool) or not isinstance(p, numbers.Real):
            raise TypeError(f"RandomHorizontalFlip: p={p!r} should be a probability (a number in [0, 1])")
        self.p = float(p)
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"RandomHorizontalFlip: p={p!r} must be in [0, 1]")

    def _params(self) -> dict[str, Any]:
        return {"p": self.p}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(p={self.p})"

    def _apply(self, state: _State, rng: np.random.Generator) -> None:
        state.flip ^= rng.random(state.h.shape[0]) < self.p
