"""``RandomCrop`` (torchvision v2's arguments), a crop-plan transform: an ordinary crop box when the window lies
inside the image, a padded window otherwise (``padding.py`` says how the decoder executes it)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .._transforms.base import Transform, _setup_size
from .pad_if_smaller import Pending
from .padding import Padding, check_mode, fill_of, index_map, parse_padding

__all__ = ["RandomCrop", "padded_window"]


class RandomCrop(Transform):
    """Crop a random ``size`` window (int or (h, w)), after padding the image by ``padding`` and, with
    ``pad_if_needed``, by what it lacks of the crop size on both sides; the padding shows ``fill`` (``constant``)
    or the image's ``edge``/``reflect``/``symmetric`` copy. ``ValueError`` if the (padded) image is smaller.
    ``fill={"image": 0, "mask": 255}`` gives a mask field its own (``type_fill.py``; a plain fill is the image's,
    masks keeping 255). After a ``PadIfSmaller`` (``pad_if_smaller.py``) the window is drawn over its padded
    image."""

    def __init__(
        self,
        size: int | Sequence[int],
        padding: Any = None,
        pad_if_needed: bool = False,
        fill: Any = 0,
        padding_mode: str = "constant",
    ) -> None:
        self.size = _setup_size(size, "RandomCrop")
        self.padding = parse_padding(padding)
        self.pad_if_needed = bool(pad_if_needed)
        self.fill = fill
        self._fill, self._mask_fill = fill_of(fill)  # the image's, a mask's (type_fill.py)
        self.padding_mode = check_mode(padding_mode)

    @property
    def pads(self) -> bool:
        """Whether a window can reach outside the image (then only flips may follow among crop transforms)."""
        return self.pad_if_needed or (self.padding is not None and any(self.padding))

    def _params(self) -> dict[str, Any]:
        return {
            "size": list(self.size),
            "padding": None if self.padding is None else list(self.padding),
            "pad_if_needed": self.pad_if_needed,
            "fill": self.fill,
            "padding_mode": self.padding_mode,
        }

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self.size}, padding={self.padding}, pad_if_needed={self.pad_if_needed}, "
            f"fill={self.fill}, padding_mode={self.padding_mode!r})"
        )

    def _static_size(self, hw: tuple[int, int] | None) -> tuple[int, int] | None:
        return self.size

    def _apply(self, state: Any, rng: np.random.Generator) -> None:
        ch, cw = self.size
        pre = state.pad if isinstance(state.pad, Pending) else None  # a PadIfSmaller's right/bottom padding
        if pre is not None:
            state.pad = None
        ih, iw = (state.h, state.w) if pre is None else (state.h + pre.bottom, state.w + pre.right)
        left_pad, top_pad, right_pad, bottom_pad = self.padding or (0, 0, 0, 0)
        pad_t = np.full_like(state.h, top_pad)
        pad_l = np.full_like(state.w, left_pad)
        ph, pw = ih + top_pad + bottom_pad, iw + left_pad + right_pad
        if self.pad_if_needed:
            dh, dw = np.maximum(ch - ph, 0), np.maximum(cw - pw, 0)
            pad_t, pad_l, ph, pw = pad_t + dh, pad_l + dw, ph + 2 * dh, pw + 2 * dw
        keep = state.refuse(
            self,
            (ph < ch) | (pw < cw),
            f"an image of at least {ch}x{cw} (h x w) at this step, its padding included",
            lambda i: (
                state.describe(i)
                + ("" if (ph[i], pw[i]) == (state.h[i], state.w[i]) else f", {int(ph[i])}x{int(pw[i])} padded")
            ),
            "use pad_if_needed=True (torchvision refuses such an image too, at its batch), or put a "
            "Resize of at least the crop size before it",
        )
        if keep is not None:
            ih, iw, pad_t, pad_l, ph, pw = (a[keep] for a in (ih, iw, pad_t, pad_l, ph, pw))
        top = rng.integers(0, ph - ch + 1) - pad_t  # one draw per axis and sample (0 where nothing to choose)
        left = rng.integers(0, pw - cw + 1) - pad_l
        if not self.pads and pre is None:
            state.crop(top, left, np.full_like(top, ch), np.full_like(left, cw))
            return
        if state.pad is not None:
            raise ValueError(f"{self!r}: only one padded RandomCrop per pipeline")
        if state.checking:  # only flips follow: the window's size is all the check needs (not its index maps)
            state.sized((ch, cw), padded=True)
            return
        fill, mask_fill = (self._fill, self._mask_fill) if pre is None or self.pads else (pre.fill, pre.mask_fill)
        padded_window(state, top, left, (ch, cw), (ih, iw), self.padding_mode, fill, mask_fill)


def padded_window(
    state: Any,
    top: np.ndarray,
    left: np.ndarray,
    size: tuple[int, int],
    image_hw: tuple,
    mode: str,
    fill: np.ndarray,
    mask_fill: int,
) -> None:
    """Make the batch's ``size`` windows at ``top``/``left`` (in the shown image of ``image_hw`` per sample, a
    PadIfSmaller's padding included, flips already applied) padded windows (``padding.Padding``): the box of image
    pixels each needs, the index maps, ``fill`` where a window leaves the image (``mode`` constant). RandomCrop's
    windows, and a CenterCrop's larger than its image (``transforms.CenterCrop``)."""
    ch, cw = size
    ih, iw = image_hw
    # index maps over the (PadIfSmaller-padded) image as shown, the flip included; its padding is fill (-1)
    rows = index_map(top, ch, ih, mode)
    cols = index_map(left, cw, iw, mode)
    rows = np.where(rows >= state.h[:, None], -1, rows)
    cols = np.where(cols >= state.w[:, None], -1, cols)
    # a flipped sample's columns in the unmirrored image, in unmirrored order (the assembly mirrors them back)
    unmirrored = np.where(cols >= 0, state.w[:, None] - 1 - cols, -1)[:, ::-1]
    cols = np.where(state.flip[:, None], unmirrored, cols)
    y0, y1 = _span(rows)
    x0, x1 = _span(cols)
    rows = np.where(rows >= 0, rows - y0[:, None], -1).astype(np.int32)
    cols = np.where(cols >= 0, cols - x0[:, None], -1).astype(np.int32)
    active = ~((rows == np.arange(ch)).all(axis=1) & (cols == np.arange(cw)).all(axis=1))
    n = state.h.shape[0]
    state.crop(y0, np.where(state.flip, state.w - x1, x0), y1 - y0, x1 - x0)
    state.pad = Padding(
        active, np.stack([y1 - y0, x1 - x0], axis=1), rows, cols, np.tile(fill, (n, 1)), np.full(n, mask_fill, np.uint8)
    )
    state.tile_hw = (ch, cw)


def _span(index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, [first, last + 1) of the valid (>= 0) indices; [0, 1) when there are none (all fill: one pixel is
    still decoded, so that every sample's box is a real crop)."""
    valid = index >= 0
    big = np.iinfo(np.int64).max
    lo = np.where(valid, index, big).min(axis=1)
    hi = np.where(valid, index, -1).max(axis=1) + 1
    none = ~valid.any(axis=1)
    return np.where(none, 0, lo), np.where(none, 1, hi)
