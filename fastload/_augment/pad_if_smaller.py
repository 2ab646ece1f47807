"""``PadIfSmaller``, torchvision's segmentation reference's (``references/segmentation/v2_extras.py``): an image
smaller than ``size`` padded on the right and at the bottom only, up to ``size``; a crop-plan transform.

The reference follows it with ``RandomCrop(crop_size)``, and so must fastload's: the padded image is never
decoded, the ``RandomCrop`` after it draws its window over the padded image as torchvision draws it (the padded
size, the same one integer per axis) and makes it a padded window (``padding.Padding``), the part of the window
beyond the image showing ``fill`` (a per-kind dict gives masks their own, ``type_fill.py``). It draws nothing
itself. ``pipeline.split`` refuses it anywhere but right before a ``RandomCrop`` (a flip in between would move
the padding to the left, a resize would resample the fill).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._transforms.base import Transform, _positive_int
from .padding import fill_of

__all__ = ["PadIfSmaller", "Pending"]


@dataclass
class Pending:
    """The padding a ``PadIfSmaller`` left for the ``RandomCrop`` after it (held in the planning state's ``pad``
    until that crop makes it part of its window)."""

    bottom: np.ndarray  # int64 (n,)
    right: np.ndarray  # int64 (n,)
    fill: np.ndarray  # float64 (3,): the image's
    mask_fill: int
    by: Any  # the PadIfSmaller, for messages

    def take_rows(self, keep: np.ndarray) -> Pending:
        """The padding of the rows ``keep`` (a bool mask or indices)."""
        return Pending(self.bottom[keep], self.right[keep], self.fill, self.mask_fill, self.by)


class PadIfSmaller(Transform):
    """Pad the image on the right and at the bottom with ``fill`` (torchvision's, or ``{"image": 0, "mask": 255}``)
    where it is narrower or shorter than ``size`` (an int, as in torchvision's references). Must be followed by a
    ``RandomCrop``, which crops its window from the padded image."""

    pads = True  # the window after it may reach outside the image (what the decoders' checks ask)

    def __init__(self, size: int, fill: Any = 0) -> None:
        self.size = _positive_int(size, "PadIfSmaller size")
        self.fill = fill
        self._fill, self._mask_fill = fill_of(fill, "PadIfSmaller")

    def _params(self) -> dict[str, Any]:
        return {"size": self.size, "fill": self.fill}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, fill={self.fill})"

    def _static_size(self, hw: tuple[int, int] | None) -> tuple[int, int] | None:
        return None if hw is None else (max(hw[0], self.size), max(hw[1], self.size))

    def _apply(self, state: Any, rng: np.random.Generator) -> None:
        if state.pad is not None:
            raise ValueError(f"{self!r}: only one padded RandomCrop per pipeline")
        state.pad = Pending(
            np.maximum(self.size - state.h, 0), np.maximum(self.size - state.w, 0), self._fill, self._mask_fill, self
        )
