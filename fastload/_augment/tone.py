"""Tone operations: solarize, posterize, equalize, autocontrast, invert, sharpness, and their Random* transforms.

PIL kernels are ``ImageOps`` / ``ImageEnhance.Sharpness`` as torchvision's v1 PIL backend calls them; torch
kernels follow torchvision v2's tensor kernels. Equalize is PIL's lookup table (``step = (pixels - count of the
largest value) // 255``), computed per sample and channel from one ``scatter_add_`` histogram over the subset.
Sharpness blends with a 3x3 smoothing kernel (1/13 around, 5/13 in the middle), rounded, on the interior
only: border pixels stay, as in PIL's filter.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .color import bound_of, finish, per_sample
from .plan import Augment, PlanBuilder, applied, check_number, check_p, define_op

__all__ = [
    "RandomAdjustSharpness",
    "RandomAutocontrast",
    "RandomEqualize",
    "RandomInvert",
    "RandomPosterize",
    "RandomSolarize",
]


def _invert_torch(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    return 1.0 - x if x.is_floating_point() else torch.bitwise_not(x)


def _solarize_torch(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    t = p["threshold"].to(torch.float32).view(-1, 1, 1, 1)
    return torch.where(x.to(torch.float32) >= t, _invert_torch(x, p), x)


def _posterize_torch(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    bits = p["bits"].to(torch.int64).view(-1, 1, 1, 1)
    mask = ((255 << (8 - bits)) & 255).to(torch.uint8)  # keep the top `bits` bits; 0 bits -> black
    return x & mask


def _solarize_add_lut(p: dict[str, Any]) -> list[int]:
    add, threshold = int(p["add"]), int(p["threshold"])
    return [min(255, v + add) if v < threshold else v for v in range(256)]


def _solarize_add_torch(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    add = p["add"].to(torch.int16).view(-1, 1, 1, 1)
    thr = p["threshold"].to(torch.int16).view(-1, 1, 1, 1)
    wide = x.to(torch.int16)
    return torch.where(wide < thr, (wide + add).clamp_(max=255), wide).to(torch.uint8)


def _equalize_torch(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    k, c, h, w = x.shape
    flat = x.reshape(k * c, h * w).to(torch.int64)
    hist = torch.zeros(k * c, 256, dtype=torch.int64, device=x.device)
    hist.scatter_add_(1, flat, torch.ones_like(flat))
    cum = hist.cumsum(1)
    last = cum.argmax(1, keepdim=True)  # the first index reaching the total: the largest value present
    step = torch.div(h * w - hist.gather(1, last), 255, rounding_mode="floor")
    lut = torch.div(cum[:, :-1] + step // 2, step.clamp(min=1), rounding_mode="floor").clamp_(0, 255)
    lut = torch.cat([torch.zeros_like(lut[:, :1]), lut], dim=1).to(torch.uint8)
    out = lut.gather(1, flat).to(torch.uint8)
    out = torch.where(step != 0, out, flat.to(torch.uint8))  # step 0 (one or two values): unchanged, as PIL
    return out.view(k, c, h, w)


def _autocontrast_torch(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    bound = bound_of(x)
    xf = x.to(torch.float32)
    lo = xf.amin(dim=(2, 3), keepdim=True)
    hi = xf.amax(dim=(2, 3), keepdim=True)
    same = hi == lo
    inv_scale = torch.where(same, torch.ones_like(hi), (hi - lo) / bound)
    lo = torch.where(same, torch.zeros_like(lo), lo)
    return finish((xf - lo) / inv_scale, x)


def _sharpness_torch(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    k, c, h, w = x.shape
    if h <= 2 or w <= 2:
        return x
    out = x.to(torch.float32)
    # PIL's SMOOTH kernel ([1 1 1; 1 5 1; 1 1 1] / 13) as nine shifted adds: exact on uint8 (integer sums below
    # 2^24), and elementwise, so no convolution's global settings (cuDNN's TF32 on a GPU) change the pixels.
    inner = out[:, :, 1:-1, 1:-1]
    total = inner * 4.0
    for dy in range(3):
        for dx in range(3):
            total += out[:, :, dy : dy + h - 2, dx : dx + w - 2]
    blurred = total / 13.0
    if not x.is_floating_point():
        blurred = blurred.round_()
    f = per_sample(p["factor"], x)
    out[:, :, 1:-1, 1:-1] = inner + (1.0 - f) * (blurred - inner)
    return finish(out, x)


def _ops() -> Any:
    from PIL import ImageOps  # the PIL kernels run on a PIL image, so PIL is there (fastload._install)

    return ImageOps


def _sharpness_pil(img: Any, p: dict[str, Any]) -> Any:
    from PIL import ImageEnhance

    return ImageEnhance.Sharpness(img).enhance(float(p["factor"]))


define_op("invert", {}, pil=lambda img, p: _ops().invert(img), torch=_invert_torch, floats=True)
define_op(
    "solarize",
    {"threshold": ("float64", ())},
    pil=lambda img, p: _ops().solarize(img, float(p["threshold"])),
    torch=_solarize_torch,
)
define_op(
    "posterize",
    {"bits": ("uint8", ())},
    pil=lambda img, p: _ops().posterize(img, int(p["bits"])),
    torch=_posterize_torch,
)
# timm's SolarizeAdd (timm/data/auto_augment.py ``solarize_add``): a lookup table, the same in every engine
define_op(
    "solarize_add",
    {"add": ("int64", ()), "threshold": ("int64", ())},
    pil=lambda img, p: img.point(_solarize_add_lut(p) * 3),
    torch=_solarize_add_torch,
)
define_op("equalize", {}, pil=lambda img, p: _ops().equalize(img), torch=_equalize_torch)
define_op("autocontrast", {}, pil=lambda img, p: _ops().autocontrast(img), torch=_autocontrast_torch, floats=True)
define_op("sharpness", {"factor": ("float64", ())}, pil=_sharpness_pil, torch=_sharpness_torch, floats=True)


class _RandomApplyOp(Augment):
    """torchvision's ``_RandomApplyTransform`` over one operation with fixed parameters."""

    _op = ""

    def __init__(self, p: float = 0.5) -> None:
        self.p = check_p(p, type(self).__name__)

    def _columns(self) -> dict[str, Any]:
        return {}

    def _params(self) -> dict[str, Any]:
        return {"p": self.p}

    def plan(self, b: PlanBuilder, index: np.ndarray, rng: np.random.Generator) -> None:
        b.add(self._op, applied(rng, index, self.p), **self._columns())


class RandomInvert(_RandomApplyOp):
    _op = "invert"


class RandomEqualize(_RandomApplyOp):
    _op = "equalize"


class RandomAutocontrast(_RandomApplyOp):
    _op = "autocontrast"


class RandomSolarize(_RandomApplyOp):
    """Invert every value ``>= threshold`` with probability ``p``."""

    _op = "solarize"

    def __init__(self, threshold: float, p: float = 0.5) -> None:
        super().__init__(p)
        self.threshold = check_number(threshold, "RandomSolarize: threshold")
        if not 0.0 <= self.threshold <= 255.0:
            raise ValueError(f"RandomSolarize: threshold={threshold!r} should be in [0, 255] for uint8 images")

    def _columns(self) -> dict[str, Any]:
        return {"threshold": self.threshold}

    def _params(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "p": self.p}


class RandomPosterize(_RandomApplyOp):
    """Keep the top ``bits`` bits (0-8) of each channel with probability ``p``."""

    _op = "posterize"

    def __init__(self, bits: int, p: float = 0.5) -> None:
        super().__init__(p)
        if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 0 <= bits <= 8:
            raise TypeError(f"RandomPosterize: bits={bits!r} must be an integer in the range [0, 8]")
        self.bits = int(bits)

    def _columns(self) -> dict[str, Any]:
        return {"bits": self.bits}

    def _params(self) -> dict[str, Any]:
        return {"bits": self.bits, "p": self.p}


class RandomAdjustSharpness(_RandomApplyOp):
    """Blend with the smoothed image by ``sharpness_factor`` (0 blurs, 1 keeps, 2 sharpens) with probability ``p``."""

    _op = "sharpness"

    def __init__(self, sharpness_factor: float, p: float = 0.5) -> None:
        super().__init__(p)
        self.sharpness_factor = check_number(sharpness_factor, "RandomAdjustSharpness: sharpness_factor")
        if self.sharpness_factor < 0:
            raise ValueError(f"RandomAdjustSharpness: sharpness_factor={sharpness_factor!r} should be non-negative")

    def _columns(self) -> dict[str, Any]:
        return {"factor": self.sharpness_factor}

    def _params(self) -> dict[str, Any]:
        return {"sharpness_factor": self.sharpness_factor, "p": self.p}
