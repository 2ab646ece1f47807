"""``examples/train.py --recipe``: training recipes built by torchvision's or timm's OWN objects, and the check that
fastload runs them on its native engine. Kept apart from the training script, which imports them.

``--recipe torchvision|torchvision-v2|timm|timm-ra`` trains with a recipe built by that library's OWN objects
instead (needs torchvision, and timm for ``timm`` and ``timm-ra``), and passes the same objects to both loaders:
``--loader torch`` reads ``torchvision.datasets.ImageFolder(folder, transform=recipe)`` with torch's DataLoader
(the objects run per sample on PIL images, as in torchvision's and timm's training scripts), ``--loader fastload``
reads ``fastload.open(packed, transforms={"image": recipe})``, which converts them to its native engine; a recipe
that would leave fastload's fast path (a per-sample fallback, a ``FastPathWarning``) is an error here, since the
comparison is then not the one asked; fastload's other warnings converting it are printed with the results.
The recipes (``library_recipe``), at ``--image-size`` S:

- ``torchvision``: ``Compose([RandomResizedCrop(S), RandomHorizontalFlip(), ToTensor(), Normalize(...)])``;
- ``torchvision-v2``: torchvision's new recipe, ``v2.Compose([RandomResizedCrop(S), RandomHorizontalFlip(),
  TrivialAugmentWide(), PILToTensor(), ToDtype(float32, scale=True), Normalize(...), RandomErasing(0.1)])``;
- ``timm``: ``timm.data.create_transform(S, is_training=True, re_prob=0.25)`` (timm's crop, flip,
  ColorJitter(0.4), ToTensor, Normalize, RandomErasing(mode='const'));
- ``timm-ra``: DeiT's recipe (facebookresearch/deit's defaults), ``timm.data.create_transform(S, is_training=True,
  auto_augment="rand-m9-mstd0.5-inc1", interpolation="bicubic", re_prob=0.25, re_mode="pixel")`` (timm's bicubic
  crop, flip, RandAugment, ToTensor, Normalize, RandomErasing(mode='pixel'), DeiT's setting, run natively in
  fastload's fill stage; the 10-seed runs in bench/results were made with mode 'const'). fastload warns that it
  runs a sample's geometric RandAugment ops before its colour ops (a UserWarning, not a ``FastPathWarning``): the
  run keeps that difference, since it is what fastload does with timm's object, and the script prints the warning
  with the summary;

validation: ``Compose([Resize(S / 0.875), CenterCrop(S), ToTensor(), Normalize(...)])`` for torchvision,
``timm.data.create_transform(S)`` for timm (with ``interpolation="bicubic"`` for timm-ra). Both loaders then yield
normalized float images.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

import fastload
from fastload import transforms as T

RECIPES = ("fastload", "torchvision", "torchvision-v2", "timm", "timm-ra")
# DeiT's RandAugment (facebookresearch/deit main.py: --aa, --train-interpolation)
TIMM_RA_POLICY, TIMM_RA_INTERPOLATION = "rand-m9-mstd0.5-inc1", "bicubic"
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@dataclass(frozen=True)
class Recipe:
    """A recipe built by torchvision's or timm's own objects: the same ``train`` and ``val`` objects go to both
    loaders."""

    name: str
    train: Any
    val: Any


def library_recipe(name: str, size: int) -> Recipe:
    """``--recipe``'s objects, built as the library's training scripts build them (see the module docstring)."""
    try:
        import torchvision.transforms as tv1
        from torchvision.transforms import v2
    except ImportError as e:
        raise SystemExit(
            f"--recipe {name} builds torchvision's own transform objects, but torchvision does not import here "
            f"({e}); install torchvision (and timm for --recipe timm), or use --recipe fastload"
        ) from None
    val = tv1.Compose(
        [
            tv1.Resize(round(size / 0.875)),
            tv1.CenterCrop(size),
            tv1.ToTensor(),
            tv1.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    if name == "torchvision":
        train = tv1.Compose(
            [
                tv1.RandomResizedCrop(size),
                tv1.RandomHorizontalFlip(),
                tv1.ToTensor(),
                tv1.Normalize(IMAGENET_MEAN, IMAGENET_STD),
            ]
        )
        return Recipe(name, train, val)
    if name == "torchvision-v2":
        train = v2.Compose(
            [
                v2.RandomResizedCrop(size),
                v2.RandomHorizontalFlip(),
                v2.TrivialAugmentWide(),
                v2.PILToTensor(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
                v2.RandomErasing(0.1),
            ]
        )
        return Recipe(name, train, val)
    if name in ("timm", "timm-ra"):
        try:
            import timm.data
        except ImportError as e:
            raise SystemExit(
                f"--recipe {name} builds timm's own transform objects, but timm does not import here ({e}); "
                f"install timm, or use --recipe torchvision"
            ) from None
        if name == "timm":
            return Recipe(
                name,
                timm.data.create_transform(size, is_training=True, re_prob=0.25),
                timm.data.create_transform(size),
            )
        return Recipe(
            name,
            timm.data.create_transform(
                size,
                is_training=True,
                auto_augment=TIMM_RA_POLICY,
                interpolation=TIMM_RA_INTERPOLATION,
                re_prob=0.25,
                re_mode="pixel",  # timm's train.py default and DeiT's; fastload erases with noise natively
            ),
            timm.data.create_transform(size, interpolation=TIMM_RA_INTERPOLATION),
        )
    raise ValueError(f"recipe={name!r} should be one of {RECIPES[1:]} (or 'fastload': fastload's own transforms)")


def require_fast_path(recipe: Recipe) -> list[str]:
    """Raise unless fastload converts every object of ``recipe`` to its native engine (no per-sample fallback):
    the fidelity comparison is torch running the objects per sample against fastload's native engine.

    Returns what else fastload warned converting it (e.g. that it reorders timm's RandAugment ops): not an error,
    since the run then measures fastload as it is, but printed with the results, which include its effect. A
    warning fastload gives once per process is returned only by the first call that triggers it."""
    notes: list[str] = []
    for split, objects in (("train", recipe.train), ("val", recipe.val)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                pipe = T.ImagePipeline(objects)
            except (TypeError, ValueError) as e:
                raise SystemExit(f"--recipe {recipe.name}: fastload refuses the {split} recipe: {e}") from None
        slow = list(pipe.fallback) + list(pipe.after)
        if slow:
            reasons = "; ".join(getattr(t, "reason", repr(t)) for t in slow)
            raise SystemExit(
                f"--recipe {recipe.name}: fastload would run part of the {split} recipe per sample, not on its "
                f"native engine ({reasons}), so the comparison would not be torch vs fastload's engine"
            )
        off = [str(w.message) for w in caught if issubclass(w.category, fastload.FastPathWarning)]
        if off:
            raise SystemExit(f"--recipe {recipe.name}: fastload leaves its fast path on the {split} recipe: {off}")
        notes += [f"{split}: {w.category.__name__}: {w.message}" for w in caught]
    return notes
