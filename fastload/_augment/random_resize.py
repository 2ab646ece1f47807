"""``RandomResize`` (torchvision v2's), a crop-plan transform: each sample's shorter side resized to a size drawn
uniformly from ``[min_size, max_size)``, folded into the crop box and resize the decoder executes (as ``Resize``).

torchvision's segmentation reference starts with it (``RandomResize(0.5 * base, 2.0 * base)``, then a flip and a
``RandomCrop``): the output size varies per sample, so a fixed-size crop must follow for the images to batch; without
one the image field has no fixed output size and the loader leaves the fast path saying so (as for ``Resize(int)``).
Also here: the interpolation check the crop-plan transforms share (moved out of ``transforms.py``): bilinear or
bicubic (PIL's, csrc/resize.cc), and for ``RandomResizedCrop`` timm's per-sample "random".
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._transforms.base import Transform, _positive_int

__all__ = ["RESIZE_CODES", "RandomResize", "check_resize"]


#: a resize's interpolation, as the plan's per-sample ``interp`` codes it (csrc/resize.h ``ResizeFilter``)
RESIZE_CODES = {"bilinear": 0, "bicubic": 1}


def check_resize(interpolation: Any, antialias: Any, what: str, random: bool = False) -> str:
    """What the native engine resizes with: "bilinear" or "bicubic" (torchvision's InterpolationMode, whose
    ``.value`` is that name, or PIL's ``Resampling`` constants), antialiased as PIL resizes; with ``random`` also
    "random" (timm's ``RandomResizedCropAndInterpolation``: bilinear or bicubic per sample, uniformly), given as
    "random" or as the pair of modes timm stores for it. A mask following the image is resized NEAREST, as
    torchvision resizes masks."""
    modes = interpolation if isinstance(interpolation, (tuple, list)) else None
    if random and modes is not None and len(modes) == 2:
        names = {_mode_name(m) for m in modes}
        if names == {"bilinear", "bicubic"}:
            return "random"
    mode = None if modes is not None else _mode_name(interpolation)
    if mode == "random" and random:
        return mode
    if mode not in RESIZE_CODES:
        also = ", 'bicubic' or 'random' (bilinear or bicubic per sample)" if random else " or 'bicubic'"
        raise ValueError(
            f"{what}: interpolation={interpolation!r} is not supported; the native engine resizes with PIL's "
            f"antialiased bilinear or bicubic. Use interpolation='bilinear'{also}."
        )
    if antialias is not True:
        raise ValueError(f"{what}: antialias={antialias!r} is not supported; use antialias=True.")
    return mode


def _mode_name(interpolation: Any) -> Any:
    """torchvision's InterpolationMode (``.value``), PIL's ``Resampling`` (an int enum: 2 BILINEAR, 3 BICUBIC), or a
    string, as a lower-case name; anything else as it is."""
    mode = getattr(interpolation, "value", interpolation)
    if type(interpolation).__name__ == "Resampling" or (isinstance(mode, int) and not isinstance(mode, bool)):
        return {2: "bilinear", 3: "bicubic"}.get(int(mode), interpolation)
    return mode.lower() if isinstance(mode, str) else mode


def shorter_side_to(height: np.ndarray, width: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """torchvision's ``_compute_resized_output_size`` for one shorter side per sample: (new_h, new_w), the longer
    side ``int(size * long / short)``."""
    short, long = np.minimum(height, width), np.maximum(height, width)
    new_long = np.floor(size * long / short).astype(np.int64)
    portrait = width <= height
    return np.where(portrait, new_long, size), np.where(portrait, size, new_long)


class RandomResize(Transform):
    """Resize each sample's shorter side to ``int(torch.randint(min_size, max_size, ()))`` (torchvision v2: max
    excluded), the longer side keeping the aspect ratio. One integer draw per sample from the batch's draws.
    ``interpolation``: "bilinear" or "bicubic"."""

    def __init__(self, min_size: int, max_size: int, interpolation: Any = "bilinear", antialias: bool = True) -> None:
        self.min_size = _positive_int(min_size, "RandomResize min_size")
        self.max_size = _positive_int(max_size, "RandomResize max_size")
        if self.max_size <= self.min_size:
            raise ValueError(
                f"RandomResize: max_size={max_size} must be greater than min_size={min_size} (the size "
                f"is drawn from [min_size, max_size), max_size excluded, as torchvision draws it); for "
                f"one size use Resize({min_size})"
            )
        self.interpolation = check_resize(interpolation, antialias, "RandomResize")
        self.antialias = True

    def _params(self) -> dict[str, Any]:
        return {
            "min_size": self.min_size,
            "max_size": self.max_size,
            "interpolation": self.interpolation,
            "antialias": self.antialias,
        }

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(min_size={self.min_size}, max_size={self.max_size}, "
            f"interpolation={self.interpolation}, antialias={self.antialias})"
        )

    def _apply(self, state: Any, rng: np.random.Generator) -> None:
        n = state.h.shape[0]
        # checking a dataset at open: the smallest size, the worst case for every crop after it
        size = np.full(n, self.min_size) if state.checking else rng.integers(self.min_size, self.max_size, size=n)
        state.smallest = state.smallest or state.checking
        state.resize(*shorter_side_to(state.h, state.w, size), self.interpolation)

    def _static_size(self, hw: tuple[int, int] | None) -> tuple[int, int] | None:
        return None  # drawn per sample: a fixed-size crop after it gives the batch its size
