"""The base of fastload's image transform declarations and their size checks, in a module of its own so that
transforms defined beside their planning code (``_augment/random_crop.py``) can derive from it without importing
``transforms.py``, which imports them to export them."""

from __future__ import annotations

import operator
from typing import Any, Sequence

import numpy as np


def _positive_int(value: Any, what: str) -> int:
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {value!r}") from None
    if isinstance(value, bool) or v <= 0:
        raise ValueError(f"{what} must be a positive int, got {value!r}")
    return v


def _setup_size(size: Any, what: str) -> tuple[int, int]:
    """torchvision's ``_setup_size``: int or 1-sequence -> square (h, h); 2-sequence -> (h, w)."""
    if isinstance(size, Sequence) and not isinstance(size, str):
        if len(size) not in (1, 2):
            raise ValueError(f"{what} size must be an int or (h, w), got {size!r}")
        return (_positive_int(size[0], f"{what} size"), _positive_int(size[-1], f"{what} size"))
    s = _positive_int(size, f"{what} size")  # a str fails here with TypeError
    return (s, s)


class Transform:
    """Base of fastload's image transforms: a declaration, compared and described by its params."""

    def describe(self) -> dict[str, Any]:
        """The transform as a plain, JSON-friendly dict: ``{"name": ..., **params}``."""
        return {"name": type(self).__name__, **self._params()}

    def _params(self) -> dict[str, Any]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.describe() == other.describe()

    def __hash__(self) -> int:
        return hash(repr(self))

    # Planning hooks: `_apply` updates the batch's virtual images; `_static_size` maps a known fixed
    # (h, w) (or None) before the step to the one after it.
    def _apply(self, state: Any, rng: np.random.Generator) -> None:  # state: crop_plan._State
        raise NotImplementedError

    def _static_size(self, hw: tuple[int, int] | None) -> tuple[int, int] | None:
        return hw


def plan_step(t: Transform, state: Any, rng: np.random.Generator) -> None:
    """Run crop-plan transform ``t``'s planning hook on the batch's virtual images (``crop_plan._State``):
    ``ImagePipeline.plan`` and its size check call the hooks through here, the module that declares them."""
    t._apply(state, rng)


def static_size(t: Transform, hw: tuple[int, int] | None) -> tuple[int, int] | None:
    """``t``'s output size for a fixed (h, w) before it (None: unknown), through its ``_static_size`` hook."""
    return t._static_size(hw)
