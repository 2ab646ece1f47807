"""Image transforms: declared on a dataset, planned here, executed by an engine.

The four geometric transforms below follow ``torchvision.transforms`` (v1) names, defaults and
semantics. They never touch pixels themselves: :class:`ImagePipeline` folds a whole list of them into
one *plan* per sample — a crop box in source-pixel coordinates, an output size and a flip flag — which
the native batcher executes as decode (DCT-scaled) → crop → antialiased bilinear resize → flip,
writing straight into the batch buffer. :func:`apply_pil` executes the same plan with PIL (``ds[i]``,
debugging, tests).

Composition. While planning, each sample carries a *virtual image*: the source box
``[oy, oy + h*sy) x [ox, ox + w*sx)`` resampled to ``h x w`` pixels, mirrored if ``flip``. A resize
changes ``h, w`` and the scales ``sy, sx``; a crop (given in the virtual image's own, possibly
mirrored, pixels) moves the origin; a flip toggles ``flip`` (two flips cancel). Pixel ``k`` of a
resized image covers source ``[k*s, (k+1)*s)`` (PIL's and torch's half-pixel convention), so the
mapping is exact in real numbers. Only at the end is the box rounded to whole source pixels, edge by
edge (``top = round(oy)``, ``bottom = round(oy + h*sy)``, half to even), kept at least one pixel and
inside the image. Each edge therefore moves by at most half a source pixel relative to torchvision's
resize-then-crop; with no resize before a crop (e.g. ``RandomResizedCrop`` first) the box is exact.

Randomness comes only from the ``rng`` passed to :meth:`ImagePipeline.plan`, drawn step by step in
pipeline order with a fixed number of draws per sample, so a seed fixes the plan. The loader passes
per-sample draws (``_draws.py``): a sample's plan then depends only on (seed, epoch, sample index).

``CenterCrop`` larger than the (virtual) image zero-pads it as torchvision does (the padding split as
``F.center_crop`` splits it: ``(crop - size) // 2`` before, the rest after; masks padded with 0 too), executed as a
padded window (``_augment/padding.py``); only ``RandomHorizontalFlip`` may follow such a window among the crops and
resizes. What a step cannot plan for a sample (a ``RandomCrop`` larger than its padded image, a ``Resize`` that
would make a side 0, a ``CenterCrop`` that would pad before a resize) raises ``ValueError`` for a batch, and
:meth:`ImagePipeline.check_sizes` finds every such sample of a dataset from its stored sizes, so that
``fastload.open`` refuses them before the first batch, naming how many and which.

On-device transforms (``Normalize``, ``ToDtype``) will live here too; they are not geometric and will
not go through :class:`ImagePipeline`.
"""

from __future__ import annotations

import math
import numbers
import sys
from typing import Any, Sequence

import numpy as np

from ._install import pil
from ._transforms.base import Transform, _positive_int, _setup_size
from ._transforms.tensor import Normalize, TensorPipeline, TensorTransform, ToDtype  # noqa: E402
from ._transforms.sequences import Bucket, Pad, PackSequences  # noqa: E402  (variable-length fields, see _transforms/sequences.py)

# The augmentations (issue 21), under torchvision v2's names; planned after the crop plan (_augment/pipeline.py).
from ._augment import pipeline as _augment  # noqa: E402
from ._augment import timm_convert as _timm  # noqa: E402
from ._augment import torchvision_convert as _torchvision  # noqa: E402
from ._augment.fallback import AfterNormalize, UserTransform, run_sample  # noqa: E402  (transforms fastload does not know)
from ._augment.noise_erasing import NoiseErasing  # noqa: E402  (erasing with noise after Normalize, in the fill stage)
from ._transforms import size_check as _size_check  # noqa: E402  (ImagePipeline.check_sizes: what fastload.open refuses)
from ._transforms.size_check import Refusal  # noqa: E402
from ._augment.color import ColorJitter, Grayscale, RandomGrayscale  # noqa: E402
from ._augment.combinators import RandomApply, RandomChoice, RandomOrder  # noqa: E402
from ._augment.filters import GaussianBlur, RandomErasing  # noqa: E402
from ._augment.mix import CutMix, MixUp  # noqa: E402  (batch transforms: fastload.open(batch_transforms=...))
from ._augment.geometry import RandomAffine, RandomRotation, RandomVerticalFlip  # noqa: E402
from ._augment.plan import Augment  # noqa: E402
from ._augment.random_resize import RESIZE_CODES as _RESIZE_CODES  # noqa: E402  (crop plan)
from ._augment.random_resize import RandomResize, check_resize as _interpolation  # noqa: E402
from ._augment.policies import AutoAugment, RandAugment, ThreeAugment, TrivialAugmentWide  # noqa: E402
from ._augment.tone import (
    RandomAdjustSharpness,
    RandomAutocontrast,
    RandomEqualize,
    RandomInvert,  # noqa: E402
    RandomPosterize,
    RandomSolarize,
)

__all__ = [
    "AutoAugment",
    "Bucket",
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "CutMix",
    "GaussianBlur",
    "Grayscale",
    "MixUp",
    "ImagePipeline",
    "Normalize",
    "PackSequences",
    "Pad",
    "PadIfSmaller",
    "Plan",
    "RandAugment",
    "RandomAdjustSharpness",
    "RandomAffine",
    "RandomApply",
    "RandomAutocontrast",
    "RandomChoice",
    "RandomCrop",
    "RandomEqualize",
    "RandomErasing",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomInvert",
    "RandomOrder",
    "RandomPosterize",
    "RandomResize",
    "RandomResizedCrop",
    "RandomRotation",
    "RandomSolarize",
    "RandomVerticalFlip",
    "Resize",
    "ThreeAugment",
    "ToDtype",
    "TrivialAugmentWide",
    "apply_pil",
]

_SUPPORTED = (
    "RandomResizedCrop, Resize, CenterCrop, RandomResize, PadIfSmaller, RandomCrop, RandomHorizontalFlip, "
    "then optionally augmentations (TrivialAugmentWide, RandAugment, AutoAugment, ThreeAugment, ColorJitter, "
    "RandomGrayscale, Grayscale, GaussianBlur, RandomSolarize, RandomPosterize, RandomEqualize, "
    "RandomAutocontrast, RandomAdjustSharpness, RandomInvert, RandomErasing, RandomRotation, RandomAffine, "
    "RandomVerticalFlip, RandomHorizontalFlip, RandomApply, RandomChoice, RandomOrder), then optionally "
    "ToDtype and Normalize (in a list or Compose)"
)


def __getattr__(name: str) -> Any:
    """``T.ToTensor()`` and the like (torchvision names this module does not have): an AttributeError that says
    what to write instead. (A module attribute that is missing must raise AttributeError: ``hasattr`` and
    ``from ... import`` rely on it.)"""
    if name in _torchvision.INSTEAD:
        raise AttributeError(f"fastload.transforms has no {name}: {_torchvision.INSTEAD[name]}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


class Compose:
    """A sequence of transforms, applied in order (as ``torchvision.transforms.Compose``)."""

    def __init__(self, transforms: Sequence[Any]) -> None:
        if not isinstance(transforms, (list, tuple)):
            raise TypeError(
                f"Compose(transforms={transforms!r}) should be given a list of transforms, "
                f"e.g. Compose([RandomResizedCrop(224), RandomHorizontalFlip()])"
            )
        self.transforms = list(transforms)

    def describe(self) -> dict[str, Any]:
        return {"name": "Compose", "transforms": [getattr(t, "describe", t.__repr__)() for t in self.transforms]}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Compose) and self.transforms == other.transforms

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "Compose(" + "".join(f"\n    {t}" for t in self.transforms) + "\n)"


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

    ``plan.take(lo, hi)``: the plan of samples ``lo .. hi-1``; ``plan.n``: how many samples.
    """

    __slots__ = ("crops", "flips", "out_hw", "augment", "seeds", "after_seeds", "interp", "erase")

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
    ) -> None:
        self.crops, self.flips, self.out_hw, self.augment = crops, flips, out_hw, augment
        self.seeds, self.after_seeds, self.interp, self.erase = seeds, after_seeds, interp, erase

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
        return Plan(self.crops[lo:hi], self.flips[lo:hi], self.out_hw[lo:hi], augment, seeds, after, interp, erase)

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
        )

    def __repr__(self) -> str:
        extra = "" if self.augment is None else f", augment={len(self.augment.steps)} steps"
        return f"Plan({self.n} samples{extra})"


class _State:
    """The batch's virtual images while planning (see "Composition" in the module docstring)."""

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
    )

    def __init__(self, heights: np.ndarray, widths: np.ndarray, checking: bool = False) -> None:
        self.src_h, self.src_w = heights, widths
        self.h, self.w = heights, widths
        self.oy = self.ox = np.zeros(heights.shape[0])
        self.sy = self.sx = np.ones(heights.shape[0])
        self.flip = np.zeros(heights.shape[0], dtype=bool)
        self.interp = np.zeros(heights.shape[0], dtype=np.uint8)  # each sample's resize (RESIZE_CODES)
        self.pad, self.tile_hw = None, None  # a padded RandomCrop's windows (_augment/random_crop.py)
        self.rest: tuple = ()  # the crop-plan transforms after the one planning now
        self.index = np.arange(heights.shape[0])  # each row's sample: its position in the batch, or the dataset
        #: checking a dataset at open (ImagePipeline.check_sizes): what each step refused, instead of raising
        self.refusals: list[Refusal] | None = [] if checking else None
        self.smallest = False  # checking: a RandomResize planned its min_size (said in the messages)

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
        if self.pad is not None:  # a PadIfSmaller's Pending (per-sample bottom, right) or padded windows
            self.pad = self.pad.take_rows(keep)
        return keep

    def crop(self, top: np.ndarray, left: np.ndarray, h: np.ndarray, w: np.ndarray) -> None:
        left = np.where(self.flip, self.w - left - w, left)  # the crop was chosen on the mirror
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
        )


def _flatten(transforms: Any) -> list[Any]:
    """The pipeline's transforms in order: fastload's own, torchvision and timm objects converted to fastload's
    (``_augment/torchvision_convert.py``, ``timm_convert.py``), and any other callable as a ``UserTransform`` (run per
    sample)."""
    if isinstance(transforms, ImagePipeline):
        return (
            list(transforms.transforms)
            + list(transforms.augment)
            + list(transforms.fallback)
            + list(transforms.tensor.transforms)
            + list(transforms.erase)
            + list(transforms.after)
        )
    if isinstance(transforms, Compose):
        transforms = transforms.transforms
    if isinstance(transforms, (Transform, TensorTransform, Augment, UserTransform, NoiseErasing)):
        return [transforms]
    if not isinstance(transforms, (list, tuple)):
        if callable(transforms):
            return _foreign(transforms)
        raise TypeError(
            f"expected a list of transforms or a Compose, got {_type_name(transforms)}: "
            f"{transforms!r}. Supported: {_SUPPORTED} from fastload.transforms, or any callable "
            f"(run per sample)"
        )
    out: list[Any] = []
    for t in transforms:
        if isinstance(t, (Compose, list, tuple)):
            out.extend(_flatten(t))
        elif isinstance(t, (Transform, TensorTransform, Augment, UserTransform, NoiseErasing)):
            out.append(t)
        elif callable(t):
            out.extend(_foreign(t))
        else:
            raise TypeError(
                f"unsupported image transform {t!r} ({_type_name(t)}): not callable; supported: "
                f"{_SUPPORTED} from fastload.transforms, or any callable taking and returning a uint8 "
                f"CHW tensor (run per sample after the native part)"
            )
    return out


def _foreign(t: Any) -> list[Any]:
    """A callable that is not fastload's: its fastload equivalent (a torchvision or timm transform), else run per
    sample."""
    classes = sys.modules[__name__]  # this module's classes, by name
    converted = _torchvision.convert(t, classes)
    if converted is None:
        converted = _timm.convert(t, classes)
    if converted is None:
        return [UserTransform(t)]
    for c in converted:
        if isinstance(c, RandomErasing):  # after Normalize it may have to run as it is (_augment.lift_erasing)
            c.source = t
    return [x for c in converted for x in (_flatten(c) if isinstance(c, (list, Compose)) else [c])]


def _type_name(obj: Any) -> str:
    """``Compose`` for fastload's own classes, ``torchvision.transforms.transforms.Compose`` for anyone else's:
    a torchvision Compose must not read as the Compose that is supported."""
    t = type(obj)
    return (
        t.__name__
        if t.__module__.startswith("fastload") or t.__module__ == "builtins"
        else f"{t.__module__}.{t.__qualname__}"
    )


class ImagePipeline:
    """A list of geometric transforms folded into one crop box, output size and flip per sample.

    Augmentations after them (``augment``, see ``_augment/pipeline.py``) are drawn after the crop plan from the
    same generator and attached to it (``Plan.augment``). ``ToDtype``/``Normalize`` at the end of the list are
    kept apart in ``tensor`` (a ``TensorPipeline``): they run on whole batches, on the batch's device. Callables
    fastload does not know after them (``after``: timm's RandomErasing follows its Normalize) run per sample on the
    float image (``_augment/fallback.py``); ToDtype/Normalize then run on the CPU, before them."""

    def __init__(self, transforms: Any) -> None:
        items = _augment.lift_erasing(_flatten(transforms))  # torchvision's recipes erase after Normalize
        first_tensor = next((i for i, t in enumerate(items) if isinstance(t, TensorTransform)), len(items))
        first_after = next(
            (i for i, t in enumerate(items) if i > first_tensor and isinstance(t, UserTransform)), len(items)
        )
        tail = items[first_tensor:first_after]
        last = max((i for i, t in enumerate(tail) if isinstance(t, TensorTransform)), default=-1)
        #: erasings with noise after ToDtype/Normalize, run by the fill stage on the float rows (``noise_erasing.py``)
        self.erase: tuple[NoiseErasing, ...] = tuple(t for t in tail[last + 1 :] if isinstance(t, NoiseErasing))
        tail = [t for k, t in enumerate(tail) if k <= last or not isinstance(t, NoiseErasing)]
        bad = next((t for t in tail if not isinstance(t, TensorTransform)), None)
        if bad is not None:
            raise ValueError(
                f"ToDtype/Normalize must come after every geometric transform and augmentation: "
                f"{bad!r} comes after them, but fastload's own transforms run on the uint8 image in "
                f"the native decoder, so it must come before ToDtype/Normalize (only callables "
                f"fastload does not know run after them, per sample on the float image)"
            )
        late = next((t for t in items[first_after:] if not isinstance(t, UserTransform)), None)
        if late is not None:
            u = items[first_after]
            raise ValueError(
                f"{late!r} comes after {u.name}, which runs per sample on the float image after "
                f"ToDtype/Normalize; only other such callables may follow it: move {late!r} before "
                f"ToDtype/Normalize"
            )
        self.tensor = TensorPipeline(tail)
        #: callables after ToDtype/Normalize, run per sample on the float image (``fallback.AfterNormalize``)
        self.after: tuple[Any, ...] = tuple(AfterNormalize.of(t, self.tensor.dtype) for t in items[first_after:])
        if (self.erase or self.after) and not self.tensor.dtype.is_floating_point:
            raise ValueError(
                f"{(self.erase + self.after)[0].name} follows {tail[-1]!r}, which leaves uint8 pixels: put it before "
                f"ToDtype, or convert to a float dtype first"
            )
        native = items[:first_tensor]
        first_user = next((i for i, t in enumerate(native) if isinstance(t, UserTransform)), len(native))
        after = next((t for t in native[first_user:] if not isinstance(t, UserTransform)), None)
        if after is not None:
            u = native[first_user]
            why = f" ({u.reason})" if u.reason else ""
            fix = "give it parameters fastload converts (the reason above), or " if u.reason else ""
            raise ValueError(
                f"{after!r} comes after {u.name}{why}, which fastload runs per sample on the decoded image "
                f"after the native part (decode, crop, resize, flip and fastload's augmentations); "
                f"{fix}move {u.name} after {after!r} (only other such callables and ToDtype/Normalize "
                f"may follow it)"
            )
        #: transforms fastload does not know, run per sample on the rows after the decoder (_augment/fallback.py)
        self.fallback: tuple[UserTransform, ...] = tuple(native[first_user:])
        crops, augment = _augment.split(native[:first_user], Transform, RandomHorizontalFlip)
        self.transforms: tuple[Transform, ...] = tuple(crops)
        self.augment: tuple[Augment, ...] = tuple(augment)
        hw: tuple[int, int] | None = None
        for t in self.transforms:
            hw = t._static_size(hw)
        self._output_size = hw

    @property
    def batch_tensor(self) -> TensorPipeline:
        """The ToDtype/Normalize left to run on the collated batch (on its device): ``tensor``, or none when the
        fill stage ran them on the CPU for the callables after them (``after``)."""
        return TensorPipeline(()) if self.on_floats else self.tensor

    @property
    def on_floats(self) -> bool:
        """Whether the fill stage converts and normalizes the rows on the CPU, for what runs on the float image
        (``erase``, then ``after``), so that the batch leaves as those floats."""
        return bool(self.erase or self.after)

    @property
    def output_size(self) -> tuple[int, int] | None:
        """The (H, W) every sample comes out as, or None if it depends on the source size."""
        return self._output_size

    def plan(self, heights: np.ndarray, widths: np.ndarray, rng: Any) -> Plan:
        """Plan a batch of images of sizes ``heights[i] x widths[i]``, drawing only from ``rng``: a numpy
        ``Generator`` (the whole batch from one stream) or the loader's ``_draws.SampleDraws`` (each sample from
        its own (seed, epoch, index) key, whatever batch it is in)."""
        h, w = np.asarray(heights), np.asarray(widths)
        if h.ndim != 1 or h.shape != w.shape:
            raise ValueError(f"heights and widths must be 1-D of equal length, got shapes {h.shape} and {w.shape}")
        if h.size and not (np.issubdtype(h.dtype, np.integer) and np.issubdtype(w.dtype, np.integer)):
            raise TypeError(f"heights and widths must be integer arrays, got {h.dtype} and {w.dtype}")
        h, w = h.astype(np.int64), w.astype(np.int64)
        if h.size and min(h.min(), w.min()) <= 0:
            i = int(np.flatnonzero((h <= 0) | (w <= 0))[0])
            raise ValueError(f"sample {i} of the batch has an empty image ({int(h[i])}x{int(w[i])})")
        state = _State(h, w)
        for k, t in enumerate(self.transforms):
            state.rest = self.transforms[k + 1 :]
            t._apply(state, rng)
        plan = state.finish()
        if self.augment or state.pad:
            plan = _augment.plan_batch(self.augment, plan, rng, state.pad)
        if self.fallback:  # drawn last: a pipeline without them draws exactly as before
            plan.seeds = rng.integers(0, 2**63, size=plan.n, dtype=np.uint64)
        if self.after:  # and these after them
            plan.after_seeds = rng.integers(0, 2**63, size=plan.n, dtype=np.uint64)
        if self.erase:  # and these last
            plan.erase = tuple(t.plan(plan.out_hw, rng) for t in self.erase)
        return plan

    def check_sizes(self, heights: np.ndarray, widths: np.ndarray, chunk: int = 8192) -> str | None:
        """What no batch could plan of a dataset's samples of stored sizes ``heights[i] x widths[i]``, every such
        sample counted and the first named per step (``_transforms/size_check.py``); None when every sample plans."""
        return _size_check.check(self, heights, widths, _State, lambda t, state, rng: t._apply(state, rng), chunk)

    def run_fallback(self, image: np.ndarray, plan: Plan, k: int = 0) -> np.ndarray:
        """``ds[i]``: the per-sample transforms on sample ``k``'s decoded HWC uint8 ``image`` (in place)."""
        return run_sample(self.fallback, image, int(plan.seeds[k])) if self.fallback else image

    def run_after(self, image: Any, plan: Plan, k: int = 0) -> Any:
        """``ds[i]``: the erasings and per-sample transforms after ToDtype/Normalize on sample ``k``'s float CHW
        tensor."""
        if not self.on_floats:
            return image
        import torch

        if self.erase:
            self.run_erase(image.permute(1, 2, 0)[None], plan, k)
        if not self.after:
            return image
        hwc = image.permute(1, 2, 0).contiguous()
        run_sample(self.after, hwc.view(torch.uint8).numpy(), int(plan.after_seeds[k]))
        return hwc.permute(2, 0, 1)

    def run_erase(self, rows: Any, plan: Plan, lo: int = 0) -> None:
        """The erasings after ToDtype/Normalize (``erase``) on float rows ``rows`` (n, H, W, C), in place: the
        plan's samples ``lo .. lo + n - 1``."""
        for t, e in zip(self.erase, plan.erase):
            t.apply(rows, e.take(lo, lo + rows.shape[0]))

    def describe(self) -> list[dict[str, Any]]:
        return [t.describe() for t in self.transforms + self.augment + self.fallback + self.erase + self.after]

    def __eq__(self, other: object) -> bool:
        mine = (self.transforms, self.augment, self.fallback, self.tensor, self.erase, self.after)
        return isinstance(other, ImagePipeline) and mine == (
            other.transforms,
            other.augment,
            other.fallback,
            other.tensor,
            other.erase,
            other.after,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        every = self.transforms + self.augment + self.fallback + self.erase + self.after
        return f"ImagePipeline([{', '.join(map(repr, every))}])"


def apply_pil(pipeline: Any, image: Any, rng: np.random.Generator) -> Any:
    """Run a pipeline (or list/Compose) on one PIL image with PIL: crop → resize (bilinear or bicubic) → flip.

    The slow reference engine: it executes exactly the plan the native engine gets.
    """
    Image = pil("apply_pil")
    pipe = pipeline if isinstance(pipeline, ImagePipeline) else ImagePipeline(pipeline)
    p = pipe.plan(np.array([image.height]), np.array([image.width]), rng)

    resample = Image.Resampling.BICUBIC if p.interp_of(0) else Image.Resampling.BILINEAR

    def decode(crop: Sequence[int], out_hw: Sequence[int]) -> Any:
        top, left, h, w = (int(v) for v in crop)
        return image.crop((left, top, left + w, top + h)).resize((int(out_hw[1]), int(out_hw[0])), resample)

    out = decode(p.crops[0], p.out_hw[0])
    if p.augment is not None:  # padded windows, flips, the affine and the pixel operations: the PIL reference engine
        out = Image.fromarray(_augment.reference(lambda crop, hw: np.asarray(decode(crop, hw).convert("RGB")), p))
    elif p.flips[0]:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if pipe.fallback:  # the transforms fastload does not know, per sample as the loader runs them
        out = Image.fromarray(pipe.run_fallback(np.array(out.convert("RGB")), p))
    return out


from ._augment.random_crop import RandomCrop  # noqa: E402  (a crop-plan Transform: defined after its base)
from ._augment.pad_if_smaller import PadIfSmaller  # noqa: E402  (the same)
from ._augment.random_crop import padded_window  # noqa: E402  (CenterCrop's zero padding)
