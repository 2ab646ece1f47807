"""Image transforms: declared on a dataset, planned here, executed by an engine.

The four geometric transforms (``_transforms/geometric.py``) follow ``torchvision.transforms`` (v1) names,
defaults and semantics. They never touch pixels themselves: :class:`ImagePipeline` folds a whole list of them into
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
inside the image (``Plan.crops``). With no resize before a crop (e.g. ``RandomResizedCrop`` first) the box is
exact. A resize followed by crops of its whole pixels (``Resize(256)``, ``CenterCrop(224)``: the usual evaluation
transform) is also kept as torchvision computes it, ``Plan.frames``: the box the resize reads, the size it resizes
it to, and the output's window in that; the native decoder resamples exactly that window of the whole resize
(PIL's weights, taps outside the window included), so its pixels are torchvision's where the rounded box would be
off by a sub-pixel shift. A second resize after a crop (fused into one resample) keeps the rounded box.

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

The plan and its planning state are ``_transforms/crop_plan.py``'s; this module assembles the pipeline
(:class:`ImagePipeline`: the crop plan, the augmentations, the transforms fastload does not know, and
``ToDtype``/``Normalize`` kept apart in a ``TensorPipeline``, ``_transforms/tensor.py``) and is the public surface.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import numpy as np

from ._install import pil
from ._transforms.base import Transform, plan_step, static_size
from ._transforms.crop_plan import Plan, _State  # the crop plan and its planning state
from ._transforms.geometric import CenterCrop, RandomHorizontalFlip, RandomResizedCrop, Resize
from ._transforms.tensor import Normalize, TensorPipeline, TensorTransform, ToDtype
from ._transforms.sequences import Bucket, Pad, PackSequences  # variable-length fields, see _transforms/sequences.py

# The augmentations (issue 21), under torchvision v2's names; planned after the crop plan (_augment/pipeline.py).
from ._augment import pipeline as _augment
from ._augment import timm_convert as _timm
from ._augment import torchvision_convert as _torchvision
from ._augment.fallback import AfterNormalize, UserTransform, run_sample  # transforms fastload does not know
from ._augment.noise_erasing import NoiseErasing  # erasing with noise after Normalize, in the fill stage
from ._transforms import size_check as _size_check  # ImagePipeline.check_sizes: what fastload.open refuses
from ._augment.color import ColorJitter, Grayscale, RandomGrayscale
from ._augment.combinators import RandomApply, RandomChoice, RandomOrder
from ._augment.filters import GaussianBlur, RandomErasing
from ._augment.mix import CutMix, MixUp  # batch transforms: fastload.open(batch_transforms=...)
from ._augment.geometry import RandomAffine, RandomRotation, RandomVerticalFlip
from ._augment.pad_if_smaller import PadIfSmaller  # crop-plan Transforms defined beside their planning code
from ._augment.plan import Augment
from ._augment.random_crop import RandomCrop
from ._augment.random_resize import RandomResize
from ._augment.policies import AutoAugment, RandAugment, ThreeAugment, TrivialAugmentWide
from ._augment.tone import (
    RandomAdjustSharpness,
    RandomAutocontrast,
    RandomEqualize,
    RandomInvert,
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
        if isinstance(bad, NoiseErasing):
            raise ValueError(
                f"{bad!r} comes before {tail[last]!r}: an erasing in normalized units runs on the float image "
                f"that the last ToDtype/Normalize leaves, so it must come after every ToDtype/Normalize"
            )
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
            hw = static_size(t, hw)
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
            plan_step(t, state, rng)
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
        return _size_check.check(self, heights, widths, _State, plan_step, chunk)

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
        # every stage, as __eq__ compares them: the repr keys num_workers='auto''s cache (_front/autotune.py) and
        # tells two pipelines apart in messages (fastload.mix's refusal)
        steps = self.transforms + self.augment + self.fallback + self.tensor.transforms + self.erase + self.after
        return f"ImagePipeline([{', '.join(map(repr, steps))}])"


def apply_pil(pipeline: Any, image: Any, rng: np.random.Generator) -> Any:
    """Run a pipeline (or list/Compose) on one PIL image with PIL: crop → resize (bilinear or bicubic) → flip (a
    resize followed by a crop of its pixels, ``Plan.frames``: resize → crop, as torchvision runs it).

    The slow reference engine: it executes exactly the plan the native engine gets.
    """
    Image = pil("apply_pil")
    pipe = pipeline if isinstance(pipeline, ImagePipeline) else ImagePipeline(pipeline)
    p = pipe.plan(np.array([image.height]), np.array([image.width]), rng)

    resample = Image.Resampling.BICUBIC if p.interp_of(0) else Image.Resampling.BILINEAR
    frame = p.frame_of(0)  # a resize then a crop of its whole pixels, as torchvision computes it (Plan.frames)

    def decode(crop: Sequence[int], out_hw: Sequence[int]) -> Any:
        oh, ow = int(out_hw[0]), int(out_hw[1])
        if frame is not None:  # never with a padded window (whose decode size is not out_hw)
            top, left, h, w, rh, rw, y, x = frame
            resized = image.crop((left, top, left + w, top + h)).resize((rw, rh), resample)
            return resized.crop((x, y, x + ow, y + oh))
        top, left, h, w = (int(v) for v in crop)
        return image.crop((left, top, left + w, top + h)).resize((ow, oh), resample)

    out = decode(p.crops[0], p.out_hw[0])
    if p.augment is not None:  # padded windows, flips, the affine and the pixel operations: the PIL reference engine
        out = Image.fromarray(_augment.reference(lambda crop, hw: np.asarray(decode(crop, hw).convert("RGB")), p))
    elif p.flips[0]:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if pipe.fallback:  # the transforms fastload does not know, per sample as the loader runs them
        out = Image.fromarray(pipe.run_fallback(np.array(out.convert("RGB")), p))
    return out
