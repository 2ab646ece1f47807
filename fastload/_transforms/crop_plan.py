"""The crop plan: ``Plan``, one batch's crop boxes, flips and output sizes (what every decoder executes), and
``_State``, the batch's virtual images while ``ImagePipeline.plan`` folds the crop-plan transforms into them (see
"Composition" in ``fastload/transforms.py``'s docstring)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._augment.random_resize import RESIZE_CODES as _RESIZE_CODES
from .size_check import Refusal


class Plan:
    """One batch's plan for one image field: what every decoder executes, ``decode(sources, plan, out)``
    (``fastload/decoders/_base.py``), and what :func:`apply_pil` executes for ``ds[i]``.

    ``crops``: int32 ``(n, 4)``, top, left, height, width in source pixels, inside the image;
    ``flips``: uint8 ``(n,)``, 1 = mirror left-right after resizing; ``out_hw``: int32 ``(n, 2)``, the output
    height and width (a fixed-size pipeline's rows are that size).

    ``augment``: None, or the per-sample augmentation of issue 21 over these tiles
    (``fastload._augment.plan.AugmentPlan``: vertical flips, an affine matrix, ordered pixel operations),
    attached by :meth:`with_augment` so that its geometry and the fields above never disagree. Decoders read
    the plan through this one object, so adding a kind of operation extends the plan, not their signature;
    a decoder that cannot execute part of a plan refuses it (``decoders/_base.py`` ``geometry_only``).

    ``seeds``: None, or uint64 ``(n,)``: each sample's seed for the transforms fastload does not know
    (``ImagePipeline.fallback``, run per sample after the decoder; ``_augment/fallback.py``).

    ``after_seeds``: the same for the transforms after ToDtype/Normalize (``ImagePipeline.after``).

    ``erase``: None, or one ``_augment.noise_erasing.ErasePlan`` per ``ImagePipeline.erase`` (boxes and noise
    seeds of the erasings after ToDtype/Normalize, written into the normalized float rows by the fill stage).

    ``interp``: None (every sample resized bilinear), or uint8 ``(n,)``: each sample's resize, 0 PIL's BILINEAR,
    1 PIL's BICUBIC (``_augment/random_resize.py`` ``RESIZE_CODES``; csrc/resize.h). Only the native decoder
    resizes bicubic; the GPU decoders refuse such a pipeline when made (``decoders/_base.py`` ``BICUBIC_RESIZE``).

    ``frames``: None, or int32 ``(n, 8)``: each sample's output as torchvision computes a resize followed by a crop
    (``Resize(256)`` then ``CenterCrop(224)``): ``(top, left, height, width, resize_h, resize_w, y, x)``, the source
    box resized whole to ``resize_h x resize_w`` (one antialiased resample, PIL's ``crop(box).resize(size)``), of
    which the output is the ``out_hw`` window at ``(y, x)`` (whole pixels of the resized image, PIL's ``crop``).
    Where that window starts between two source pixels, ``crops`` (the window's source box rounded to whole
    pixels) is off by a sub-pixel; a decoder that executes ``frames`` gets torchvision's pixels (the native one,
    :func:`apply_pil` and the mask field do; DALI resamples the window as a region of interest, within a level of
    them; nvJPEG resamples ``crops`` and says so once). Set only when the planned steps are one resize of a
    whole-pixel box followed by whole-pixel crops (and flips) and some window is not the whole resize.

    ``plan.take(lo, hi)``: the plan of samples ``lo .. hi-1``; ``plan.n``: how many samples.
    """

    __slots__ = ("crops", "flips", "out_hw", "augment", "seeds", "after_seeds", "interp", "erase", "frames")

    def __init__(
        self,
        crops: np.ndarray,
        flips: np.ndarray,
        out_hw: np.ndarray,
        augment: Any = None,
        seeds: np.ndarray | None = None,
        after_seeds: np.ndarray | None = None,
        interp: np.ndarray | None = None,
        erase: tuple | None = None,
        frames: np.ndarray | None = None,
    ) -> None:
        self.crops, self.flips, self.out_hw, self.augment = crops, flips, out_hw, augment
        self.seeds, self.after_seeds, self.interp, self.erase = seeds, after_seeds, interp, erase
        self.frames = frames

    @property
    def n(self) -> int:
        """How many samples the plan is for."""
        return len(self.crops)

    def __iter__(self):
        """``crops, flips, out_hw = plan`` unpacks as it did when the plan was a named tuple of those three."""
        return iter((self.crops, self.flips, self.out_hw))

    def take(self, lo: int, hi: int) -> Plan:
        """The plan of samples ``lo .. hi-1`` (the hybrid decoder's halves), ``augment`` included."""
        lo, hi, _ = slice(lo, hi).indices(self.n)
        hi = max(lo, hi)
        augment = None if self.augment is None else self.augment.take(lo, hi)
        seeds = None if self.seeds is None else self.seeds[lo:hi]
        after = None if self.after_seeds is None else self.after_seeds[lo:hi]
        interp = None if self.interp is None else self.interp[lo:hi]
        erase = None if self.erase is None else tuple(e.take(lo, hi) for e in self.erase)
        frames = None if self.frames is None else self.frames[lo:hi]
        return Plan(
            self.crops[lo:hi], self.flips[lo:hi], self.out_hw[lo:hi], augment, seeds, after, interp, erase, frames
        )

    def interp_of(self, k: int) -> int:
        """Sample ``k``'s resize: 0 bilinear, 1 bicubic (the native calls' ``interpolation``)."""
        return 0 if self.interp is None else int(self.interp[k])

    def with_augment(self, augment: Any) -> Plan:
        """This plan extended by ``augment`` (an ``AugmentPlan`` begun with ``PlanBuilder.from_crop_plan(self)``):
        the flips and output sizes become the augmentation's (a transform there may flip again)."""
        geo = augment.geometry
        if augment.n != self.n or (geo.crops is not None and not np.array_equal(geo.crops, self.crops)):
            raise ValueError(
                f"the augmentation plan ({augment.n} samples) was not made from this plan "
                f"({self.n} samples): begin it with PlanBuilder.from_crop_plan(plan)"
            )
        return Plan(
            self.crops,
            geo.hflip.astype(np.uint8),
            geo.out_hw.astype(np.int32),
            augment,
            self.seeds,
            self.after_seeds,
            self.interp,
            self.erase,
            self.frames,
        )

    def frame_of(self, k: int) -> tuple[int, ...] | None:
        """Sample ``k``'s row of ``frames`` as ints (the native single-sample calls' ``frame``), or None."""
        return None if self.frames is None else tuple(int(v) for v in self.frames[k])

    def __repr__(self) -> str:
        extra = "" if self.augment is None else f", augment={len(self.augment.steps)} steps"
        return f"Plan({self.n} samples{extra})"


class _State:
    """The batch's virtual images while planning (see "Composition" in ``fastload/transforms.py``'s docstring)."""

    __slots__ = (
        "src_h",
        "src_w",
        "h",
        "w",
        "oy",
        "ox",
        "sy",
        "sx",
        "flip",
        "interp",
        "pad",
        "tile_hw",
        "rest",
        "index",
        "refusals",
        "smallest",
        "frame",
    )

    def __init__(self, heights: np.ndarray, widths: np.ndarray, checking: bool = False) -> None:
        self.src_h, self.src_w = heights, widths
        self.h, self.w = heights, widths
        self.oy = self.ox = np.zeros(heights.shape[0])
        self.sy = self.sx = np.ones(heights.shape[0])
        self.flip = np.zeros(heights.shape[0], dtype=bool)
        self.interp = np.zeros(heights.shape[0], dtype=np.uint8)  # each sample's resize (RESIZE_CODES)
        self.pad: Any = None  # a padded RandomCrop's windows (_augment/random_crop.py)
        self.tile_hw: tuple[int, int] | None = None  # their tile's size
        self.rest: tuple = ()  # the crop-plan transforms after the one planning now
        self.index = np.arange(heights.shape[0])  # each row's sample: its position in the batch, or the dataset
        #: checking a dataset at open (ImagePipeline.check_sizes): what each step refused, instead of raising
        self.refusals: list[Refusal] | None = [] if checking else None
        self.smallest = False  # checking: a RandomResize planned its min_size (said in the messages)
        #: Plan.frames being built, int64 (n, 8): the virtual image is the (h, w) window at (y, x) of the whole-pixel
        #: source box (top, left, height, width) resized whole to (resize_h, resize_w) -- torchvision's resize then
        #: crop, exactly; None once a step makes it something else (a second resize, a padded window)
        n = heights.shape[0]
        zero = np.zeros(n, np.int64)
        self.frame: np.ndarray | None = np.stack([zero, zero, heights, widths, heights, widths, zero, zero], axis=1)

    @property
    def checking(self) -> bool:
        """Planning every sample of a dataset at open: ``RandomResize`` plans its smallest size (the worst case)."""
        return self.refusals is not None

    def refuse(self, step: Any, bad: np.ndarray, need: str, detail: Any, fix: str) -> np.ndarray | None:
        """The samples ``bad`` (bool (n,)) that ``step`` cannot plan: it needs ``need``; ``detail(i)`` says what
        row ``i`` is. Planning a batch: ``ValueError`` naming the first. Checking a dataset: recorded, and those
        rows are dropped from the state; returns the mask of the rows kept (None when none was bad)."""
        if not bad.any():
            return None
        where = np.flatnonzero(bad)
        if self.refusals is None:
            i = int(where[0])
            raise ValueError(f"{step!r} needs {need}, but sample {i} of the batch is {detail(i)}; {fix}")
        self.refusals.append(
            Refusal(step, need, fix, self.index[where], [detail(int(i)) for i in where[: Refusal.SHOWN]])
        )
        keep = ~bad
        for name in ("src_h", "src_w", "h", "w", "oy", "ox", "sy", "sx", "flip", "interp", "index"):
            setattr(self, name, getattr(self, name)[keep])
        if self.frame is not None:
            self.frame = self.frame[keep]
        if self.pad is not None:  # a PadIfSmaller's Pending (per-sample bottom, right) or padded windows
            self.pad = self.pad.take_rows(keep)
        return keep

    def crop(self, top: np.ndarray, left: np.ndarray, h: np.ndarray, w: np.ndarray) -> None:
        left = np.where(self.flip, self.w - left - w, left)  # the crop was chosen on the mirror
        if self.frame is not None:  # whole pixels of the resized image (torchvision's crop): the window moves
            f = self.frame.copy()
            f[:, 6] += np.asarray(top, np.int64)
            f[:, 7] += np.asarray(left, np.int64)
            inside = (f[:, 6] >= 0) & (f[:, 7] >= 0) & (f[:, 6] + h <= f[:, 4]) & (f[:, 7] + w <= f[:, 5])
            self.frame = f if inside.all() else None  # a padded window (padding.py) is not a frame
        self.oy = self.oy + top * self.sy
        self.ox = self.ox + left * self.sx
        self.h, self.w = h, w

    def resize(self, h: np.ndarray, w: np.ndarray, interpolation: Any = "bilinear") -> None:
        """Resize every row to ``h`` x ``w`` with ``interpolation``: a name of ``RESIZE_CODES``, or one code per row.
        The crop plan resizes once (every resize is folded into one box): the last resize's interpolation is the
        one the decoder uses."""
        self.interp = (
            np.full(h.shape[0], _RESIZE_CODES[interpolation], np.uint8)
            if isinstance(interpolation, str)
            else np.asarray(interpolation, np.uint8)
        )
        f = self.frame
        if f is not None:  # a resize of a whole-pixel box (nothing resampled yet) starts a frame; a second is none
            unresampled = (f[:, 4] == f[:, 2]) & (f[:, 5] == f[:, 3])
            self.frame = (
                np.stack([f[:, 0] + f[:, 6], f[:, 1] + f[:, 7], self.h, self.w, h, w, 0 * h, 0 * w], axis=1).astype(
                    np.int64
                )
                if unresampled.all()
                else None
            )
        self.sy = self.sy * (self.h / h)
        self.sx = self.sx * (self.w / w)
        self.h, self.w = h, w

    def sized(self, hw: tuple[int, int], padded: bool = False) -> None:
        """Checking a dataset (no plan is made): every row is ``hw`` after this step; ``padded``: a padded window,
        the tile (only flips may follow it)."""
        n = self.h.shape[0]
        self.h, self.w = np.full(n, hw[0], np.int64), np.full(n, hw[1], np.int64)
        if padded:
            self.tile_hw = (int(hw[0]), int(hw[1]))

    def describe(self, i: int) -> str:
        smallest = ", RandomResize at its min_size" if self.checking and self.smallest else ""
        return f"{int(self.h[i])}x{int(self.w[i])} (source {int(self.src_h[i])}x{int(self.src_w[i])}{smallest})"

    def finish(self) -> Plan:
        def edges(o: np.ndarray, extent: np.ndarray, limit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            lo = np.clip(np.rint(o), 0, limit - 1).astype(np.int64)
            hi = np.clip(np.rint(o + extent), lo + 1, limit).astype(np.int64)
            return lo, hi - lo

        top, height = edges(self.oy, self.h * self.sy, self.src_h)
        left, width = edges(self.ox, self.w * self.sx, self.src_w)
        # a padded RandomCrop decodes its box at pad.decode_hw (self.h, self.w) into tiles of tile_hw
        hw = (
            (self.h, self.w)
            if self.tile_hw is None
            else (np.full_like(self.h, self.tile_hw[0]), np.full_like(self.w, self.tile_hw[1]))
        )
        return Plan(
            crops=np.stack([top, left, height, width], axis=1).astype(np.int32),
            flips=self.flip.astype(np.uint8),
            out_hw=np.stack(hw, axis=1).astype(np.int32),
            interp=self.interp.copy() if self.interp.any() else None,  # None: all bilinear (nothing changes)
            frames=self._frames(),
        )

    def _frames(self) -> np.ndarray | None:
        """``Plan.frames``: the frame, where one resize was followed by a crop of its whole pixels; None where the
        rounded crop boxes say it all (no resize, or each output is its whole resize) or no frame is left."""
        f = self.frame
        if f is None or self.pad is not None or self.tile_hw is not None:
            return None
        resized = (f[:, 4] != f[:, 2]) | (f[:, 5] != f[:, 3])
        window = (f[:, 6] != 0) | (f[:, 7] != 0) | (f[:, 4] != self.h) | (f[:, 5] != self.w)
        return f.astype(np.int32) if (resized & window).any() else None
