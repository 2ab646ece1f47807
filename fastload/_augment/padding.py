"""RandomCrop with padding (torchvision v2's ``padding``, ``pad_if_needed``, ``fill``, ``padding_mode``): crop
windows that reach outside the image, executed by the decoder.

The window is drawn as torchvision draws it (the image padded by ``padding``, then by ``pad_if_needed``'s
difference on both sides; one uniform integer per axis where the padded image is larger than the crop). The
decoder never reads outside the image: per sample, the plan holds

- the **box** of image pixels the window needs (its part inside the image, plus, for ``edge``/``reflect``/
  ``symmetric``, the pixels those modes copy), which is decoded, cropped and resized as any crop box, to its own
  size ``decode_hw`` (at most the tile's: a window of n pixels reads at most n distinct rows or columns);
- two index maps, ``rows`` (tile height) and ``cols`` (tile width): which decoded row/column each tile row/column
  takes, ``-1`` for the ``fill`` colour (``constant``);

then the tile is assembled from the decoded box (mirrored if the sample is flipped), before the augmentation's
geometry and operations. ``reflect`` and ``symmetric`` reflect repeatedly where the padding exceeds the image
(numpy's ``np.pad``; torch refuses such padding). Only horizontal flips may follow a padded RandomCrop among the
crop-plan transforms (a resize of the padded window would resample the fill): the pipeline says so at open.
A ``PadIfSmaller`` (``pad_if_smaller.py``) before the RandomCrop makes its window one of the right/bottom-padded
image: the index maps run over that image, its padding being fill.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from .type_fill import split_fill

__all__ = ["Padding", "assemble", "index_map"]

MODES = ("constant", "edge", "reflect", "symmetric")


@dataclass
class Padding:
    """The padded crops of a batch (see the module docstring); ``active[i]`` False: sample i's window lies inside
    its image and is decoded as a plain crop (its rows are then unused)."""

    active: np.ndarray  # bool (n,)
    decode_hw: np.ndarray  # int64 (n, 2): the decoded box's size, <= the tile's
    rows: np.ndarray  # int32 (n, H): decoded row per tile row, -1 = fill
    cols: np.ndarray  # int32 (n, W): decoded column per tile column (unmirrored), -1 = fill
    fill: np.ndarray  # float64 (n, 3)
    mask_fill: np.ndarray | None = None  # uint8 (n,): a mask field's fill (type_fill.py; None: 255)

    def take_rows(self, keep: np.ndarray) -> Padding:
        """The rows ``keep`` (a bool mask or indices) of these windows."""
        return Padding(
            self.active[keep],
            self.decode_hw[keep],
            self.rows[keep],
            self.cols[keep],
            self.fill[keep],
            None if self.mask_fill is None else self.mask_fill[keep],
        )

    def take(self, lo: int, hi: int) -> Padding:
        return Padding(
            self.active[lo:hi],
            self.decode_hw[lo:hi],
            self.rows[lo:hi],
            self.cols[lo:hi],
            self.fill[lo:hi],
            None if self.mask_fill is None else self.mask_fill[lo:hi],
        )


def index_map(start: np.ndarray, length: int, size: np.ndarray, mode: str) -> np.ndarray:
    """(n, length) int64: for windows ``[start, start + length)`` over axes of ``size`` pixels, the image index
    each window position shows under ``mode``, -1 for the fill."""
    v = start[:, None] + np.arange(length)[None, :]
    n = size[:, None]
    if mode == "constant":
        return np.where((v >= 0) & (v < n), v, -1)
    if mode == "edge":
        return np.clip(v, 0, n - 1)
    if mode == "reflect":  # period 2(n-1): ... 2 1 0 1 2 ... n-1 n-2 ...; a 1-pixel axis repeats its pixel
        period = np.maximum(2 * (n - 1), 1)
        r = np.mod(v, period)
        return np.where(n == 1, 0, np.where(r < n, r, period - r))
    # symmetric, period 2n: ... 1 0 0 1 ... n-1 n-1 ...
    r = np.mod(v, 2 * n)
    return np.where(r < n, r, 2 * n - 1 - r)


def assemble(decoded: np.ndarray, rows: np.ndarray, cols: np.ndarray, fill: np.ndarray, flip: bool) -> np.ndarray:
    """The tile (H, W, 3) from the decoded box: ``tile[y, x] = decoded[rows[y], cols[x']]`` (x' mirrored if
    ``flip``), the fill where either index is -1 (what csrc/augment_plan.cc does)."""
    c = cols[::-1] if flip else cols
    out = decoded[np.maximum(rows, 0)][:, np.maximum(c, 0)].copy()
    out[(rows < 0)[:, None] | (c < 0)[None, :]] = fill.astype(np.uint8)  # fill values are 0..255, truncated
    return out


def parse_padding(padding: Any) -> tuple[int, int, int, int] | None:
    """torchvision's padding: an int, or 1, 2 (left/right, top/bottom) or 4 (left, top, right, bottom) ints ->
    (left, top, right, bottom)."""
    if padding is None:
        return None
    if isinstance(padding, numbers.Integral) and not isinstance(padding, bool):
        p = [int(padding)]
    elif (
        isinstance(padding, (list, tuple))
        and len(padding) in (1, 2, 4)
        and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in padding)
    ):
        p = [int(v) for v in padding]
    else:
        raise TypeError(f"RandomCrop: padding={padding!r} should be an int or a sequence of 1, 2 or 4 ints")
    if min(p) < 0:
        raise ValueError(f"RandomCrop: padding={padding!r} should be non-negative")
    if len(p) == 1:
        p = p * 4
    elif len(p) == 2:
        p = [p[0], p[1], p[0], p[1]]
    return (p[0], p[1], p[2], p[3])


def check_mode(mode: Any) -> str:
    if mode not in MODES:
        raise ValueError(f"RandomCrop: padding_mode={mode!r} should be one of {', '.join(map(repr, MODES))}")
    return mode


def fill_of(fill: Any, what: str = "RandomCrop") -> tuple[np.ndarray, int]:
    """RandomCrop's (or PadIfSmaller's) ``fill``: the image's (3,) and a mask's, per kind as
    ``type_fill.split_fill`` reads it."""
    f, mask = split_fill(fill, what)
    if np.any((f < 0) | (f > 255)):
        raise ValueError(f"{what}: fill={fill!r} should be in [0, 255] (uint8 images)")
    return f, mask
