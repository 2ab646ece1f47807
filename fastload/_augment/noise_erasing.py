"""Erasing after ToDtype/Normalize, in normalized units: timm's ``RandomErasing`` (modes const/rand/pixel, several
boxes) and torchvision's ``RandomErasing(value='random')`` (issue 30 item 1).

Both libraries erase last, on the normalized float image, with values in normalized units: timm's mode
``'const'`` writes 0 (the mean colour), ``'rand'`` one N(0, 1) value per channel per box, ``'pixel'`` (timm's
``train.py``'s ``--remode pixel``, DeiT's recipe) one N(0, 1) value per pixel and channel; torchvision's
``value='random'`` (v1 and v2) per pixel and channel as timm's ``'pixel'``. A normal value maps back to no pixel
level of the uint8 image (it falls outside 0-255 at a few standard deviations and is not a multiple of a level),
so unlike a constant (``pipeline.lift_erasing``) it cannot be planned on the uint8 tile in the decoder.

:class:`NoiseErasing` draws its boxes with the plan, per sample (``_draws.py``: a sample's boxes and noise
depend only on (seed, epoch, sample index)), and the fill stage writes them into the batch's float rows right
after converting and normalizing them on the CPU (``_fill/images.py``, the rows the callables after Normalize
run on; the batch then leaves as floats, on a device path 4x the bytes of uint8 to copy). No per-sample Python
object runs: one torch draw and a few small writes per erased box, each write under ATen's parallel grain so that it
runs on the fill thread without waking torch's intra-op threads.

The boxes follow timm's ``_erase`` exactly (torchvision's ``get_params`` is its one-box case): with probability
``p`` a sample is erased; ``count`` boxes, uniform in ``[min_count, max_count]``; each box takes the first of 10
attempts of an area ``uniform(min_area, max_area) * H * W / count`` and an aspect ``exp(uniform(log range))``
whose rounded sides ``h = round(sqrt(area * aspect))``, ``w = round(sqrt(area / aspect))`` are smaller than the
image (no box when all 10 fail), at a uniform position; later boxes overwrite earlier ones. The noise is torch's
N(0, 1) (float32, stored in the batch's dtype) from a per-box seed drawn with the box: the same distribution as
timm's and torchvision's, not their values (their draws come from Python's and torch's global generators).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .._draws import at

__all__ = ["ErasePlan", "NoiseErasing"]

MODES = ("const", "rand", "pixel")

# ATen's grain (at::internal::GRAIN_SIZE): an elementwise op over fewer elements runs on the calling thread. A larger
# one wakes torch's intra-op threads, whose spinning against the decode threads cost 10x the erasing itself (20 ms of
# CPU per batch of 64 at 224 instead of 2, measured), so the writes go in slices of at most this many elements.
_GRAIN = 32768


class ErasePlan:
    """One :class:`NoiseErasing`'s draws for a batch: ``boxes`` int64 ``(n, max_count, 4)`` (top, left, h, w; h
    or w 0: no box), ``seeds`` uint64 ``(n, max_count)`` (each box's noise)."""

    __slots__ = ("boxes", "seeds")

    def __init__(self, boxes: np.ndarray, seeds: np.ndarray) -> None:
        self.boxes, self.seeds = boxes, seeds

    def take(self, lo: int, hi: int) -> ErasePlan:
        return ErasePlan(self.boxes[lo:hi], self.seeds[lo:hi])


class NoiseErasing:
    """Erase up to ``count`` boxes of a normalized float image with ``mode``'s values (module docstring).

    ``p``: the probability a sample is erased; ``area``: (min, max) fraction of the image a sample's boxes cover
    (each box ``/ count``); ``log_ratio``: (min, max) of the aspect's logarithm; ``count``: (min, max) boxes.
    ``source``: the torchvision/timm object it was converted from (run as it is where this cannot be)."""

    def __init__(
        self,
        p: float,
        area: tuple[float, float],
        log_ratio: tuple[float, float],
        mode: str = "pixel",
        count: tuple[int, int] = (1, 1),
        source: Any = None,
        value: tuple[float, ...] = (0.0,),
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"NoiseErasing: mode={mode!r} should be one of {MODES}")
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"NoiseErasing: p={p!r} should be a probability in [0, 1]")
        lo, hi = (int(c) for c in count)
        if not 1 <= lo <= hi:
            raise ValueError(f"NoiseErasing: count={count!r} should be (min, max) with 1 <= min <= max")
        if not 0.0 <= float(area[0]) <= float(area[1]):
            raise ValueError(f"NoiseErasing: area={area!r} should be (min, max) with 0 <= min <= max")
        if not float(log_ratio[0]) <= float(log_ratio[1]):
            raise ValueError(f"NoiseErasing: log_ratio={log_ratio!r} should be (min, max) with min <= max")
        self.p = float(p)
        self.area = (float(area[0]), float(area[1]))
        self.log_ratio = (float(log_ratio[0]), float(log_ratio[1]))
        self.mode = mode
        self.count = (lo, hi)
        self.source = source
        #: mode 'const''s value in normalized units, one per channel or one for all (timm's is 0; torchvision's
        #: constant ``RandomErasing(value=v)`` after a noise erasing, ``pipeline.lift_erasing``)
        self.value = tuple(float(v) for v in value)
        if len(self.value) not in (1, 3) or (mode != "const" and any(self.value)):
            raise ValueError(f"NoiseErasing: value={value!r} should be 1 or 3 numbers, for mode 'const' only")
        self.name = repr(self)

    def plan(self, out_hw: np.ndarray, rng: Any) -> ErasePlan:
        """The boxes and noise seeds of images of sizes ``out_hw`` (n, 2), drawn from ``rng`` (the loader's
        ``SampleDraws`` or a numpy ``Generator``): a fixed number of calls per sample, so what one sample draws
        never depends on the others'."""
        n, m = len(out_hw), self.count[1]
        boxes = np.zeros((n, m, 4), dtype=np.int64)
        seeds = np.zeros((n, m), dtype=np.uint64)
        sel = np.flatnonzero(rng.random(n) < self.p)
        k = sel.size
        if k == 0:
            return ErasePlan(boxes, seeds)
        r = at(rng, sel)  # the rest is drawn for the erased samples only
        lo, hi = self.count
        count = np.full(k, lo, dtype=np.int64) if lo == hi else r.integers(lo, hi + 1, k)
        img_h = out_hw[sel, 0].astype(np.int64)[:, None, None]
        img_w = out_hw[sel, 1].astype(np.int64)[:, None, None]
        target = r.uniform(self.area[0], self.area[1], (k, m, 10)) * (img_h * img_w) / count[:, None, None]
        aspect = np.exp(r.uniform(self.log_ratio[0], self.log_ratio[1], (k, m, 10)))
        hs = np.rint(np.sqrt(target * aspect)).astype(np.int64)  # rint: half to even, as Python's round
        ws = np.rint(np.sqrt(target / aspect)).astype(np.int64)
        ok = (hs < img_h) & (ws < img_w)
        first = ok.argmax(axis=2)[..., None]
        use = ok.any(axis=2) & (np.arange(m)[None, :] < count[:, None])  # a box found, among the sample's count
        h = np.where(use, np.take_along_axis(hs, first, 2)[..., 0], 0)
        w = np.where(use, np.take_along_axis(ws, first, 2)[..., 0], 0)
        top = r.integers(0, img_h[:, :, 0] - h + 1)
        left = r.integers(0, img_w[:, :, 0] - w + 1)
        boxes[sel] = np.stack([top, left, h, w], axis=2)
        if self.mode != "const":
            seeds[sel] = r.integers(0, 2**63, (k, m), dtype=np.uint64)
        return ErasePlan(boxes, seeds)

    def apply(self, x: torch.Tensor, plan: ErasePlan) -> None:
        """Erase ``x`` (n, H, W, C) float rows (any strides, e.g. a CHW image's HWC view) in place, box by box in
        each sample's order (a later box overwrites an earlier one, as timm's). Every write covers at most
        ``_GRAIN`` elements, so that torch runs it on this thread (module docstring)."""
        boxes = plan.boxes
        c = int(x.shape[3])
        fill = None
        if self.mode == "const" and any(self.value):
            if len(self.value) not in (1, c):
                raise ValueError(f"{self!r}: {len(self.value)} values for images of {c} channels (1 or {c} expected)")
            fill = torch.tensor(self.value, dtype=x.dtype)
        for i, j in zip(*np.nonzero((boxes[:, :, 2] > 0) & (boxes[:, :, 3] > 0))):
            top, left, h, w = (int(v) for v in boxes[i, j])
            region = x[int(i), top : top + h, left : left + w]
            noise = None
            if self.mode != "const":
                g = torch.Generator().manual_seed(int(plan.seeds[i, j]))
                noise = torch.randn((h, w, c) if self.mode == "pixel" else (c,), generator=g, dtype=torch.float32)
            step = max(1, _GRAIN // (w * c))
            for r in range(0, h, step):
                rows = region[r : r + step]
                if fill is not None:
                    rows.copy_(fill.expand(rows.shape))
                elif noise is None:
                    rows.zero_()
                else:
                    rows.copy_(noise[r : r + step] if self.mode == "pixel" else noise)

    def describe(self) -> dict[str, Any]:
        out = {"name": "RandomErasing", "mode": self.mode, "p": self.p, "count": list(self.count), "on": "floats"}
        if any(self.value):
            out["value"] = list(self.value)
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NoiseErasing) and (
            self.p,
            self.area,
            self.log_ratio,
            self.mode,
            self.count,
            self.value,
        ) == (other.p, other.area, other.log_ratio, other.mode, other.count, other.value)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        ratio = tuple(round(math.exp(v), 4) for v in self.log_ratio)
        value = f", value={self.value}" if any(self.value) else ""
        return (
            f"RandomErasing(p={self.p}, area={self.area}, ratio={ratio}, mode={self.mode!r}{value}, "
            f"count={self.count}, after ToDtype/Normalize)"
        )
