"""The augmentations in ``fastload.open(transforms=...)``: split off an image pipeline, planned per batch.

An image field's list reads as torchvision's: crops, resizes and flips first (``fastload.transforms``'
RandomResizedCrop, Resize, CenterCrop, RandomHorizontalFlip, folded into the crop plan the decoder executes
while decoding), then the augmentations of this package (policies, colour, tone, blur, erasing, rotations and
affines, vertical flips, combinators), then ToDtype/Normalize. :func:`split` divides the list;
:func:`plan_batch` draws the augmentations for a batch from the batch's draws, after the crop plan and from
the same draws (the loader's are per sample: ``_draws.py``; so seed, resume and num_workers-independence hold as for
the crop plan), and attaches them
with ``Plan.with_augment``; the native decoder executes them on each output tile right after decoding it.
:func:`reference` is ``ds[i]``'s engine for the augmentation: PIL (``engine_pil.run_pil``) on the decoded tile.
A padded ``RandomCrop`` (``random_crop.py``; or any RandomCrop right after a ``PadIfSmaller``,
``pad_if_smaller.py``) also makes an augmentation plan: its windows travel in the plan's geometry
(``padding.Padding``).

A ``RandomHorizontalFlip`` after the first augmentation is planned as this package's flip (the same draw: one
uniform per sample, ``< p``), so that it follows a rotation as torchvision's would (composed into the matrix).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from . import color, filters
from .geometry import RandomHorizontalFlip as _TileFlip
from .padding import assemble
from .pad_if_smaller import PadIfSmaller
from .plan import Augment, PlanBuilder
from .random_crop import RandomCrop

__all__ = ["check_channels", "lift_erasing", "plan_batch", "reference", "split"]


def lift_erasing(items: Sequence[Any]) -> list:
    """``items`` with each ``RandomErasing`` that follows ToDtype/Normalize planned where it can run.

    torchvision's recipes erase last, on the normalized float tensor (``..., ToTensor(), Normalize(...),
    RandomErasing(p)``): the erased pixels hold ``value`` in normalized units. A constant ``value`` is erased on
    the uint8 tile: it is mapped back through the ToDtype/Normalize before it (``v * std + mean``, times 255
    after a scaling ToDtype) and rounded to a pixel level, so the erased area normalizes to within half a level
    of ``value`` (0.5 / 255 / std). ``value="random"`` (normal noise in normalized units) has no such mapping: it
    becomes a ``noise_erasing.NoiseErasing`` (per pixel and channel, as torchvision's), which the fill stage runs
    on the normalized float rows, as it does timm's converted erasings (``timm_convert.py``). A constant erasing
    after such a one becomes a NoiseErasing of mode ``'const'`` with its ``value`` in normalized units, erased on
    the float rows after it, in order, as torchvision applies them (lifted onto the tile it would come first). A
    NoiseErasing must follow ToDtype/Normalize and no callable run on the float image; elsewhere the library's own
    object runs per sample (``UserTransform``; fastload's own is refused: so is a constant erasing after such a
    callable). Anything else after ToDtype/Normalize is left for the
    caller (callables run per sample on the float image, ``fallback.AfterNormalize``; anything else is
    refused)."""
    from .._transforms.tensor import Normalize, TensorTransform, ToDtype
    from .fallback import UserTransform
    from .noise_erasing import NoiseErasing

    first = next((i for i, t in enumerate(items) if isinstance(t, TensorTransform)), len(items))
    head = [_as_is(t, "it comes before ToDtype/Normalize") if isinstance(t, NoiseErasing) else t for t in items[:first]]
    tail: list = []
    before: list = []
    per_sample = next((t for t in head if isinstance(t, UserTransform)), None)
    callable_after = False  # a callable in the tail (run per sample on the float image)
    noise = False  # a NoiseErasing in the tail (a constant erasing after it cannot be lifted before it)
    for t in items[first:]:
        if isinstance(t, TensorTransform):
            before.append(t)
            tail.append(t)
            continue
        if isinstance(t, filters.RandomErasing) and t.value == "random" and not callable_after:
            t = NoiseErasing(
                t.p, t.scale, (math.log(t.ratio[0]), math.log(t.ratio[1])), "pixel", source=getattr(t, "source", None)
            )
        if isinstance(t, NoiseErasing):
            tail.append(_as_is(t, "it follows a callable run per sample on the float image") if callable_after else t)
            callable_after = callable_after or not isinstance(tail[-1], NoiseErasing)
            noise = True
            continue
        source = getattr(t, "source", None)  # the torchvision/timm object it was converted from (``_foreign``)
        if isinstance(t, filters.RandomErasing) and callable_after and source is not None:
            tail.append(UserTransform(source, "not converted: it follows a callable run per sample on the float image"))
            continue
        if isinstance(t, filters.RandomErasing) and noise and not callable_after:
            # a constant after a noise erasing: lifted onto the uint8 tile it would run before the noise; erased on
            # the float rows in order with it instead, with its value in normalized units as torchvision does
            ratio = (math.log(t.ratio[0]), math.log(t.ratio[1]))
            tail.append(NoiseErasing(t.p, t.scale, ratio, "const", source=source, value=t.value))
            continue
        if not isinstance(t, filters.RandomErasing) or callable_after:
            tail.append(t)  # (an erasing after one run on the float image stays after it: refused there)
            callable_after = True
            continue
        if per_sample is not None:
            if source is not None:  # the library's own object, per sample on the float image
                why = (
                    f"it follows {per_sample.name}, which runs per sample after the native decoder, so it cannot "
                    f"be planned before it there"
                )
                tail.append(UserTransform(source, f"not converted: {why}"))
                callable_after = True
                continue
            raise ValueError(
                f"{t!r} after {before[-1]!r} would have to be planned in the native decoder before "
                f"{per_sample.name}, which runs per sample after it: put RandomErasing before "
                f"{per_sample.name}, or pass a callable"
            )
        v = np.broadcast_to(np.asarray(t.value, dtype=np.float64), (3,)).copy()
        for tt in reversed(before):
            if isinstance(tt, Normalize):
                v = v * np.asarray(tt.std) + np.asarray(tt.mean)
            elif isinstance(tt, ToDtype) and tt.scale and tt.dtype.is_floating_point:
                v = v * 255.0
        pixels = tuple(int(x) for x in np.clip(np.rint(v), 0, 255))
        head.append(filters.RandomErasing(t.p, t.scale, t.ratio, value=pixels))
    return head + tail


def _as_is(t: Any, why: str) -> Any:
    """A NoiseErasing that cannot run where it stands: the library's object it came from, per sample."""
    from .fallback import UserTransform

    if t.source is None:
        raise ValueError(f"{t!r}: {why}; it erases the normalized float image, so put it right after ToDtype/Normalize")
    return UserTransform(t.source, f"not converted: {why}")


def split(items: Sequence[Any], crop_type: type, flip_type: type) -> tuple[list, list]:
    """``(crop-plan transforms, augmentations)`` of a flattened list without ToDtype/Normalize. ``crop_type`` is
    ``fastload.transforms.Transform`` (the crop plan's), ``flip_type`` its RandomHorizontalFlip."""
    first = next((i for i, t in enumerate(items) if isinstance(t, Augment)), len(items))
    crops, augment = list(items[:first]), []
    padded = next((t for t in crops if getattr(t, "pads", False)), None)
    if padded is not None:
        after = crops[crops.index(padded) + 1 :]
        if isinstance(padded, PadIfSmaller):
            padded, after = _crop_after(padded, after)
        bad = next((t for t in after if not isinstance(t, flip_type)), None)
        if bad is not None:
            raise ValueError(
                f"{bad!r} comes after {padded!r}: only RandomHorizontalFlip may follow a padded "
                f"RandomCrop among the crops and resizes (the decoder pads the window it decodes); "
                f"resize before the RandomCrop"
            )
    for t in items[first:]:
        if isinstance(t, flip_type):
            augment.append(_TileFlip(t.p))
        elif isinstance(t, crop_type):
            raise ValueError(
                f"{t!r} comes after {items[first]!r}: crops and resizes must come before the "
                f"augmentations (the decoder crops and resizes while decoding; the augmentations run "
                f"on the output tile), as in torchvision's recipes"
            )
        else:
            augment.append(t)
    check_channels(augment)
    return crops, augment


def _crop_after(pad: PadIfSmaller, after: list) -> tuple[Any, list]:
    """The RandomCrop that must come right after a PadIfSmaller (it executes the padding as its window) and what
    follows that crop."""
    crop = after[0] if after else None
    if not isinstance(crop, RandomCrop):
        why = "nothing" if crop is None else repr(crop)
        raise ValueError(
            f"{pad!r} is followed by {why}: a RandomCrop must come right after it (the decoder pads only "
            f"the window a RandomCrop cuts from the padded image, as torchvision's segmentation "
            f"reference uses it)"
        )
    if crop.pads and (not np.array_equal(crop._fill, pad._fill) or crop._mask_fill != pad._mask_fill):
        raise ValueError(
            f"{crop!r} pads with another fill than {pad!r} before it: give both the same fill (one "
            f"fill per padded window)"
        )
    return crop, after[1:]


def check_channels(augment: Sequence[Any]) -> None:
    """Refuse Grayscale(num_output_channels=1) anywhere in the augmentations: image rows have 3 channels."""
    for t in augment:
        if isinstance(t, color.Grayscale) and t.num_output_channels == 1:
            raise ValueError(
                "Grayscale(num_output_channels=1) would make the batch single-channel, but image "
                "fields decode to 3 channels (RGB); use Grayscale(num_output_channels=3) (three equal "
                "channels) or RandomGrayscale"
            )
        check_channels(getattr(t, "transforms", ()))


def plan_batch(augment: Sequence[Augment], plan: Any, rng: np.random.Generator, pad: Any = None) -> Any:
    """``plan`` (a ``fastload.transforms.Plan``) with ``augment`` drawn for its samples from ``rng``; ``pad``: the
    crop plan's padded windows (``padding.Padding``), carried in the augmentation's geometry."""
    b = PlanBuilder.from_crop_plan(plan)
    b.pad = pad
    everyone = np.arange(b.n)
    for t in augment:
        t.plan(b, everyone, rng)
    return plan.with_augment(b.finish())


def reference(decode: Any, plan: Any) -> np.ndarray:
    """``ds[i]``: the PIL reference engine's result of a one-sample plan. ``decode(crop, out_hw)`` gives the
    sample's crop box decoded and resized (not flipped: the reference flips it as the plan says); a padded window
    is assembled from its decoded box first, as the native decoder does."""
    from .engine_pil import run_pil

    crop = tuple(int(v) for v in plan.crops[0])
    pad = plan.augment.geometry.pad
    if pad is not None and pad.active[0]:
        box = decode(crop, tuple(int(v) for v in pad.decode_hw[0]))
        tile = assemble(box, pad.rows[0], pad.cols[0], pad.fill[0], flip=False)
    else:
        tile = decode(crop, tuple(int(v) for v in plan.out_hw[0]))
    return np.array(run_pil(tile, plan.augment, 0))  # writable: ds[i] hands it to torch
