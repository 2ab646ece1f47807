"""torchvision transform objects in ``fastload.open(transforms=...)``, converted to fastload's (issue 21 item 4).

A torchvision transform (``torchvision.transforms`` v1 or ``torchvision.transforms.v2``) with a fastload
equivalent is rebuilt as fastload's from its public attributes, so ``transforms={"image": tv_transforms}`` runs
in the native decoder. Classes are matched by their module and name; torchvision is never imported here (a
stand-in with torchvision's module, name and attributes converts the same, which is how the tests run without
it). The attribute names are torchvision 0.29's (``torchvision/transforms/transforms.py``, ``v2/_geometry.py``,
``v2/_color.py``, ``v2/_augment.py``, ``v2/_auto_augment.py``, ``v2/_container.py``, ``v2/_misc.py``,
``v2/_type_conversion.py``): v1 and v2 keep the same public names for what is converted here.

:func:`convert` returns None for an object that is not torchvision's; for one that is, its fastload
equivalents, or a ``UserTransform`` (run per sample, ``fallback.py``) whose ``reason`` says why it was not
converted: no fastload equivalent, or parameters fastload cannot reproduce (an AutoAugment policy other than
ImageNet, a bicubic RandomResizedCrop, ...: fastload's constructor's own error). Containers (RandomApply,
RandomChoice, RandomOrder) convert when all their members do, else run per sample whole.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from .fallback import UserTransform

__all__ = ["INSTEAD", "convert", "is_torchvision"]


def is_torchvision(t: Any) -> bool:
    mod = type(t).__module__
    return mod == "torchvision" or mod.startswith("torchvision.transforms")


def convert(t: Any, classes: Any) -> list | None:
    """``t``'s fastload equivalents (a nested list for a Compose: its members, converted in turn), a
    ``UserTransform`` with the reason when it has none, or None when ``t`` is not a torchvision transform.
    ``classes``: where fastload's transform classes are, by name (the ``fastload.transforms`` module, which
    calls this: importing it here would make the two modules import each other)."""
    if _is_reference_pad(t):  # its fill went through v2's _setup_fill_arg: a dict per type
        try:
            return [classes.PadIfSmaller(t.size, _per_kind(t.fill))]
        except (TypeError, ValueError) as e:
            return [UserTransform(t, f"not converted: {e}")]
    if not is_torchvision(t):
        return None
    name = type(t).__name__
    if name in _MANY:  # knowable now: run per sample it would fail the first batch
        raise ValueError(
            f"torchvision's {name} makes {_MANY[name]} images of each sample (a tuple), which a batch of "
            f"one image per sample cannot hold, so fastload has no {name}: load the images at the size "
            f"it crops from (e.g. T.Resize((256, 256))) and cut the crops from the batch in the loop, "
            f"torchvision.transforms.v2.functional.{name.lower().replace('crop', '_crop')}(images, size) "
            f"(it takes a batch)"
        )
    rule = _rules(classes).get(name)
    if rule is None:
        return [UserTransform(t, f"torchvision's {name} has no fastload equivalent")]
    try:
        return rule(t)
    except (TypeError, ValueError) as e:  # fastload's constructor refused a parameter: say which, run it as is
        return [UserTransform(t, f"not converted: {e}")]


# torchvision names ``fastload.transforms`` does not have, and what to write instead (``T.ToTensor()`` is the habit;
# ``transforms.__getattr__`` says it)
INSTEAD = {
    "ToTensor": "images leave fastload's decoder as uint8 (3, H, W) tensors already; for floats in [0, 1] as "
    "ToTensor made them write T.ToDtype(torch.float32, scale=True) (torchvision v2's replacement), "
    "at the end of the list, before a Normalize",
    "PILToTensor": "images leave fastload's decoder as uint8 (3, H, W) tensors already: leave it out",
    "ToImage": "images leave fastload's decoder as uint8 (3, H, W) tensors already: leave it out",
    "ToPILImage": "fastload's transforms run on its own engine, not on PIL images: leave it out (for a picture of "
    "ds[i], torchvision.transforms.functional.to_pil_image(ds[i][0]))",
    "ConvertImageDtype": "write T.ToDtype(torch.float32, scale=True) (torchvision v2's name for it)",
    "Lambda": "put the function itself in the list: any callable taking and returning a uint8 (3, H, W) tensor runs "
    "per sample after fastload's own transforms",
}
_MANY = {"FiveCrop": 5, "TenCrop": 10}  # torchvision transforms that return several images per sample


def _is_reference_pad(t: Any) -> bool:
    """torchvision's segmentation reference's ``PadIfSmaller`` (``references/segmentation/v2_extras.py``, a module
    of its scripts, not of the package): matched by its class's and module's names."""
    return type(t).__name__ == "PadIfSmaller" and type(t).__module__.rsplit(".", 1)[-1] == "v2_extras"


def _interp(t: Any) -> Any:
    return getattr(t, "interpolation", "nearest")


def _is_v2(t: Any) -> bool:
    return type(t).__module__.startswith("torchvision.transforms.v2")


def _v2_fill(fill: dict, kind: str) -> Any:
    """torchvision v2's ``_get_fill`` for the image (``tv_tensors.Image``) or a mask (``tv_tensors.Mask``): the
    kind's own entry (keys matched by class name), else ``"others"``, else None (zeros)."""
    for k, v in fill.items():
        if getattr(k, "__name__", None) == kind:
            return v
    return fill.get("others")


def _fill(t: Any) -> Any:
    """The image's ``fill`` (the policies: torchvision's auto-augment transforms fill the image only). v2 keeps the
    user's ``fill`` (a dict per tv_tensor type, or one value), v1 one value."""
    fill = getattr(t, "fill", None)
    return _v2_fill(fill, "Image") if isinstance(fill, dict) else fill


def _typed_fill(t: Any) -> Any:
    """RandomCrop's, RandomRotation's and RandomAffine's ``fill`` in fastload's per-kind spelling (``type_fill.py``),
    with torchvision's meaning: v2 fills every type with a plain value (``{"others": fill}``) and a dict's missing
    types with ``"others"`` or zeros, so a converted v2 transform fills a mask as torchvision would (a per-channel
    fill, which torchvision cannot apply to a mask, leaves the mask fastload's 255); v1 transforms never see masks,
    so their plain fill stays the image's."""
    fill = getattr(t, "fill", None)
    return _per_kind(fill) if _is_v2(t) else fill


def _per_kind(fill: Any) -> Any:
    """A v2 ``fill`` (one value, or a dict per tv_tensor type) in fastload's per-kind spelling."""
    if isinstance(fill, dict):
        bad = [k for k in fill if k != "others" and getattr(k, "__name__", None) not in ("Image", "Mask")]
        if bad:
            raise ValueError(
                f"fill={fill!r} has a fill for {bad[0]!r}; fastload fills images and masks only "
                f"(tv_tensors.Image, tv_tensors.Mask, 'others')"
            )
        image, mask = _v2_fill(fill, "Image"), _v2_fill(fill, "Mask")
    else:
        image = mask = fill
    if isinstance(mask, (list, tuple)) and len(mask) != 1:
        return image
    return {"image": image, "mask": 0 if mask is None else mask}


def _padding(t: Any) -> Any:
    """RandomCrop's padding as its argument's [left, top, right, bottom]: v2 keeps [left, right, top, bottom]
    (``_parse_pad_padding``); v1 keeps the argument."""
    pad = t.padding
    if pad is not None and type(t).__module__.startswith("torchvision.transforms.v2"):
        left, right, top, bottom = pad
        pad = [left, top, right, bottom]
    return pad


def _members(t: Any, what: str, classes: Any) -> list:
    """A container's members, converted; a member with no native equivalent makes the container run per sample."""
    out = []
    for m in list(t.transforms):
        converted = convert(m, classes)
        if converted is None and callable(m) and type(m).__module__.startswith("fastload"):
            converted = [m]
        if converted is None or any(isinstance(c, (UserTransform, list)) for c in converted):
            raise ValueError(f"its member {m!r} has no fastload equivalent, so the whole {what} runs per sample")
        out.extend(converted)
    return out


@functools.lru_cache(maxsize=None)
def _rules(T: Any) -> dict[str, Callable[[Any], list]]:
    """The conversion of each torchvision class with an equivalent, by class name; ``T``: fastload's classes."""

    def dtype_of(t: Any) -> Any:
        dtype = t.dtype
        if isinstance(dtype, dict):  # v2.ToDtype({tv_tensors.Image: torch.float32, "others": None, ...})
            # what v2 applies to an image: its Image entry, else a plain tensor's, else "others" (None: unchanged)
            by_name = {getattr(k, "__name__", str(k)): v for k, v in dtype.items()}
            image = next((by_name[n] for n in ("Image", "Tensor", "others") if n in by_name), None)
            if image is None:
                raise ValueError(f"ToDtype(dtype={dtype!r}): give a dtype for images")
            dtype = image
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"dtype={dtype!r} is not a torch.dtype")
        return dtype

    def choice_p(t: Any) -> Any:
        p = getattr(t, "p", None)
        return None if p is None else list(p)

    return {
        "Compose": lambda t: [list(t.transforms)],
        "RandomResizedCrop": lambda t: [
            T.RandomResizedCrop(t.size, t.scale, t.ratio, t.interpolation, getattr(t, "antialias", True))
        ],
        "Resize": lambda t: [T.Resize(t.size, t.interpolation, t.max_size, getattr(t, "antialias", True))],
        "CenterCrop": lambda t: [T.CenterCrop(t.size)],
        "RandomResize": lambda t: [
            T.RandomResize(t.min_size, t.max_size, t.interpolation, getattr(t, "antialias", True))
        ],
        "RandomCrop": lambda t: [T.RandomCrop(t.size, _padding(t), t.pad_if_needed, _typed_fill(t), t.padding_mode)],
        "RandomHorizontalFlip": lambda t: [T.RandomHorizontalFlip(t.p)],
        "RandomVerticalFlip": lambda t: [T.RandomVerticalFlip(t.p)],
        "RandomRotation": lambda t: [T.RandomRotation(t.degrees, _interp(t), t.expand, t.center, _typed_fill(t))],
        "RandomAffine": lambda t: [
            T.RandomAffine(t.degrees, t.translate, t.scale, t.shear, _interp(t), _typed_fill(t), t.center)
        ],
        "ColorJitter": lambda t: [T.ColorJitter(t.brightness, t.contrast, t.saturation, t.hue)],
        "Grayscale": lambda t: [T.Grayscale(t.num_output_channels)],
        "RandomGrayscale": lambda t: [T.RandomGrayscale(t.p)],
        "GaussianBlur": lambda t: [T.GaussianBlur(t.kernel_size, t.sigma)],
        "RandomSolarize": lambda t: [T.RandomSolarize(t.threshold, t.p)],
        "RandomPosterize": lambda t: [T.RandomPosterize(t.bits, t.p)],
        "RandomEqualize": lambda t: [T.RandomEqualize(t.p)],
        "RandomAutocontrast": lambda t: [T.RandomAutocontrast(t.p)],
        "RandomAdjustSharpness": lambda t: [T.RandomAdjustSharpness(t.sharpness_factor, t.p)],
        "RandomInvert": lambda t: [T.RandomInvert(t.p)],
        # v2 keeps value="random" as None
        "RandomErasing": lambda t: [T.RandomErasing(t.p, t.scale, t.ratio, "random" if t.value is None else t.value)],
        "RandomApply": lambda t: [T.RandomApply(_members(t, "RandomApply", T), t.p)],
        "RandomChoice": lambda t: [T.RandomChoice(_members(t, "RandomChoice", T), choice_p(t))],
        "RandomOrder": lambda t: [T.RandomOrder(_members(t, "RandomOrder", T))],
        "RandAugment": lambda t: [
            T.RandAugment(t.num_ops, t.magnitude, t.num_magnitude_bins, t.interpolation, _fill(t))
        ],
        "TrivialAugmentWide": lambda t: [T.TrivialAugmentWide(t.num_magnitude_bins, t.interpolation, _fill(t))],
        "AutoAugment": lambda t: [T.AutoAugment(t.policy, t.interpolation, _fill(t))],
        "Normalize": lambda t: [T.Normalize(list(t.mean), list(t.std))],
        # dtype conversions: images leave fastload's decoder as uint8 CHW, what PILToTensor/ToImage make
        "ToDtype": lambda t: [T.ToDtype(dtype_of(t), bool(getattr(t, "scale", False)))],
        "ConvertImageDtype": lambda t: [T.ToDtype(dtype_of(t), scale=True)],
        "ToTensor": lambda t: [T.ToDtype(torch.float32, scale=True)],  # uint8 -> float in [0, 1], as ToTensor
        "PILToTensor": lambda t: [],
        "ToImage": lambda t: [],
        "ToImageTensor": lambda t: [],
        "ToPureTensor": lambda t: [],
    }
