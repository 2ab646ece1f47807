"""Colour operations: brightness, contrast, saturation, hue, grayscale (ColorJitter, Grayscale, RandomGrayscale).

PIL kernels are torchvision's v1 PIL backend (``ImageEnhance``, ``convert("HSV")``, ``convert("L")``); torch
kernels follow torchvision v2's tensor kernels: blend ``x*f + other*(1-f)`` clamped then cast (a uint8 cast
truncates, as PIL's blend does), grayscale ``0.2989 R + 0.587 G + 0.114 B`` (floored inside saturation and
contrast, truncated by the cast for Grayscale; PIL rounds ``0.299 R + 0.587 G + 0.114 B``, hence +-1), hue
through float RGB <-> HSV (PIL quantises H, S and V to 8 bits, hence the larger differences).
"""

from __future__ import annotations

import collections.abc
import numbers
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .plan import Augment, PlanBuilder, applied, check_p, define_op

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["ColorJitter", "Grayscale", "RandomGrayscale"]


# ---- torch helpers shared with the other op families ----


def bound_of(x: torch.Tensor) -> float:
    return 1.0 if x.is_floating_point() else 255.0


def per_sample(col: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A (k,) parameter column as (k, 1, 1, 1) float32, broadcasting over C, H, W."""
    return col.to(torch.float32).view(-1, 1, 1, 1)


def finish(y: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Clamp to the dtype's range and cast back; float -> uint8 truncates, as torchvision's ``.to(uint8)``."""
    y = y.clamp_(0, bound_of(like))
    return y if like.is_floating_point() else y.to(like.dtype)


def blend(x: torch.Tensor, other: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """torchvision's ``_blend``: ``x * ratio + other * (1 - ratio)`` with one ratio per sample."""
    r = ratio.to(torch.float64)
    y = x.to(torch.float32) * per_sample(r, x) + other * per_sample(1.0 - r, x)
    return finish(y, x)


def gray_float(x: torch.Tensor) -> torch.Tensor:
    """(k, 1, H, W) float32 luma with torchvision's weights, not rounded."""
    xf = x.to(torch.float32)
    r, g, b = xf.unbind(dim=1)
    return r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(1)


def _gray_degenerate(x: torch.Tensor) -> torch.Tensor:
    g = gray_float(x)
    return g if x.is_floating_point() else g.floor_()


# ---- kernels ----


def _brightness_torch(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    y = x.to(torch.float32) * per_sample(p["factor"], x)
    return finish(y, x)


def _contrast_torch(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    mean = _gray_degenerate(x).mean(dim=(1, 2, 3), keepdim=True)
    return blend(x, mean, p["factor"])


def _saturation_torch(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    return blend(x, _gray_degenerate(x), p["factor"])


def _rgb_to_hsv(img: torch.Tensor) -> torch.Tensor:
    """(k, 3, H, W) in [0, 1] -> hue, saturation, value (Pillow's algorithm, as torchvision's)."""
    r, g, _ = img.unbind(dim=1)
    maxc, _ = img.max(dim=1)
    minc, _ = img.min(dim=1)
    eqc = maxc == minc
    cr = maxc - minc
    ones = torch.ones_like(maxc)
    s = cr / torch.where(eqc, ones, maxc)
    cr_div = torch.where(eqc, ones, cr).unsqueeze(1)
    rc, gc, bc = ((maxc.unsqueeze(1) - img) / cr_div).unbind(dim=1)
    not_r = maxc != r
    is_g = maxc == g
    hr = (bc - gc) * (~not_r)
    hg = (2.0 + rc - bc) * (is_g & not_r)
    hb = (4.0 + gc - rc) * (not_r & ~is_g)
    h = torch.fmod((hr + hg + hb) / 6.0 + 1.0, 1.0)
    return torch.stack((h, s, maxc), dim=1)


def _hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    h, s, v = hsv.unbind(dim=1)
    i = torch.floor(h * 6.0)
    f = h * 6.0 - i
    i = i.to(torch.int64).remainder(6)
    p = (v * (1.0 - s)).clamp(0.0, 1.0)
    q = (v * (1.0 - s * f)).clamp(0.0, 1.0)
    t = (v * (1.0 - s * (1.0 - f))).clamp(0.0, 1.0)
    # Sector i picks (R, G, B) from (v, p, q, t); built from device-side comparisons (no host constant to
    # copy, which would wait on the device's queue).
    sector = i.unsqueeze(1) == torch.arange(6, device=hsv.device).view(1, 6, 1, 1)  # (k, 6, H, W)
    r = torch.stack((v, q, p, p, t, v), dim=1)
    g = torch.stack((t, v, v, q, p, p), dim=1)
    b = torch.stack((p, p, t, v, v, q), dim=1)
    return torch.stack([(c * sector).sum(dim=1) for c in (r, g, b)], dim=1)


def _hue_torch(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    xf = x.to(torch.float32) if x.is_floating_point() else x.to(torch.float32).mul_(1.0 / 255.0)
    hsv = _rgb_to_hsv(xf)
    hsv[:, 0] = torch.remainder(hsv[:, 0] + per_sample(p["factor"], x)[:, 0], 1.0)
    rgb = _hsv_to_rgb(hsv)
    if x.is_floating_point():
        return rgb
    return rgb.mul_(255.0 + 1.0 - 1e-3).to(x.dtype)  # torchvision's float -> uint8 conversion


def _grayscale_torch(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    g = gray_float(x)
    g = g if x.is_floating_point() else g.to(x.dtype)
    return g.expand_as(x).contiguous()


def _pil_enhance(kind: str) -> Any:
    def enhance(img: Image.Image, p: dict[str, Any]) -> Image.Image:
        from PIL import ImageEnhance  # the PIL kernels run on a PIL image, so PIL is there (fastload._install)

        return getattr(ImageEnhance, kind)(img).enhance(float(p["factor"]))

    return enhance


def _hue_pil(img: Image.Image, p: dict[str, Any]) -> Image.Image:
    from PIL import Image

    h, s, v = img.convert("HSV").split()
    np_h = np.array(h, dtype=np.uint8)
    with np.errstate(over="ignore"):
        np_h += np.uint8(np.int64(float(p["factor"]) * 255) & 0xFF)  # torchvision: np.uint8(hue_factor * 255)
    return Image.merge("HSV", (Image.fromarray(np_h, "L"), s, v)).convert("RGB")


def _grayscale_pil(img: Image.Image, p: dict[str, Any]) -> Image.Image:
    return img.convert("L").convert("RGB")


_FACTOR = {"factor": ("float64", ())}
define_op("brightness", _FACTOR, pil=_pil_enhance("Brightness"), torch=_brightness_torch, floats=True)
define_op("contrast", _FACTOR, pil=_pil_enhance("Contrast"), torch=_contrast_torch, floats=True)
define_op("saturation", _FACTOR, pil=_pil_enhance("Color"), torch=_saturation_torch, floats=True)
define_op("hue", _FACTOR, pil=_hue_pil, torch=_hue_torch, floats=True)
define_op("grayscale", {}, pil=_grayscale_pil, torch=_grayscale_torch, floats=True)


# ---- transforms ----


def _jitter_range(
    value: Any,
    name: str,
    center: float = 1.0,
    bound: tuple[float, float] = (0.0, float("inf")),
    clip_first_on_zero: bool = True,
) -> tuple[float, float] | None:
    """torchvision's ``ColorJitter._check_input``: a number v -> [center - v, center + v] (clipped at 0), or a
    (min, max) pair; None when it would change nothing."""
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"ColorJitter: if {name} is a single number, it must be non negative, got {value}")
        lo, hi = center - float(value), center + float(value)
        if clip_first_on_zero:
            lo = max(lo, 0.0)
    elif isinstance(value, collections.abc.Sequence) and not isinstance(value, str) and len(value) == 2:
        try:
            lo, hi = float(value[0]), float(value[1])
        except (TypeError, ValueError):
            raise TypeError(f"ColorJitter: {name}={value!r} should be a number or a (min, max) pair") from None
    else:
        raise TypeError(f"ColorJitter: {name}={value!r} should be a single number or a sequence with length 2")
    if not bound[0] <= lo <= hi <= bound[1]:
        raise ValueError(f"ColorJitter: {name} values should be between {bound}, but got {[lo, hi]}")
    return None if lo == hi == center else (lo, hi)


class ColorJitter(Augment):
    """Brightness, contrast, saturation and hue factors drawn uniformly, applied in a random order per sample
    (torchvision draws ``randperm(4)``; here one permutation per sample from argsort of 4 uniforms)."""

    _NAMES = ("brightness", "contrast", "saturation", "hue")

    def __init__(self, brightness: Any = None, contrast: Any = None, saturation: Any = None, hue: Any = None) -> None:
        self.brightness = _jitter_range(brightness, "brightness")
        self.contrast = _jitter_range(contrast, "contrast")
        self.saturation = _jitter_range(saturation, "saturation")
        self.hue = _jitter_range(hue, "hue", center=0.0, bound=(-0.5, 0.5), clip_first_on_zero=False)

    def _params(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._NAMES}

    def plan(self, b: PlanBuilder, index: np.ndarray, rng: np.random.Generator) -> None:
        k = index.size
        order = np.argsort(rng.random((k, 4)), axis=1)  # a uniform random permutation per sample
        factors = [None if r is None else rng.uniform(r[0], r[1], k) for r in map(self._params().get, self._NAMES)]
        for pos in range(4):
            for j, name in enumerate(self._NAMES):
                if factors[j] is not None:
                    sel = order[:, pos] == j
                    b.add(name, index[sel], factor=factors[j][sel])


class Grayscale(Augment):
    """Convert to grayscale. ``num_output_channels=1`` makes the whole batch single-channel (so it must apply
    to every sample); 3 keeps three equal channels."""

    def __init__(self, num_output_channels: int = 1) -> None:
        if num_output_channels not in (1, 3) or isinstance(num_output_channels, bool):
            raise ValueError(f"Grayscale: num_output_channels={num_output_channels!r} must be 1 or 3")
        self.num_output_channels = int(num_output_channels)

    def _params(self) -> dict[str, Any]:
        return {"num_output_channels": self.num_output_channels}

    def plan(self, b: PlanBuilder, index: np.ndarray, rng: np.random.Generator) -> None:
        if self.num_output_channels == 1:
            if not b.whole_batch(index):
                raise ValueError(
                    "Grayscale(num_output_channels=1) changes the batch's channel count, so it must "
                    "apply to every sample; inside RandomApply/RandomChoice/RandomOrder use "
                    "Grayscale(num_output_channels=3) or RandomGrayscale"
                )
            b.channels = 1
        b.add("grayscale", index)


class RandomGrayscale(Augment):
    """Grayscale with probability ``p`` (default 0.1), keeping the number of channels."""

    def __init__(self, p: float = 0.1) -> None:
        self.p = check_p(p, "RandomGrayscale")

    def _params(self) -> dict[str, Any]:
        return {"p": self.p}

    def plan(self, b: PlanBuilder, index: np.ndarray, rng: np.random.Generator) -> None:
        b.add("grayscale", applied(rng, index, self.p))
