"""PIL's ``ImageEnhance.Color`` and ``ImageEnhance.Contrast`` as plan operations, byte for byte as the PIL installed
(issue 30: timm's Color/Contrast ops and their Increasing variants run these on PIL images).

``color.py``'s ``saturation``/``contrast`` are torchvision's tensor kernels (a floored float luma, blended as
``x * f + gray * (1 - f)``); PIL rounds its luma and blends as ``gray + f * (x - gray)``, so the two differ by a
level near factor 1 and by ``|1 - f|`` levels further out (2-3 at timm's factors of 2.8-3.7 with ``mmax`` 20).
Here PIL's arithmetic (csrc/pil_enhance.h says it in full): each byte ``(uint8)(d + (float)f * (v - d))`` in
float32, clamped to [0, 255]; ``d`` the pixel's luma (Color) or ``int(mean + 0.5)`` of the image's luma
(Contrast, ``ImageStat``'s mean). The luma is ``convert("L")``'s, which differs between Pillow (a rounded
16-bit fixed point on every pixel) and Pillow-SIMD (15-bit weights on a row's whole groups of 4 pixels, Pillow's
on the last ``w % 4``): :func:`pil_luma` probes the installed PIL once, and the plan carries the answer per sample
(column ``luma``: :data:`LUMA_PILLOW` or :data:`LUMA_SIMD`) to the native and torch kernels. A PIL matching
neither is said once, and Pillow's is used (then a pixel can be a level or so off where the two lumas differ).
"""

from __future__ import annotations

import functools
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .plan import define_op

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["EDGE", "LUMA_PILLOW", "LUMA_SIMD", "luma_numpy", "pil_luma"]

LUMA_PILLOW, LUMA_SIMD = 0, 1
#: a colour whose two lumas differ (17 in Pillow's, 16 in Pillow-SIMD's groups of 4)
EDGE = (0, 5, 119)


def luma_numpy(rgb: np.ndarray, variant: int) -> np.ndarray:
    """``convert("L")`` of (..., W, 3) uint8 pixels as ``variant`` computes it: int64 (..., W)."""
    x = rgb.astype(np.int64)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    l24 = (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16
    if variant == LUMA_PILLOW:
        return l24
    w = rgb.shape[-2]
    body = np.arange(w) < w // 4 * 4
    return np.where(body, (r * 9798 + g * 19235 + b * 3735 + 0x4000) >> 15, l24)


@functools.lru_cache(maxsize=None)
def pil_luma() -> int:
    """Which luma the installed PIL's ``convert("L")`` computes (module docstring), probed once on a row of
    noise with a width that leaves a tail (and Pillow's when there is no PIL: nothing to agree with)."""
    try:
        from PIL import Image
    except ImportError:
        return LUMA_PILLOW
    row = np.random.default_rng(0).integers(0, 256, (1, 4099, 3), dtype=np.uint8)
    row[0, :4] = row[0, -1] = EDGE  # in a group of 4 and in the tail
    got = np.asarray(Image.fromarray(row).convert("L")).astype(np.int64)
    for variant in (LUMA_PILLOW, LUMA_SIMD):
        if np.array_equal(got, luma_numpy(row, variant)):
            return variant
    warnings.warn(
        f"fastload: the installed PIL's convert('L') (PIL {getattr(Image, '__version__', '?')}) matches neither "
        f"Pillow's nor Pillow-SIMD's arithmetic, so timm's Color/Contrast ops use Pillow's luma and can differ "
        f"from this PIL's ImageEnhance by a level or so where the two lumas differ",
        UserWarning,
        stacklevel=2,
    )
    return LUMA_PILLOW


# ---- torch kernels (uint8 only: PIL's arithmetic is on bytes) ----


def _luma_torch(x: torch.Tensor, luma: torch.Tensor) -> torch.Tensor:
    """(k, H, W) int32 luma of (k, 3, H, W) uint8 rows, each sample's ``luma`` variant."""
    r, g, b = x.to(torch.int32).unbind(dim=1)
    l24 = (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16
    l15 = (r * 9798 + g * 19235 + b * 3735 + 0x4000) >> 15
    w = x.shape[-1]
    body = torch.arange(w, device=x.device) < w // 4 * 4
    simd = luma.to(x.device).view(-1, 1, 1) == LUMA_SIMD
    return torch.where(simd & body.view(1, 1, -1), l15, l24)


def _blend_torch(x: torch.Tensor, d: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's blend toward ``d`` (integer-valued float32, broadcasting): ``d + f * (x - d)``, the product and the
    sum rounded apart (two kernels, never fused), clamped, truncated."""
    a = factor.to(torch.float32).view(-1, 1, 1, 1)
    y = torch.mul(x.to(torch.float32) - d, a)
    return torch.add(y, d).clamp_(0.0, 255.0).to(torch.uint8)


def _color_torch(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    d = _luma_torch(x, p["luma"]).to(torch.float32).unsqueeze(1)
    return _blend_torch(x, d, p["factor"])


def _contrast_torch(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    k, _, h, w = x.shape
    total = _luma_torch(x, p["luma"]).to(torch.int64).sum(dim=(1, 2))
    mean = torch.floor(total.to(torch.float64) / float(h * w) + 0.5)  # int(mean + 0.5) of a mean >= 0
    return _blend_torch(x, mean.to(torch.float32).view(k, 1, 1, 1), p["factor"])


# ---- PIL kernels: PIL's own ----


def _enhance(kind: str) -> Any:
    def enhance(img: Image.Image, p: dict[str, Any]) -> Image.Image:
        from PIL import ImageEnhance

        return getattr(ImageEnhance, kind)(img).enhance(float(p["factor"]))

    return enhance


_COLUMNS: dict[str, tuple[str, tuple[int, ...]]] = {"factor": ("float64", ()), "luma": ("int64", ())}
define_op("pil_color", _COLUMNS, pil=_enhance("Color"), torch=_color_torch)
define_op("pil_contrast", _COLUMNS, pil=_enhance("Contrast"), torch=_contrast_torch)
