"""A geometric transform's ``fill`` per kind of field: the image's colour and a mask's class id.

RandomCrop (its padding), RandomRotation and RandomAffine take torchvision's ``fill`` for the image (None, a
number, or one number per channel) or, as torchvision v2 takes ``{tv_tensors.Image: 0, tv_tensors.Mask: 255}``,
one per kind: ``{"image": 0, "mask": 255}``, with ``"others"`` for a kind not named (v2's key). A mask field
(``fields/mask.py``) shows its fill where the image shows its own: in a padded crop window and outside an affine.

A plain ``fill`` (not a dict) is the image's, and the mask keeps 255, torchvision's segmentation reference's
"ignore" label: fastload's own transforms pad a mask with 255 unless told otherwise. torchvision v2 applies a plain
fill to every kind, masks included (``_setup_fill_arg`` makes it ``{"others": fill}``, which ``_get_fill`` hands
the mask): its objects keep that meaning when converted (``torchvision_convert.py`` writes both kinds out).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from .plan import check_fill

__all__ = ["MASK_FILL", "KINDS", "split_fill"]

MASK_FILL = 255  # torchvision's segmentation reference pads and rotates masks with 255 ("ignore")
KINDS = ("image", "mask", "others")


def split_fill(fill: Any, what: str) -> tuple[np.ndarray, int]:
    """``(image fill (3,) float64, mask fill 0..255)`` of a transform's ``fill`` (see the module docstring)."""
    if not isinstance(fill, dict):
        return check_fill(fill, what), MASK_FILL
    bad = [k for k in fill if k not in KINDS]
    if bad:
        raise ValueError(
            f"{what}: fill={fill!r} has the key {bad[0]!r}; a fill per kind is keyed by 'image', "
            f"'mask' or 'others' (torchvision v2's tv_tensors.Image / tv_tensors.Mask are converted "
            f"to these)"
        )
    image = check_fill(fill.get("image", fill.get("others")), f"{what} (the image's fill)")
    mask = fill.get("mask", fill.get("others", MASK_FILL))
    return image, mask_value(mask, what)


def mask_value(value: Any, what: str) -> int:
    """A mask's fill: one class id, an integer in [0, 255] (or a sequence of one, as torchvision allows)."""
    v = value[0] if isinstance(value, (list, tuple)) and len(value) == 1 else value
    if v is None:
        return 0  # torchvision: no fill is zeros
    if (
        isinstance(v, bool)
        or not isinstance(v, numbers.Real)
        or not math.isfinite(v)
        or float(v) != int(v)
        or not 0 <= int(v) <= 255
    ):
        raise ValueError(
            f"{what}: the mask's fill {value!r} should be one class id, an integer in [0, 255] (a mask has one channel)"
        )
    return int(v)
