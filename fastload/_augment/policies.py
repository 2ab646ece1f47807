"""Augmentation policies: TrivialAugmentWide, RandAugment, AutoAugment (ImageNet policy), ThreeAugment (DeiT III).

Operation lists, magnitude bins, signs and probabilities are torchvision v2's (``_auto_augment.py``): an
operation's magnitudes are a table of ``num_bins`` values (e.g. ``linspace(0, 0.99, 31)`` for TrivialAugmentWide's
Brightness, whose factor is then ``1 + m``); a signed operation's magnitude is negated when a uniform draw is
``<= 0.5``. Per sample and slot, the draws (operation, bin, sign) are made for every sample at once, then
each operation is planned over the samples that chose it, so the plan has at most one step per operation
and slot. Magnitude tables are built with torch exactly as torchvision builds them (float32 ``linspace``), so
they are equal bit for bit. ShearX/Y, TranslateX/Y and Rotate become the sample's affine (see plan.py for the
order this implies).

RandAugment also takes timm's magnitude noise (``magnitude_std``, ``magnitude_max``: timm's ``mstd`` / ``mmax``,
``timm/data/auto_augment.py`` ``AugmentOp``), which torchvision's RandAugment does not have: each operation of
each sample then gets its own magnitude, a fractional bin, and the tables are read on the line through their bins.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any, Callable

import numpy as np
import torch

from .color import ColorJitter, Grayscale
from .combinators import RandomChoice
from .filters import GaussianBlur
from .geometry import rotate, shear, translate
from .plan import NEAREST, Augment, PlanBuilder, check_fill, check_interpolation
from .tone import RandomSolarize

__all__ = ["AutoAugment", "RandAugment", "ThreeAugment", "TrivialAugmentWide"]

# magnitude table: (bins (k,), num_bins, hw (k, 2)) -> magnitudes (k,), or None for operations without one
Table = Callable[[np.ndarray, int, np.ndarray], np.ndarray]


@functools.lru_cache(maxsize=256)
def _linspace(start: float, end: float, num: int) -> np.ndarray:
    # torch's own float32 linspace: numpy's (or a float32 port) differs from it by an ulp here and there.
    return torch.linspace(start, end, num).double().numpy()


def _at(start: float, end: float, num: int, bins: np.ndarray) -> np.ndarray:
    """The table ``linspace(start, end, num)`` at ``bins``: torchvision's float32 entries at integer bins; at
    fractional bins (RandAugment's magnitude noise) the line through them, in float64."""
    if bins.dtype.kind in "iu":
        return _linspace(start, end, num)[bins]
    return start + (end - start) * bins / (num - 1)


def _linear(end: float, start: float = 0.0) -> Table:
    return lambda bins, num, hw: _at(start, end, num, bins)


def _linear_of_size(fraction: float, axis: int) -> Table:
    """``linspace(0, fraction * width_or_height, num)``: RandAugment/AutoAugment's translation in pixels."""

    def table(bins: np.ndarray, num: int, hw: np.ndarray) -> np.ndarray:
        sizes = hw[:, 1 - axis]
        out = np.empty(bins.size)
        for size in np.unique(sizes):  # one table per tile size (one per batch in practice)
            sel = sizes == size
            out[sel] = _at(0.0, fraction * float(size), num, bins[sel])
        return out

    return table


@functools.lru_cache(maxsize=64)
def _posterize_bits(num: int, span: float) -> np.ndarray:
    return (8 - (torch.arange(num) / ((num - 1) / span))).round().int().double().numpy()


def _posterize(span: float) -> Table:
    """torchvision's ``(8 - arange(num) / ((num - 1) / span)).round().int()``: bits (at a fractional bin, the same
    formula rounded there)."""

    def table(bins: np.ndarray, num: int, hw: np.ndarray) -> np.ndarray:
        if bins.dtype.kind in "iu":
            return _posterize_bits(num, span)[bins]
        return np.round(8 - bins / ((num - 1) / span))

    return table


def _space(
    shear_max: float,
    translate: Table,
    translate_y: Table,
    rotate_max: float,
    enhance_max: float,
    posterize_span: float,
    identity: bool,
    invert: bool,
) -> dict[str, tuple[Table | None, bool]]:
    space: dict[str, tuple[Table | None, bool]] = {"Identity": (None, False)} if identity else {}
    space.update(
        {
            "ShearX": (_linear(shear_max), True),
            "ShearY": (_linear(shear_max), True),
            "TranslateX": (translate, True),
            "TranslateY": (translate_y, True),
            "Rotate": (_linear(rotate_max), True),
            "Brightness": (_linear(enhance_max), True),
            "Color": (_linear(enhance_max), True),
            "Contrast": (_linear(enhance_max), True),
            "Sharpness": (_linear(enhance_max), True),
            "Posterize": (_posterize(posterize_span), False),
            "Solarize": (_linear(0.0, start=1.0), False),
            "AutoContrast": (None, False),
            "Equalize": (None, False),
        }
    )
    if invert:
        space["Invert"] = (None, False)
    return space


_RAND_SPACE = _space(
    0.3, _linear_of_size(150.0 / 331.0, 0), _linear_of_size(150.0 / 331.0, 1), 30.0, 0.9, 4, identity=True, invert=False
)
_TRIVIAL_SPACE = _space(0.99, _linear(32.0), _linear(32.0), 135.0, 0.99, 6, identity=True, invert=False)
_AUTO_SPACE = _space(
    0.3, _linear_of_size(150.0 / 331.0, 0), _linear_of_size(150.0 / 331.0, 1), 30.0, 0.9, 4, identity=False, invert=True
)

_IMAGENET_POLICY = (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
    (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, None)),
    (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
    (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
    (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
    (("Equalize", 0.0, None), ("Equalize", 0.8, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
    (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, None)),
    (("Color", 0.4, 0), ("Equalize", 0.6, None)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
)

_ENHANCE = {"Brightness": "brightness", "Color": "saturation", "Contrast": "contrast", "Sharpness": "sharpness"}
_PLAIN = {"AutoContrast": "autocontrast", "Equalize": "equalize", "Invert": "invert"}


def apply_op(b: PlanBuilder, name: str, index: np.ndarray, m: np.ndarray, interpolation: int, fill: np.ndarray) -> None:
    """Plan policy operation ``name`` with magnitudes ``m`` (one per sample of ``index``), as torchvision's
    ``_apply_image_or_video_transform``."""
    if index.size == 0 or name == "Identity":
        return
    hw = b.out_hw[index]
    if name in ("ShearX", "ShearY"):
        b.affine(index, shear(m, 0 if name == "ShearX" else 1), interpolation, fill)
    elif name in ("TranslateX", "TranslateY"):
        b.affine(index, translate(m, 0 if name == "TranslateX" else 1, hw), interpolation, fill)
    elif name == "Rotate":
        b.affine(index, rotate(m, hw), interpolation, fill)
    elif name in _ENHANCE:
        b.add(_ENHANCE[name], index, factor=1.0 + m)
    elif name == "Posterize":
        b.add("posterize", index, bits=m.astype(np.int64))
    elif name == "Solarize":
        b.add("solarize", index, threshold=255.0 * m)
    elif name in _PLAIN:
        b.add(_PLAIN[name], index)
    else:  # pragma: no cover - the tables above name only these
        raise ValueError(f"no policy operation {name!r}")


def _check_bins(value: Any, what: str, low: int = 2) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{what}={value!r} should be an integer >= {low}")
    return int(value)


class _Policy(Augment):
    _space: dict[str, tuple[Table | None, bool]] = {}

    def __init__(self, interpolation: Any, fill: Any) -> None:
        self.interpolation = (
            "nearest" if check_interpolation(interpolation, type(self).__name__) == NEAREST else "bilinear"
        )
        self._interp = check_interpolation(interpolation, type(self).__name__)
        self.fill = fill
        self._fill = check_fill(fill, type(self).__name__)

    def _slot(
        self, b: PlanBuilder, index: np.ndarray, choice: np.ndarray, bins: np.ndarray, negate: np.ndarray, num_bins: int
    ) -> None:
        """One operation per sample: ``choice`` indexes the space, ``bins`` the magnitude table."""
        for j, (name, (table, signed)) in enumerate(self._space.items()):
            sel = np.flatnonzero(choice == j)
            if sel.size == 0:
                continue
            idx = index[sel]
            m = np.zeros(sel.size) if table is None else table(bins[sel], num_bins, b.out_hw[idx])
            if signed:
                m = np.where(negate[sel], -m, m)
            apply_op(b, name, idx, m, self._interp, self._fill)


class TrivialAugmentWide(_Policy):
    """One operation per sample, uniformly from 14, at a uniformly drawn magnitude bin (of 31)."""

    _space = _TRIVIAL_SPACE

    def __init__(self, num_magnitude_bins: int = 31, interpolation: Any = "nearest", fill: Any = None) -> None:
        super().__init__(interpolation, fill)
        self.num_magnitude_bins = _check_bins(num_magnitude_bins, "TrivialAugmentWide: num_magnitude_bins")

    def _params(self) -> dict[str, Any]:
        return {"num_magnitude_bins": self.num_magnitude_bins, "interpolation": self.interpolation, "fill": self.fill}

    def plan(self, b: PlanBuilder, index: np.ndarray, rng: np.random.Generator) -> None:
        k = index.size
        choice = rng.integers(0, len(self._space), k)
        bins = rng.integers(0, self.num_magnitude_bins, k)
        negate = rng.random(k) <= 0.5
        self._slot(b, index, choice, bins, negate, self.num_magnitude_bins)


class RandAugment(_Policy):
    """``num_ops`` operations per sample, each uniformly from 14, all at bin ``magnitude`` of ``num_magnitude_bins``.

    Keyword-only, timm's magnitude noise (torchvision has none; not given, the draws are torchvision's, unchanged):
    ``magnitude_std`` > 0 draws each operation's magnitude per sample from ``normal(magnitude, magnitude_std)``,
    ``inf`` from ``uniform(0, magnitude)``; the magnitude is then clipped to ``[0, magnitude_max]`` (default
    ``num_magnitude_bins - 1``, the table's end). Magnitudes are in bins, as ``magnitude``: timm's scale is 0-10,
    so timm's ``rand-m9-mstd0.5`` is ``RandAugment(magnitude=9, num_magnitude_bins=11, magnitude_std=0.5)``
    (its operations' ranges at bin 10 equal torchvision's RandAugment's; timm's own differences, such as applying
    each operation with probability 0.5 and its operation list, are not taken). ``magnitude_max`` beyond the
    table (timm's M > 10) is refused: torchvision's tables end there."""

    _space = _RAND_SPACE

    def __init__(
        self,
        num_ops: int = 2,
        magnitude: int = 9,
        num_magnitude_bins: int = 31,
        interpolation: Any = "nearest",
        fill: Any = None,
        *,
        magnitude_std: float = 0.0,
        magnitude_max: float | None = None,
    ) -> None:
        super().__init__(interpolation, fill)
        if isinstance(num_ops, bool) or not isinstance(num_ops, (int, np.integer)) or num_ops < 0:
            raise ValueError(f"RandAugment: num_ops={num_ops!r} should be a non-negative integer")
        self.num_ops = int(num_ops)
        self.num_magnitude_bins = _check_bins(num_magnitude_bins, "RandAugment: num_magnitude_bins")
        if (
            isinstance(magnitude, bool)
            or not isinstance(magnitude, (int, np.integer))
            or not 0 <= magnitude < self.num_magnitude_bins
        ):
            raise ValueError(
                f"RandAugment: magnitude={magnitude!r} should be an integer in "
                f"[0, num_magnitude_bins - 1 = {self.num_magnitude_bins - 1}]"
            )
        self.magnitude = int(magnitude)
        if (
            isinstance(magnitude_std, bool)
            or not isinstance(magnitude_std, numbers.Real)
            or math.isnan(magnitude_std)
            or magnitude_std < 0
        ):
            raise ValueError(
                f"RandAugment: magnitude_std={magnitude_std!r} should be a number >= 0 (0: a fixed "
                f"magnitude; inf: uniform in [0, magnitude])"
            )
        self.magnitude_std = float(magnitude_std)
        top = self.num_magnitude_bins - 1
        if magnitude_max is not None and (
            isinstance(magnitude_max, bool)
            or not isinstance(magnitude_max, numbers.Real)
            or not 0 <= magnitude_max <= top
        ):
            raise ValueError(
                f"RandAugment: magnitude_max={magnitude_max!r} should be None or a number in "
                f"[0, num_magnitude_bins - 1 = {top}] (the magnitude table ends there)"
            )
        self.magnitude_max = None if magnitude_max is None else float(magnitude_max)

    def _params(self) -> dict[str, Any]:
        params = {
            "num_ops": self.num_ops,
            "magnitude": self.magnitude,
            "num_magnitude_bins": self.num_magnitude_bins,
            "interpolation": self.interpolation,
            "fill": self.fill,
        }
        if self.magnitude_std:  # only when given: torchvision's RandAugment has neither
            params["magnitude_std"] = self.magnitude_std
        if self.magnitude_max is not None:
            params["magnitude_max"] = self.magnitude_max
        return params

    def _magnitudes(self, k: int, rng: np.random.Generator) -> np.ndarray:
        """One slot's magnitudes (bins) for ``k`` samples, as timm's ``AugmentOp``: the fixed bin (integer: the
        table's own entries), or noise around it, then clipped to [0, magnitude_max]."""
        top = self.num_magnitude_bins - 1 if self.magnitude_max is None else self.magnitude_max
        if self.magnitude_std == 0:
            if self.magnitude <= top:
                return np.full(k, self.magnitude)
            return np.full(k, top, dtype=np.float64)
        if math.isinf(self.magnitude_std):
            m = rng.uniform(0.0, self.magnitude, k)
        else:
            m = rng.normal(self.magnitude, self.magnitude_std, k)
        return np.clip(m, 0.0, top)

    def plan(self, b: PlanBuilder, index: np.ndarray, rng: np.random.Generator) -> None:
        k = index.size
        for _ in range(self.num_ops):
            choice = rng.integers(0, len(self._space), k)
            negate = rng.random(k) <= 0.5
            # drawn after torchvision's two draws of the slot: without noise the stream is torchvision's
            self._slot(b, index, choice, self._magnitudes(k, rng), negate, self.num_magnitude_bins)


class AutoAugment(_Policy):
    """One of the 25 ImageNet sub-policy pairs per sample; each of its two operations applied with its probability
    (``u <= p``) at its fixed bin of 10."""

    _space = _AUTO_SPACE

    def __init__(self, policy: Any = "imagenet", interpolation: Any = "nearest", fill: Any = None) -> None:
        super().__init__(interpolation, fill)
        name = getattr(policy, "value", policy)
        if name != "imagenet":
            raise ValueError(
                f"AutoAugment: policy={policy!r} is not supported; only the ImageNet policy is "
                f"(policy='imagenet' or AutoAugmentPolicy.IMAGENET)"
            )
        self.policy = "imagenet"

    def _params(self) -> dict[str, Any]:
        return {"policy": self.policy, "interpolation": self.interpolation, "fill": self.fill}

    def plan(self, b: PlanBuilder, index: np.ndarray, rng: np.random.Generator) -> None:
        k = index.size
        names = list(self._space)
        chosen = rng.integers(0, len(_IMAGENET_POLICY), k)
        for pos in range(2):
            op_id = np.array([names.index(p[pos][0]) for p in _IMAGENET_POLICY])[chosen]
            prob = np.array([p[pos][1] for p in _IMAGENET_POLICY])[chosen]
            bins = np.array([p[pos][2] or 0 for p in _IMAGENET_POLICY])[chosen]
            applied = rng.random(k) <= prob
            negate = rng.random(k) <= 0.5
            choice = np.where(applied, op_id, -1)  # -1: skipped
            self._slot(b, index, choice, bins, negate, 10)


class ThreeAugment(Augment):
    """DeiT III's "3-Augment": per sample one of grayscale (3 channels), solarize (threshold 128) or a Gaussian
    blur with sigma uniform in ``blur_sigma``, chosen uniformly; then ``ColorJitter(c, c, c)`` unless
    ``color_jitter`` is 0 or None.

    DeiT blurs with PIL's ``ImageFilter.GaussianBlur(radius=sigma)`` (box-filter approximation, edges
    extended); here the blur is torchvision's sampled Gaussian with ``blur_kernel_size`` taps (default covers
    +-3 sigma of the largest sigma) and reflect padding: on photo-like tiles the two differ by about half a
    level on average away from the borders (tests/augment/test_augment_policies_extra.py)."""

    def __init__(
        self, color_jitter: float | None = 0.3, blur_sigma: Any = (0.1, 2.0), blur_kernel_size: int | None = None
    ) -> None:
        self.color_jitter = None if not color_jitter else float(color_jitter)
        self._blur = GaussianBlur(3, sigma=blur_sigma)  # checks sigma; the size is set below
        self.blur_sigma = self._blur.sigma
        size = blur_kernel_size if blur_kernel_size is not None else 2 * int(np.ceil(3 * self.blur_sigma[1])) + 1
        self._blur = GaussianBlur(size, sigma=blur_sigma)
        self.blur_kernel_size = self._blur.kernel_size[0]
        self._choice = RandomChoice([Grayscale(3), RandomSolarize(128.0, p=1.0), self._blur])
        self._jitter = None if self.color_jitter is None else ColorJitter(*(self.color_jitter,) * 3)

    def _params(self) -> dict[str, Any]:
        return {
            "color_jitter": self.color_jitter,
            "blur_sigma": self.blur_sigma,
            "blur_kernel_size": self.blur_kernel_size,
        }

    def parts(self) -> tuple[Augment, ...]:
        """The transforms it plans with (its blur's kernel is checked against every sample's tile at open)."""
        return (self._choice,) if self._jitter is None else (self._choice, self._jitter)

    def plan(self, b: PlanBuilder, index: np.ndarray, rng: np.random.Generator) -> None:
        self._choice.plan(b, index, rng)
        if self._jitter is not None:
            self._jitter.plan(b, index, rng)
