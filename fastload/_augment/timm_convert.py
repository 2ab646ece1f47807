"""timm's transform objects in ``fastload.open(transforms=...)``, converted to fastload's (issue 30 item 1).

``timm.data.create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5", re_prob=0.25)`` (the
DeiT/ViT recipe) is a torchvision ``Compose`` of timm's own objects and torchvision's: torchvision's convert in
``torchvision_convert.py``, timm's here, each rebuilt as fastload's from its public attributes where fastload
has an exact equivalent. Classes are matched by module and name; timm is never imported here (a stand-in with
timm's module, name and attributes converts the same, which is how the tests run without it). The attribute
names are timm 1.0's (``timm/data/transforms.py``, ``random_erasing.py``, ``auto_augment.py``).

What converts, and why it is the same:

- ``RandomResizedCropAndInterpolation`` -> ``RandomResizedCrop``: its ``get_params`` draws as torchvision's
  (10 tries of a uniform area and a log-uniform ratio, rounded sides, a uniform position, else the centre crop
  clamped to the ratio range; timm does not reject a side that rounds to 0 pixels, which only a scale near 0
  can draw) and resizes with PIL: bilinear, bicubic (the native resize is PIL's, a = -0.5, antialiased), or
  ``interpolation='random'`` (timm's ``train.py`` default): bilinear or bicubic per image with probability 1/2,
  drawn per sample (``fastload/_draws.py``) where timm calls ``random.choice``.
- ``RandomErasing`` in mode ``'const'`` with one box (``max_count`` 1) -> ``RandomErasing(value=0)`` after
  Normalize, which the pipeline plans on the uint8 image (``pipeline.lift_erasing``): timm draws the box as
  torchvision does (``p``, a uniform area in ``[min_area, max_area]``, a log-uniform aspect, rounded sides
  smaller than the image, a uniform position). Modes ``'rand'``/``'pixel'`` (normal noise in normalized units,
  per channel / per pixel and channel) and several boxes (``min_count``..``max_count``, each box's area divided
  by the count) -> ``noise_erasing.NoiseErasing``: the same box draws per sample, written into the normalized
  float rows by the fill stage (torch's N(0, 1) noise: timm's distribution, not its values). ``num_splits``
  only acts on a batch (timm's prefetcher); called on one image, as a transform, timm ignores it.
- ``MaybeToTensor`` -> ``ToDtype(float32, scale=True)`` (torchvision's ``ToTensor``); ``MaybePILToTensor``,
  ``ToNumpy`` -> nothing (fastload's decoder gives the uint8 CHW image they make; the loader collates it as a
  tensor, as timm's ``fast_collate`` does with ``ToNumpy``'s arrays); timm's ``ToTensor(dtype)`` ->
  ``ToDtype(dtype)`` (no rescaling).
- timm's ``RandAugment`` and ``AutoAugment`` (all its policies but ``3a``) -> ``TimmRandAugment`` /
  ``TimmAutoAugment`` (``timm_policies.py``): timm's op set (``SolarizeAdd``, ``TranslateXRel``, the increasing
  and original variants), magnitude rules (``mstd``, ``mmax``, ``inc``), per-op probabilities, ``img_mean`` fill
  and per-op interpolation (bilinear, bicubic, or timm's random choice of the two), read from its ``AugmentOp``
  objects. ``AugMixAugment`` (a blend of several augmented copies) and the ``3a`` ops (PIL's blur) have no native
  equivalent: they run per sample on an RGB PIL image of the decoded tile (as timm calls them), named in the
  warning.

:func:`convert` returns None for an object that is not timm's; for one that is, its fastload equivalents, or a
``UserTransform`` whose ``reason`` says why it was not converted.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import torch

from .fallback import UserTransform
from .noise_erasing import NoiseErasing
from .._ring import warn_once
from .timm_policies import _RESAMPLE, GEOMETRIC, RANDOM, TimmAutoAugment, TimmOp, TimmRandAugment, check_ops

__all__ = ["convert", "is_timm"]


def is_timm(t: Any) -> bool:
    mod = type(t).__module__
    return mod == "timm" or mod.startswith("timm.")


def _takes_pil(t: Any) -> bool:
    """Whether timm calls ``t`` with a PIL image: its transforms before ``ToTensor`` (``timm.data.transforms``,
    ``timm.data.auto_augment``); its ``RandomErasing`` (and anything else) takes the tensor."""
    mod = type(t).__module__
    return mod.startswith("timm.data.transforms") or mod.startswith("timm.data.auto_augment")


def convert(t: Any, classes: Any) -> list | None:
    """``t``'s fastload equivalents, a ``UserTransform`` with the reason when it has none, or None when ``t`` is
    not timm's. ``classes``: fastload's transform classes by name (the ``fastload.transforms`` module)."""
    if not is_timm(t):
        return None
    name = type(t).__name__
    rule = _rules(classes).get(name)
    if rule is None:
        return [UserTransform(t, f"timm's {name} has no fastload equivalent", pil=_takes_pil(t))]
    try:
        return rule(t)
    except (TypeError, ValueError) as e:  # no exact equivalent for these parameters: say which, run it as is
        return [UserTransform(t, f"not converted: {e}", pil=_takes_pil(t))]


def _rrc(T: Any, t: Any) -> list:
    # bilinear, bicubic, or timm's 'random' (stored as the pair of modes it chooses from per image)
    return [T.RandomResizedCrop(t.size, tuple(t.scale), tuple(t.ratio), t.interpolation, True)]


def _erasing(T: Any, t: Any) -> list:
    lo, hi = t.log_aspect_ratio
    if not (t.per_pixel or t.rand_color) and (t.min_count, t.max_count) == (1, 1):
        return [T.RandomErasing(t.probability, (t.min_area, t.max_area), (math.exp(lo), math.exp(hi)), value=0)]
    mode = "pixel" if t.per_pixel else "rand" if t.rand_color else "const"
    return [NoiseErasing(t.probability, (t.min_area, t.max_area), (lo, hi), mode, (t.min_count, t.max_count), t)]


def _timm_op(op: Any) -> TimmOp:
    """timm's ``AugmentOp`` (its public attributes) as a :class:`TimmOp`."""
    resample = op.kwargs.get("resample", (2, 3))
    if isinstance(resample, (tuple, list)):
        if sorted(int(r) for r in resample) != [2, 3]:
            raise ValueError(f"{op.name} resamples at random among {resample!r}; fastload draws bilinear or bicubic")
        interpolation = RANDOM
    elif int(resample) in _RESAMPLE:
        interpolation = _RESAMPLE[int(resample)]
    else:
        raise ValueError(f"{op.name} resamples with {resample!r}; fastload's warp is nearest, bilinear or bicubic")
    fill = op.kwargs.get("fillcolor", (128, 128, 128))
    fill = (fill,) * 3 if isinstance(fill, (int, float)) else tuple(fill)
    return TimmOp(
        op.name,
        op.prob,
        op.magnitude,
        magnitude_std=op.magnitude_std,
        magnitude_max=op.magnitude_max,
        translate_pct=op.hparams.get("translate_pct", 0.45),
        translate_const=op.hparams.get("translate_const", 250),
        fill=fill,
        interpolation=interpolation,
    )


def _rand_augment(t: Any) -> list:
    check_ops([op.name for op in t.ops], "RandAugment")
    weights = t.choice_weights if t.choice_weights is not None else [1.0] * len(t.ops)
    drawn = [op.name for op, w in zip(t.ops, weights) if w > 0]
    if t.num_layers >= 2 and GEOMETRIC.intersection(drawn):  # a geometric op after another op, or drawn twice
        _warn_reordered(f"RandAugment(num_layers={t.num_layers})")
    return [TimmRandAugment([_timm_op(op) for op in t.ops], t.num_layers, t.choice_weights)]


def _auto_augment(t: Any) -> list:
    check_ops([op.name for sub in t.policy for op in sub], "AutoAugment")
    # a geometric op first in its sub-policy runs where timm runs it; one after any other op does not
    if any(GEOMETRIC.intersection(op.name for op in sub[1:]) for sub in t.policy):
        _warn_reordered("AutoAugment")
    return [TimmAutoAugment([[_timm_op(op) for op in sub] for sub in t.policy])]


def _warn_reordered(what: str) -> None:
    """The one difference from timm a native policy keeps (``timm_policies.py``'s docstring), said once."""
    warn_once(
        "timm-reordered",
        f"fastload: timm's {what} runs natively with a sample's geometric ops (Rotate, Shear*, Translate*) "
        f"before its colour ops and resampled once, where timm applies them in the drawn order: a sample that "
        f"draws a colour op before a geometric one, or two geometric ops, differs from timm's in the fill area "
        f"and by a resampling's rounding. To run timm's object exactly (per sample, slower), wrap it in a "
        f"function: lambda image: policy(image)",
        UserWarning,
    )


def _augmix(t: Any) -> list:
    raise ValueError(
        "timm's AugMixAugment blends several augmented copies of the image (Dirichlet/Beta weights), which a "
        "plan of one chain of operations per sample cannot express"
    )


@functools.lru_cache(maxsize=None)
def _rules(T: Any) -> dict[str, Callable[[Any], list]]:
    """The conversion of each timm class with an equivalent, by class name; ``T``: fastload's classes."""
    return {
        "RandomResizedCropAndInterpolation": functools.partial(_rrc, T),
        "RandomErasing": functools.partial(_erasing, T),
        "MaybeToTensor": lambda t: [T.ToDtype(torch.float32, scale=True)],
        "MaybePILToTensor": lambda t: [],
        "ToNumpy": lambda t: [],
        "ToTensor": lambda t: [T.ToDtype(t.dtype)],
        "RandAugment": _rand_augment,
        "AutoAugment": _auto_augment,
        "AugMixAugment": _augmix,
    }
