"""Batch transforms MixUp and CutMix, with soft labels, drawn from the batch's generator, run on its device.

As torchvision v2 defines them: one ``lam ~ Beta(alpha, alpha)`` per batch; each sample is mixed with its
neighbour ``roll(1, 0)`` (sample i with sample i - 1); labels become one-hot over ``num_classes`` and are mixed
the same way. MixUp: ``lam * x + (1 - lam) * rolled``. CutMix: a box centred on a uniformly drawn pixel with
half sides ``int(0.5 * sqrt(1 - lam) * W)`` (and H), clipped to the image, takes the rolled batch's pixels;
the labels use ``lam`` adjusted to the box's real area, ``1 - box_area / (H * W)``. Draws happen on the host
(:meth:`plan_batch`), so the same generator state gives the same result on any device.
``RandomChoice([MixUp(...), CutMix(...)])`` picks one per batch (see combinators.py).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["BatchMix", "CutMix", "MixPlan", "MixUp", "mix_labels", "resolve_batch"]


@dataclass(frozen=True)
class MixPlan:
    """One batch's mixing: ``lam`` for the images, ``label_lam`` for the labels, CutMix's box (x1, y1, x2, y2)."""

    kind: str
    lam: float
    label_lam: float
    box: tuple[int, int, int, int] | None = None


class _MixBase:
    def __init__(self, *, alpha: float = 1.0, num_classes: int | None = None) -> None:
        name = type(self).__name__
        if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not alpha > 0:
            raise ValueError(f"{name}: alpha={alpha!r} should be a positive number")
        if num_classes is not None and (
            isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1
        ):
            raise ValueError(
                f"{name}: num_classes={num_classes!r} should be a positive int (or None for labels "
                f"that are already one-hot or soft, shape (N, classes))"
            )
        self.alpha = float(alpha)
        self.num_classes = num_classes

    def describe(self) -> dict[str, Any]:
        return {"name": type(self).__name__, "alpha": self.alpha, "num_classes": self.num_classes}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(alpha={self.alpha}, num_classes={self.num_classes})"

    def plan_batch(self, n: int, hw: tuple[int, int], rng: np.random.Generator) -> MixPlan:
        raise NotImplementedError

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor, rng: np.random.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mix a batch: ``images`` (N, C, H, W) and ``labels`` (N,) class indices (or (N, classes) soft)."""
        _check_batch(images, labels, type(self).__name__)
        plan = self.plan_batch(images.shape[0], (images.shape[-2], images.shape[-1]), rng)
        return apply_mix(images, labels, plan, self.num_classes)


class MixUp(_MixBase):
    """Blend each image with its neighbour by ``lam ~ Beta(alpha, alpha)`` (float images)."""

    def plan_batch(self, n: int, hw: tuple[int, int], rng: np.random.Generator) -> MixPlan:
        lam = float(rng.beta(self.alpha, self.alpha))
        return MixPlan("mixup", lam, lam)


class CutMix(_MixBase):
    """Paste a box of each image's neighbour, the box's area drawn from ``lam ~ Beta(alpha, alpha)``."""

    def plan_batch(self, n: int, hw: tuple[int, int], rng: np.random.Generator) -> MixPlan:
        h, w = hw
        lam = float(rng.beta(self.alpha, self.alpha))
        r_x = int(rng.integers(0, w))
        r_y = int(rng.integers(0, h))
        r = 0.5 * math.sqrt(1.0 - lam)
        r_w_half, r_h_half = int(r * w), int(r * h)
        x1, y1 = max(r_x - r_w_half, 0), max(r_y - r_h_half, 0)
        x2, y2 = min(r_x + r_w_half, w), min(r_y + r_h_half, h)
        lam_adjusted = float(1.0 - (x2 - x1) * (y2 - y1) / (w * h))
        return MixPlan("cutmix", lam, lam_adjusted, (x1, y1, x2, y2))


def _check_batch(images: Any, labels: Any, name: str) -> None:
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(
            f"{name}: images should be a batched (N, C, H, W) tensor, got "
            f"{getattr(images, 'shape', type(images).__name__)}"
        )
    if not isinstance(labels, torch.Tensor) or labels.ndim not in (1, 2):
        raise ValueError(
            f"{name}: labels should be a tensor of shape (batch_size,) of class indices (or "
            f"(batch_size, classes) soft labels), got {getattr(labels, 'shape', type(labels).__name__)}"
        )
    if labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{name}: the batch size of the images does not match the labels': {images.shape[0]} != {labels.shape[0]}"
        )


def mix_labels(labels: torch.Tensor, plan: MixPlan, num_classes: int | None) -> torch.Tensor:
    """The float soft labels (N, classes) of a :class:`MixPlan`: one-hot class indices (or soft labels as
    given) mixed with their neighbour's as the images are, by ``label_lam``."""
    if labels.ndim == 1:
        if num_classes is None:
            raise ValueError(f"{plan.kind}: labels are class indices, so num_classes must be given")
        if labels.is_floating_point():
            raise ValueError(f"{plan.kind}: 1-D labels should be integer class indices, got {labels.dtype}")
        # Checked on the host only: on a GPU the check would stall the stream every batch (one_hot then fails
        # with a device-side assert instead).
        if (
            labels.device.type == "cpu"
            and labels.numel()
            and (int(labels.min()) < 0 or int(labels.max()) >= num_classes)
        ):
            raise ValueError(
                f"{plan.kind}: labels should be in [0, num_classes={num_classes}), got values from "
                f"{int(labels.min())} to {int(labels.max())}"
            )
        if labels.device.type == "cpu":
            # numpy, writing 2 values a row: torch's one_hot, roll, mul and add on (64, 1000) floats each
            # woke its intra-op threads, whose spinning against the decode threads cost about 3x the whole batch's
            # ToDtype/Normalize pass in CPU time. The same bits: rolled * (1 - lam) + own * lam in float32, where
            # each term is 0 or the float32 weight
            y = labels.numpy().astype(np.int64, copy=False)
            rows = np.arange(y.shape[0])
            out = np.zeros((y.shape[0], num_classes), np.float32)
            out[rows, np.roll(y, 1)] = np.float32(1.0 - plan.label_lam)
            out[rows, y] += np.float32(plan.label_lam)
            return torch.from_numpy(out)
        soft = torch.nn.functional.one_hot(labels.to(torch.int64), num_classes).to(torch.float32)
    else:
        soft = labels if labels.is_floating_point() else labels.to(torch.float32)
    return soft.roll(1, 0).mul(1.0 - plan.label_lam).add_(soft.mul(plan.label_lam))


def apply_mix(
    images: torch.Tensor, labels: torch.Tensor, plan: MixPlan, num_classes: int | None, out: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Execute a :class:`MixPlan` on the batch's device; returns new images and float soft labels. ``out``: where
    to write the images (same shape, dtype and layout as ``images``, not overlapping it); a new tensor if None;
    ``images`` itself for CutMix in place (only the box is read and written)."""
    soft = mix_labels(labels, plan, num_classes)
    # The neighbour roll(1, 0) is read through two slices (sample i from i - 1, sample 0 from the last) rather
    # than made: a rolled copy of the batch would be one more pass over its memory (the loop's 2% budget).
    if plan.kind == "mixup":
        if not images.is_floating_point():
            raise TypeError(
                f"MixUp blends images, so they should be float (after ToDtype/Normalize), got {images.dtype}"
            )
        if out is None:
            out = torch.empty_like(images)  # keeps the batch's memory format (channels_last)
        elif out is images:
            raise ValueError("MixUp cannot blend in place: each sample reads its neighbour's original pixels")
        # one pass: lam * image + (1 - lam) * neighbour, as lerp(neighbour, image, lam)
        torch.lerp(images[:-1], images[1:], plan.lam, out=out[1:])
        torch.lerp(images[-1:], images[:1], plan.lam, out=out[:1])
    elif out is images:
        # in place: each sample takes its neighbour's original box, so the boxes are rolled through a copy of
        # them (never sample by sample in place, which would hand sample 0's box on down the batch)
        x1, y1, x2, y2 = plan.box  # type: ignore[misc]
        box = images[..., y1:y2, x1:x2]
        box.copy_(box.roll(1, 0))
    else:
        x1, y1, x2, y2 = plan.box  # type: ignore[misc]
        out = images.clone() if out is None else out.copy_(images)
        out[1:, ..., y1:y2, x1:x2] = images[:-1, ..., y1:y2, x1:x2]
        out[:1, ..., y1:y2, x1:x2] = images[-1:, ..., y1:y2, x1:x2]
    return out, soft


# -- in the loader: fastload.open(..., batch_transforms=...) ------------------------------------------------
_BATCH_EXAMPLE = "batch_transforms=[T.RandomChoice([T.CutMix(num_classes=1000), T.MixUp(num_classes=1000)])]"


class BatchMix:
    """A dataset's batch transform in the loader: which batch entries are the images and the labels, the
    transform (MixUp, CutMix or RandomChoice over them), and the label field's name for messages.

    The fast path draws the plan in the caller's thread from the batch's own generator, after the
    per-sample plan's draws (``plan``; every image field on the fast path has a pipeline, so the batcher always
    asks for the generator; it travels with the slot from the fill stage, so seed,
    resume and num_workers-independence hold as for the per-sample transforms), and executes it on the CPU
    fused into the images' native ToDtype/Normalize pass (``apply_fused``: the blend costs no pass of its own),
    else with ``apply`` after it (other dtypes; CutMix on uint8 images in place), or on the device after the
    copy and ToDtype/Normalize."""

    def __init__(self, transform: Any, image: str, label: str, image_key: Any, label_key: Any) -> None:
        self.transform, self.image, self.label = transform, image, label
        self.image_key, self.label_key = image_key, label_key
        self.num_classes = _members_num_classes(transform)

    def plan(self, batch: Any, rng: np.random.Generator) -> MixPlan:
        """The plan for ``batch`` (host tensors, before any copy), RandomChoice's pick included; checks the labels
        here, on the host, where no device would have to sync for it."""
        images, labels = batch[self.image_key], batch[self.label_key]
        if labels.numel():
            lo, hi = int(labels.min()), int(labels.max())
            if lo < 0 or hi >= self.num_classes:
                raise ValueError(
                    f"{type(self.transform).__name__}: label field '{self.label}' should hold class "
                    f"indices in [0, num_classes={self.num_classes}), got values from {lo} to {hi} in "
                    f"this batch; give num_classes > {hi}"
                )
        n, hw = images.shape[0], (images.shape[-2], images.shape[-1])
        out = self.transform.plan_batch(n, hw, rng)
        return out[1] if isinstance(out, tuple) else out

    def apply(self, batch: Any, plan: MixPlan, output: Any = None) -> Any:
        """``batch`` with mixed images and float soft labels (N, num_classes), on the batch's device. ``output(images)``
        gives a reused buffer to write the images into (the CPU collate's), else they are a new tensor."""
        images = batch[self.image_key]
        into = output(images) if output is not None else None
        images, labels = apply_mix(images, batch[self.label_key], plan, self.num_classes, into)
        batch[self.image_key], batch[self.label_key] = images, labels
        return batch

    def apply_fused(self, batch: Any, plan: MixPlan, pipeline: Any, out: torch.Tensor) -> Any:
        """``batch`` with its uint8 images converted by ``pipeline`` (their ToDtype/Normalize,
        ``_tensor_transforms.TensorPipeline``) into ``out`` with the mix in the same native pass (where
        ``pipeline.fuses_mix``), and float soft labels: what ``apply`` gives after the pipeline, within float32
        rounding for MixUp (it blends the uint8 values, scaled once: the affine is linear) and bit for bit for
        CutMix."""
        batch[self.image_key] = pipeline.apply(batch[self.image_key], out, mix=plan)
        batch[self.label_key] = mix_labels(batch[self.label_key], plan, self.num_classes)
        return batch


def _members_num_classes(t: Any) -> int:
    members = getattr(t, "transforms", None) or [t]
    ks = {m.num_classes for m in members}
    return ks.pop() if len(ks) == 1 else None  # type: ignore[return-value]


def resolve_batch(spec: Any, schema: Any, pipelines: dict, as_dict: bool) -> BatchMix | None:
    """``fastload.open``'s ``batch_transforms``: one MixUp, CutMix or RandomChoice over them (alone or in a
    one-item list), or ``{(image field, label field): that}``; None for none. Refuses, naming the field, a
    missing num_classes, a label field that is not int, ambiguous fields and MixUp on uint8 images."""
    if spec is None:
        return None
    fields = None
    if isinstance(spec, dict):
        if len(spec) != 1 or not isinstance(next(iter(spec)), tuple) or len(next(iter(spec))) != 2:
            raise TypeError(
                f"batch_transforms as a dict maps ('image field', 'label field') to the transform, "
                f"e.g. {{('image', 'label'): T.MixUp(num_classes=10)}}; got {spec!r}"
            )
        fields, spec = next(iter(spec.items()))
    if isinstance(spec, (list, tuple)):
        if len(spec) != 1:
            raise ValueError(
                f"batch_transforms takes one batch transform (MixUp, CutMix, or RandomChoice over them, "
                f"as torchvision applies one per batch), got {len(spec)}: {list(spec)!r}; e.g. "
                f"{_BATCH_EXAMPLE}"
            )
        spec = spec[0]
    # RandomChoice (combinators.py, which imports this module) is the one combinator with a batch plan
    chooses = not isinstance(spec, _MixBase) and hasattr(spec, "plan_batch") and hasattr(spec, "transforms")
    members = list(spec.transforms) if chooses else [spec]
    bad = [m for m in members if not isinstance(m, _MixBase)]
    if bad and type(bad[0]).__module__ == "timm.data.mixup":
        raise TypeError(
            f"batch_transforms: timm's {type(bad[0]).__name__} has no exact fastload equivalent (it pairs the "
            f"batch flipped, draws its own box, smooths the labels, and draws from numpy's global generator; "
            f"timm_mix.py says more): call it on the loader's batch as timm's train.py does "
            f"(x, y = mixup_fn(x, y)), or build the loader with fastload.timm.create_loader(collate_fn=...)"
        )
    if bad:
        raise TypeError(
            f"batch_transforms: {bad[0]!r} is not a batch transform; fastload runs MixUp, CutMix and "
            f"RandomChoice over them there, e.g. {_BATCH_EXAMPLE}"
        )
    images = [f.name for f in schema if f.kind == "image"]
    ints = [f.name for f in schema if f.kind == "int"]
    if fields is None:
        if len(images) != 1 or len(ints) != 1:
            raise ValueError(
                f"batch_transforms: which fields to mix is ambiguous (image fields {images}, int "
                f"fields {ints}); name them: batch_transforms={{('<image field>', '<label field>'): "
                f"{spec!r}}}"
            )
        fields = (images[0], ints[0])
    image, label = fields
    for name, kinds, what in ((image, images, "an image field"), (label, ints, "an int field of class indices")):
        if name not in schema.names:
            raise ValueError(
                f"batch_transforms name field {name!r}, which this dataset does not have; its fields "
                f"are {list(schema.names)}"
            )
        if name not in kinds:
            raise ValueError(
                f"batch_transforms: field '{name}' is of kind {schema[name].kind}, but it should be "
                f"{what} (candidates here: {kinds})"
            )
    missing = [m for m in members if m.num_classes is None]
    if missing:
        raise ValueError(
            f"batch_transforms: {missing[0]!r} needs num_classes: the label field '{label}' holds "
            f"class indices, made one-hot over num_classes (e.g. {type(missing[0]).__name__}"
            f"(alpha={missing[0].alpha}, num_classes=1000))"
        )
    ks = sorted({m.num_classes for m in members})
    if len(ks) > 1:
        raise ValueError(
            f"batch_transforms: the transforms give soft labels of different widths "
            f"(num_classes {ks}); give them all the same num_classes"
        )
    pipe = pipelines.get(image)
    if any(isinstance(m, MixUp) for m in members) and (pipe is None or not pipe.tensor.dtype.is_floating_point):
        raise ValueError(
            f"batch_transforms: MixUp blends the images of field '{image}', so they should be float "
            f"there: end transforms['{image}'] with T.ToDtype(torch.float32, scale=True) (and "
            f"Normalize); CutMix alone works on uint8"
        )
    names = list(schema.names)
    keys = (image, label) if as_dict else (names.index(image), names.index(label))
    return BatchMix(spec, image, label, *keys)
