"""Gaussian blur and erasing: GaussianBlur, RandomErasing.

Blur follows torchvision's kernel: ``exp(-x^2 / (2 sigma^2))`` sampled at ``linspace(-(k-1)/2, (k-1)/2, k)``,
normalised, reflect padding, rounded back to uint8. torchvision's PIL backend itself converts the picture to
a tensor and runs that kernel, so the reference kernel here is the same formula in numpy (2-D, float64); the
batched engine runs it separably with one kernel per sample (multiply-adds of shifted views over the subset).

Erasing fills a rectangle drawn as torchvision's ``RandomErasing.get_params`` (10 attempts of a scale and a
log-uniform ratio, ``h = round(sqrt(area * ratio))``, accepted when ``h < H and w < W``; no erasing when all
10 fail). Note torchvision's recipes apply it after Normalize, where ``value=0`` is the mean colour; on the
uint8 tiles the plan runs on, ``value`` is in pixel units (0-255). The torch kernel also runs on float
batches, so the wiring can run erase steps after normalisation.

``value="random"``: per-pixel noise, uniform over 0-255 per channel (torchvision draws normal(0, 1) values in
the normalised space it erases after Normalize; on uint8 tiles, before Normalize, uniform bytes are the noise
that does not depend on the dataset's statistics). It is a function of a per-sample seed drawn from the batch's
generator, the pixel's place in the box and the channel (the top byte of splitmix64, csrc/augment.cc's
``erase_noise``), so all three engines write the same bytes.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from .plan import Augment, PlanBuilder, applied, at, check_p, define_op

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["GaussianBlur", "RandomErasing"]


def _kernel1d_np(size: int, sigma: float) -> np.ndarray:
    half = (size - 1) * 0.5
    pdf = np.exp(-0.5 * (np.linspace(-half, half, size) / sigma) ** 2)
    return pdf / pdf.sum()


def _blur_pil(img: Image.Image, p: dict[str, Any]) -> Image.Image:
    from PIL import Image  # the PIL kernels run on a PIL image, so PIL is there (fastload._install)

    kx, ky = (int(v) for v in p["ksize"])
    sx, sy = (float(v) for v in p["sigma"])
    a = np.asarray(img, dtype=np.float64)
    a = np.pad(a, ((ky // 2, ky // 2), (kx // 2, kx // 2), (0, 0)), mode="reflect")
    k2 = np.outer(_kernel1d_np(ky, sy), _kernel1d_np(kx, sx))
    h, w = img.height, img.width
    out = np.zeros((h, w, a.shape[2]))
    for dy in range(ky):
        for dx in range(kx):
            out += k2[dy, dx] * a[dy : dy + h, dx : dx + w]
    return Image.fromarray(np.clip(np.rint(out), 0, 255).astype(np.uint8), img.mode)


def _blur_torch(x: torch.Tensor, p: Any) -> torch.Tensor:
    k, c, h, w = x.shape
    out = torch.empty_like(x)
    sizes = p.host["ksize"]
    groups, counts = np.unique(sizes, axis=0, return_counts=True)  # sorted by (kx, ky)
    if len(groups) > 1:
        # Each kernel size's rows, found on the device: a stable sort of the device's own ksize column by a key
        # ordered as ``groups`` puts each group's rows, ascending, at offsets the host's counts give. A slice at
        # host-known offsets needs no sync, and no index array copied from (pageable) host memory, which on a
        # GPU would make the host wait for everything queued on the stream first.
        ks = p["ksize"].to(torch.int64)
        order = torch.argsort(ks[:, 0] * (int(sizes[:, 1].max()) + 1) + ks[:, 1], stable=True)
        starts = np.concatenate([[0], np.cumsum(counts)]).tolist()
    for g, (kx, ky) in enumerate(groups):  # one group per kernel size: in practice one (then no index at all)
        sel = None if len(groups) == 1 else order[starts[g] : starts[g + 1]]
        xs = (x if sel is None else x.index_select(0, sel)).to(torch.float32)
        m = int(counts[g])
        sig = (p["sigma"] if sel is None else p["sigma"].index_select(0, sel)).to(torch.float32)

        def kernels(size: int, s: torch.Tensor) -> torch.Tensor:
            half = (size - 1) * 0.5
            t = torch.linspace(-half, half, size, device=x.device, dtype=torch.float32)
            pdf = torch.exp(-0.5 * (t / s[:, None]) ** 2)
            return (pdf / pdf.sum(1, keepdim=True)).repeat_interleave(c, dim=0)  # (m*c, size)

        ky_, kx_ = int(ky), int(kx)
        xp = F.pad(xs, (kx_ // 2, kx_ // 2, ky_ // 2, ky_ // 2), mode="reflect").reshape(
            m * c, h + ky_ - 1, w + kx_ - 1
        )
        xp = _shifted_sum(xp, kernels(ky_, sig[:, 1]), axis=1)
        xp = _shifted_sum(xp, kernels(kx_, sig[:, 0]), axis=2)
        y = xp.view(m, c, h, w)
        y = y if x.is_floating_point() else y.round_().clamp_(0, 255).to(x.dtype)
        if sel is None:
            return y
        out.index_copy_(0, sel, y)
    return out


def _shifted_sum(x: torch.Tensor, weights: torch.Tensor, axis: int) -> torch.Tensor:
    """A valid 1-D correlation of each plane of ``x`` (P, H, W) with its own kernel ``weights`` (P, k) along
    ``axis``, as k multiply-adds of shifted views. Elementwise float32 arithmetic on purpose: a convolution on a
    GPU follows global settings (cuDNN's TF32, on by default on Ampere and later, rounds the operands to 10
    bits), so the pixels would depend on the user's flags and differ from the CPU's; these do not."""
    k = weights.shape[1]
    n = x.shape[axis] - k + 1
    out = x.narrow(axis, 0, n) * weights[:, 0].view(-1, 1, 1)
    for i in range(1, k):
        out.addcmul_(x.narrow(axis, i, n), weights[:, i].view(-1, 1, 1))
    return out


def _check_erase_value(value: np.ndarray, floats: bool) -> None:
    if not floats and (np.any(value < 0) or np.any(value > 255)):
        raise ValueError(
            f"RandomErasing: value={value.tolist()} is outside 0-255, the range of the uint8 images "
            f"it is applied to; give the value in pixel units or apply erasing to normalised floats"
        )


def _erase_pil(img: Image.Image, p: dict[str, Any]) -> Image.Image:
    from PIL import Image

    top, left, h, w = (int(v) for v in p["box"])
    _check_erase_value(p["value"], floats=False)
    a = np.array(img)
    a[top : top + h, left : left + w] = np.trunc(p["value"]).astype(np.uint8)
    return Image.fromarray(a, img.mode)


def _erase_torch(x: torch.Tensor, p: Any) -> torch.Tensor:
    _check_erase_value(p.host["value"], x.is_floating_point())
    k, c, h, w = x.shape
    box = p["box"].to(torch.int64)
    rows = torch.arange(h, device=x.device).view(1, 1, h, 1)
    cols = torch.arange(w, device=x.device).view(1, 1, 1, w)
    top, left = box[:, 0].view(-1, 1, 1, 1), box[:, 1].view(-1, 1, 1, 1)
    bh, bw = box[:, 2].view(-1, 1, 1, 1), box[:, 3].view(-1, 1, 1, 1)
    inside = (rows >= top) & (rows < top + bh) & (cols >= left) & (cols < left + bw)
    value = p["value"].to(torch.float32)[:, :c].view(k, c, 1, 1)
    value = value if x.is_floating_point() else value.trunc().to(x.dtype)
    return torch.where(inside, value.to(x.dtype), x)


_G, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def erase_noise_np(seed: int, h: int, w: int) -> np.ndarray:
    """(h, w, 3) uint8: the noise of a box (csrc/augment.cc ``erase_noise``), in numpy's wrapping uint64."""
    k = np.arange(h * w * 3, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) * np.uint64(_G) + k + np.uint64(_G)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(56)).astype(np.uint8).reshape(h, w, 3)


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _shr(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def erase_noise_torch(seed: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The same noise for int64 ``seed`` (broadcast) and byte positions ``k``: int64 multiplication wraps."""
    z = seed * _signed(_G) + k + _signed(_G)
    z = (z ^ _shr(z, 30)) * _signed(_M1)
    z = (z ^ _shr(z, 27)) * _signed(_M2)
    return _shr(z ^ _shr(z, 31), 56)


def _erase_random_pil(img: Image.Image, p: dict[str, Any]) -> Image.Image:
    from PIL import Image

    top, left, h, w = (int(v) for v in p["box"])
    a = np.array(img)
    a[top : top + h, left : left + w] = erase_noise_np(int(p["seed"]), h, w)
    return Image.fromarray(a, img.mode)


def _erase_random_torch(x: torch.Tensor, p: Any) -> torch.Tensor:
    if x.is_floating_point():
        raise TypeError("RandomErasing(value='random') runs on uint8 tiles (its noise is uniform bytes)")
    k, c, h, w = x.shape
    box = p["box"].to(torch.int64)
    rows = torch.arange(h, device=x.device).view(1, 1, h, 1)
    cols = torch.arange(w, device=x.device).view(1, 1, 1, w)
    chans = torch.arange(c, device=x.device).view(1, c, 1, 1)
    top, left = box[:, 0].view(-1, 1, 1, 1), box[:, 1].view(-1, 1, 1, 1)
    bh, bw = box[:, 2].view(-1, 1, 1, 1), box[:, 3].view(-1, 1, 1, 1)
    inside = (rows >= top) & (rows < top + bh) & (cols >= left) & (cols < left + bw)
    pos = ((rows - top) * bw + (cols - left)) * 3 + chans
    noise = erase_noise_torch(p["seed"].to(torch.float64).to(torch.int64).view(-1, 1, 1, 1), pos)
    return torch.where(inside, noise.to(x.dtype), x)


define_op(
    "gaussian_blur",
    {"ksize": ("int64", (2,)), "sigma": ("float64", (2,))},
    pil=_blur_pil,
    torch=_blur_torch,
    floats=True,
)
define_op(
    "erase", {"box": ("int64", (4,)), "value": ("float64", (3,))}, pil=_erase_pil, torch=_erase_torch, floats=True
)
define_op(
    "erase_random", {"box": ("int64", (4,)), "seed": ("float64", ())}, pil=_erase_random_pil, torch=_erase_random_torch
)


def _pair_of(value: Any, what: str) -> tuple[float, float]:
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value)
    ):
        return float(value[0]), float(value[1])
    raise TypeError(f"{what}={value!r} should be a (min, max) pair of numbers")


class GaussianBlur(Augment):
    """Blur with a ``kernel_size`` (int or (kx, ky), odd and positive) kernel and sigma drawn uniformly from
    ``sigma`` (a number s means exactly s; default (0.1, 2.0)), one sigma per sample for both axes."""

    def __init__(self, kernel_size: Any, sigma: Any = (0.1, 2.0)) -> None:
        ks = kernel_size if isinstance(kernel_size, (list, tuple)) else (kernel_size, kernel_size)
        if len(ks) != 2 or any(isinstance(k, bool) or not isinstance(k, (int, np.integer)) for k in ks):
            raise TypeError(f"GaussianBlur: kernel_size={kernel_size!r} should be an int or a pair of ints")
        if any(k <= 0 or k % 2 == 0 for k in ks):
            raise ValueError(f"GaussianBlur: kernel_size={kernel_size!r} should have odd and positive integers")
        self.kernel_size = (int(ks[0]), int(ks[1]))
        if isinstance(sigma, numbers.Real) and not isinstance(sigma, bool):
            if sigma <= 0:
                raise ValueError(f"GaussianBlur: sigma={sigma!r}: if sigma is a single number, it must be positive")
            self.sigma = (float(sigma), float(sigma))
        else:
            self.sigma = _pair_of(sigma, "GaussianBlur: sigma")
            if not 0.0 < self.sigma[0] <= self.sigma[1]:
                raise ValueError(f"GaussianBlur: sigma={sigma!r} should be (min, max) with 0 < min <= max")

    def _params(self) -> dict[str, Any]:
        return {"kernel_size": self.kernel_size, "sigma": self.sigma}

    def tile_refusal(self, hw: np.ndarray) -> tuple[np.ndarray, str, str]:
        """``(bad, need, fix)`` for tiles of sizes ``hw`` (n, 2): the ones this kernel cannot blur (torchvision's
        reflect padding needs more pixels than half the kernel), what ``fastload.open`` checks every sample's
        output size against (``ImagePipeline.check_sizes``)."""
        kx, ky = self.kernel_size
        return (
            (ky // 2 >= hw[:, 0]) | (kx // 2 >= hw[:, 1]),
            f"a tile larger than half the kernel ({ky // 2 + 1}x{kx // 2 + 1} or more, h x w: reflect padding)",
            "give it a smaller kernel_size, or crop or resize to a larger output before it",
        )

    def plan(self, b: PlanBuilder, index: np.ndarray, rng: np.random.Generator) -> None:
        kx, ky = self.kernel_size
        hw = b.out_hw[index]
        bad = np.flatnonzero(self.tile_refusal(hw)[0])
        if bad.size:
            i = int(index[bad[0]])
            raise ValueError(
                f"GaussianBlur: kernel_size={self.kernel_size} needs a tile larger than half the kernel "
                f"(reflect padding), but sample {i} of the batch is {hw[bad[0], 0]}x{hw[bad[0], 1]}"
            )
        s = rng.uniform(self.sigma[0], self.sigma[1], index.size)
        b.add("gaussian_blur", index, ksize=np.array(self.kernel_size), sigma=np.stack([s, s], axis=1))


class RandomErasing(Augment):
    """Erase a random rectangle with probability ``p`` (torchvision's defaults: scale (0.02, 0.33), ratio
    (0.3, 3.3), value 0)."""

    def __init__(
        self,
        p: float = 0.5,
        scale: Any = (0.02, 0.33),
        ratio: Any = (0.3, 3.3),
        value: Any = 0.0,
        inplace: bool = False,
    ) -> None:
        self.p = check_p(p, "RandomErasing")
        self.scale = _pair_of(scale, "RandomErasing: scale")
        self.ratio = _pair_of(ratio, "RandomErasing: ratio")
        if not 0.0 <= self.scale[0] <= self.scale[1] <= 1.0:
            raise ValueError(f"RandomErasing: scale={scale!r} should be (min, max) with 0 <= min <= max <= 1")
        if not 0.0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"RandomErasing: ratio={ratio!r} should be (min, max) with 0 < min <= max")
        if isinstance(value, str):
            if value != "random":
                raise ValueError(
                    f"RandomErasing: value={value!r} should be a number, one number per channel or "
                    f"'random' (per-pixel noise)"
                )
            self.value: Any = "random"
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            self.value = (float(value),)
        elif (
            isinstance(value, (list, tuple))
            and len(value) in (1, 3)
            and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value)
        ):
            self.value = tuple(float(v) for v in value)
        else:
            raise TypeError(f"RandomErasing: value={value!r} should be a number or a sequence of 1 or 3 numbers")
        self.inplace = bool(inplace)  # accepted for torchvision's signature; engines write their own outputs

    def _params(self) -> dict[str, Any]:
        return {"p": self.p, "scale": self.scale, "ratio": self.ratio, "value": self.value}

    def plan(self, b: PlanBuilder, index: np.ndarray, rng: np.random.Generator) -> None:
        sel = applied(rng, index, self.p)
        rng = at(rng, sel)  # the rest is drawn for the erased samples only
        k = sel.size
        img_h, img_w = b.out_hw[sel, 0][:, None], b.out_hw[sel, 1][:, None]
        area = (img_h * img_w).astype(np.float64)
        erase_area = area * rng.uniform(self.scale[0], self.scale[1], (k, 10))
        aspect = np.exp(rng.uniform(math.log(self.ratio[0]), math.log(self.ratio[1]), (k, 10)))
        hs = np.rint(np.sqrt(erase_area * aspect)).astype(np.int64)  # rint: half to even, as Python's round
        ws = np.rint(np.sqrt(erase_area / aspect)).astype(np.int64)
        ok = (hs < img_h) & (ws < img_w)
        found = ok.any(axis=1)
        first = ok.argmax(axis=1)
        rows = np.arange(k)
        h, w = np.where(found, hs[rows, first], 0), np.where(found, ws[rows, first], 0)
        top = rng.integers(0, img_h[:, 0] - h + 1) if k else np.zeros(0, np.int64)
        left = rng.integers(0, img_w[:, 0] - w + 1) if k else np.zeros(0, np.int64)
        box = np.stack([top, left, h, w], axis=1)[found]
        if self.value == "random":  # one seed per erasing sample (drawn for every applied one, found or not)
            seed = rng.integers(0, 2**53, k).astype(np.float64)[found]
            b.add("erase_random", sel[found], box=box, seed=seed)
            return
        value = np.broadcast_to(np.asarray(self.value), (3,))
        b.add("erase", sel[found], box=box, value=value)
