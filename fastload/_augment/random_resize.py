"""``RandomResize`` (torchvision v2's), a crop-plan transform: each sample's shorter side resized to a size drawn
uniformly from ``[min_size, max_size)``, folded into the crop box and resize the decoder executes (as ``Resize``).

torchvision's segmentation reference starts with it (``RandomResize(0.5 * base, 2.0 * base)``, then a flip and a
``RandomCrop``): the output size varies per sample, so a fixed-size crop must follow for the images to batch; without
one the image field has no fixed output size and the loader leaves the fast path saying so (as for ``Resize(int)``).
Also here: the interpolation check the crop-plan transforms share (moved out of ``transforms.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._transform_base import Transform, _positive_int

__all__ = ["RandomResize", "check_bilinear"]


def check_bilinear(interpolation: Any, antialias: Any, what: str) -> str:
    """ "bilinear" or torchvision's InterpolationMode.BILINEAR (its ``.value`` is "bilinear"), antialiased: what the
    native engine resizes with (a mask following the image is resized NEAREST, as torchvision resizes masks)."""
    mode = getattr(interpolation, "value", interpolation)
    if mode != "bilinear":
        raise ValueError(
            f"{what}: interpolation={interpolation!r} is not supported; the native engine resizes "
            "with antialiased bilinear only. Use interpolation='bilinear'."
        )
    if antialias is not True:
        raise ValueError(f"{what}: antialias={antialias!r} is not supported; use antialias=True.")
    return mode


def shorter_side_to(height: np.ndarray, width: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """torchvision's ``_compute_resized_output_size`` for one shorter side per sample: (new_h, new_w), the longer
    side ``int(size * long / short)``."""
    short, long = np.minimum(height, width), np.maximum(height, width)
    new_long = np.floor(size * long / short).astype(np.int64)
    portrait = width <= height
    return np.where(portrait, new_long, size), np.where(portrait, size, new_long)


class RandomResize(Transform):
    """Resize each sample's shorter side to ``int(torch.randint(min_size, max_size, ()))`` (torchvision v2: max
    excluded), the longer side keeping the aspect ratio. One integer draw per sample from the batch's draws."""

    def __init__(self, min_size: int, max_size: int, interpolation: Any = "bilinear", antialias: bool = True) -> None:
        self.min_size = _positive_int(min_size, "RandomResize min_size")
        self.max_size = _positive_int(max_size, "RandomResize max_size")
        if self.max_size <= self.min_size:
            raise ValueError(
                f"RandomResize: max_size={max_size} must be greater than min_size={min_size} (the size "
                f"is drawn from [min_size, max_size), max_size excluded, as torchvision draws it); for "
                f"one size use Resize({min_size})"
            )
        self.interpolation = check_bilinear(interpolation, antialias, "RandomResize")
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
        state.resize(*shorter_side_to(state.h, state.w, size))

    def _static_size(self, hw: tuple[int, int] | None) -> tuple[int, int] | None:
        return None  # drawn per sample: a fixed-size crop after it gives the batch its size
