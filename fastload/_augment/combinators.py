"""Combinators: RandomApply, RandomChoice, RandomOrder — per sample, as torchvision v2 draws them per image.

Each draws per sample and plans its members over the subsets that drew them, so a member's steps list only
its samples. ``RandomChoice`` over batch transforms (MixUp, CutMix) picks one per batch instead: see mix.py.
"""

from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np

from .plan import Augment, PlanBuilder, at, check_p

__all__ = ["RandomApply", "RandomChoice", "RandomOrder"]


def _members(transforms: Any, what: str) -> list[Augment]:
    if not isinstance(transforms, (list, tuple)) or not transforms:
        raise TypeError(f"{what}: transforms={transforms!r} should be a non-empty list of transforms")
    bad = [t for t in transforms if not isinstance(t, Augment)]
    if bad:
        raise TypeError(f"{what}: {bad[0]!r} ({type(bad[0]).__name__}) is not one of fastload's augmentations")
    return list(transforms)


class RandomApply(Augment):
    """Apply all ``transforms`` in order with probability ``p`` (default 0.5), or none (torchvision: ``u < p``)."""

    def __init__(self, transforms: Sequence[Augment], p: float = 0.5) -> None:
        self.transforms = _members(transforms, "RandomApply")
        self.p = check_p(p, "RandomApply")

    def _params(self) -> dict[str, Any]:
        return {"transforms": [t.describe() for t in self.transforms], "p": self.p}

    def plan(self, b: PlanBuilder, index: np.ndarray, rng: np.random.Generator) -> None:
        sel = index[rng.random(index.size) < self.p]
        for t in self.transforms:
            t.plan(b, sel, at(rng, sel))


class RandomChoice(Augment):
    """Apply one of ``transforms`` per sample, chosen with probabilities ``p`` (normalised; default uniform)."""

    def __init__(self, transforms: Sequence[Any], p: Sequence[float] | None = None) -> None:
        if not isinstance(transforms, (list, tuple)) or not transforms:
            raise TypeError(f"RandomChoice: transforms={transforms!r} should be a non-empty list of transforms")
        self.transforms = list(transforms)
        if p is None:
            p = [1.0] * len(self.transforms)
        if (
            not isinstance(p, (list, tuple))
            or len(p) != len(self.transforms)
            or any(isinstance(v, bool) or not isinstance(v, numbers.Real) or v < 0 for v in p)
            or sum(p) <= 0
        ):
            raise ValueError(
                f"RandomChoice: p={p!r} should be {len(self.transforms)} non-negative numbers with a "
                f"positive sum, one per transform"
            )
        total = float(sum(p))
        self.p = [float(v) / total for v in p]

    def _params(self) -> dict[str, Any]:
        return {"transforms": [t.describe() for t in self.transforms], "p": self.p}

    def plan(self, b: PlanBuilder, index: np.ndarray, rng: np.random.Generator) -> None:
        _members(self.transforms, "RandomChoice")
        pick = _categorical(rng, self.p, index.size)
        for j, t in enumerate(self.transforms):
            sel = index[pick == j]
            t.plan(b, sel, at(rng, sel))

    # Over batch transforms (MixUp, CutMix): one choice per batch, as torchvision's RandomChoice on a batch.
    def plan_batch(self, n: int, hw: tuple[int, int], rng: np.random.Generator) -> Any:
        bad = [t for t in self.transforms if not hasattr(t, "plan_batch") or isinstance(t, Augment)]
        if bad:
            raise TypeError(f"RandomChoice over a batch: {bad[0]!r} is not a batch transform (MixUp, CutMix)")
        pick = int(_categorical(rng, self.p, 1)[0])
        return self.transforms[pick], self.transforms[pick].plan_batch(n, hw, rng)

    def __call__(self, images: Any, labels: Any, rng: np.random.Generator) -> Any:
        """Mix a batch with one of the batch transforms (see mix.py)."""
        from .mix import _check_batch, apply_mix

        _check_batch(images, labels, "RandomChoice")
        chosen, plan = self.plan_batch(images.shape[0], (images.shape[-2], images.shape[-1]), rng)
        return apply_mix(images, labels, plan, chosen.num_classes)


def _categorical(rng: np.random.Generator, p: Sequence[float], size: int) -> np.ndarray:
    """Indices drawn with probabilities ``p`` (inverse CDF of one uniform each)."""
    cdf = np.cumsum(p)
    return np.minimum(np.searchsorted(cdf / cdf[-1], rng.random(size), side="right"), len(p) - 1)


class RandomOrder(Augment):
    """Apply all ``transforms`` in a random order per sample (torchvision: ``randperm(len(transforms))``)."""

    def __init__(self, transforms: Sequence[Augment]) -> None:
        self.transforms = _members(transforms, "RandomOrder")

    def _params(self) -> dict[str, Any]:
        return {"transforms": [t.describe() for t in self.transforms]}

    def plan(self, b: PlanBuilder, index: np.ndarray, rng: np.random.Generator) -> None:
        n = len(self.transforms)
        order = np.argsort(rng.random((index.size, n)), axis=1)  # one uniform permutation per sample
        for pos in range(n):
            for j, t in enumerate(self.transforms):
                sel = index[order[:, pos] == j]
                t.plan(b, sel, at(rng, sel))
