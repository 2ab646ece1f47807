"""Shared helpers for the augmentation tests: tiles built at test time, the engine comparison, and the
critical values of the statistical tests (no scipy here, so they are computed from their approximations)."""

from __future__ import annotations

import io
import math

import numpy as np
import torch
from PIL import Image

from conftest import jpeg_bytes, pil_rgb
from fastload._augment.engine_pil import run_pil
from fastload._augment.engine_torch import run_torch

H, W = 48, 64


def smooth_tiles(n: int, h: int = H, w: int = W, seed: int = 0) -> np.ndarray:
    """(n, h, w, 3) uint8: smooth random pictures (upsampled noise, JPEG round trip)."""
    return np.stack([pil_rgb(jpeg_bytes(h, w, seed=seed + i)) for i in range(n)])


def photo_tiles(n: int, h: int = H, w: int = W, seed: int = 0) -> np.ndarray:
    """(n, h, w, 3) uint8 that behave like photos: a sky gradient, shapes with hard edges, saturated and
    near-black areas, a sharp highlight, fine texture and sensor noise, through JPEG at quality 85."""
    out = []
    for i in range(n):
        rng = np.random.default_rng(seed + 1000 + i)
        y, x = np.mgrid[0:h, 0:w].astype(np.float64)
        img = np.stack([60 + 120 * y / h, 90 + 100 * y / h, 200 - 60 * y / h], -1)  # sky
        ground = y > h * rng.uniform(0.45, 0.7)
        img[ground] = (70, 110, 40)
        img += (12 * np.sin(x / rng.uniform(1.5, 3.0)) * ground)[..., None]  # grass texture
        for _ in range(3):
            cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(4, h / 3)
            img[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.integers(0, 256, 3)
        t, l = int(rng.integers(0, h // 2)), int(rng.integers(0, w // 2))
        img[t:t + h // 6, l:l + w // 5] = (8, 6, 10)  # shadow
        img[t:t + 3, l:l + 3] = (255, 255, 250)  # highlight
        img += rng.normal(0, 4, img.shape)
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=85)
        out.append(pil_rgb(buf.getvalue()))
    return np.stack(out)


def to_batch(tiles: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(tiles).permute(0, 3, 1, 2).contiguous()


def engines(tiles: np.ndarray, plan) -> tuple[np.ndarray, np.ndarray]:
    """(torch engine, PIL reference) outputs as int HWC arrays."""
    out = run_torch(to_batch(tiles), plan).permute(0, 2, 3, 1).numpy().astype(np.int64)
    ref = np.stack([run_pil(tiles[i], plan, i) for i in range(plan.n)]).astype(np.int64)
    return out, ref


def differences(tiles: np.ndarray, plan) -> tuple[int, float, float]:
    """Max and mean absolute difference between the engines, and the fraction of values that differ."""
    out, ref = engines(tiles, plan)
    d = np.abs(out - ref)
    return int(d.max()), float(d.mean()), float(np.mean(d > 0))


# ---- statistics ----

def chi2_critical(dof: int, alpha: float = 1e-3) -> float:
    """Upper critical value of chi-square (Wilson-Hilferty; within a few percent for dof >= 3)."""
    z = {1e-3: 3.0902, 1e-4: 3.7190}[alpha]
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2_uniform(counts: np.ndarray, probs: np.ndarray | None = None) -> tuple[float, float]:
    """(statistic, critical value at 1e-3) of observed counts against probabilities (uniform by default)."""
    counts = np.asarray(counts, dtype=np.float64)
    probs = np.full(counts.size, 1.0 / counts.size) if probs is None else np.asarray(probs, dtype=np.float64)
    expected = counts.sum() * probs
    keep = expected > 0
    stat = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    return stat, chi2_critical(int(keep.sum()) - 1)


def ks_critical(n: int, m: int | None = None, alpha: float = 1e-3) -> float:
    """Kolmogorov-Smirnov critical distance (asymptotic), one sample of n or two samples of n and m."""
    c = math.sqrt(-0.5 * math.log(alpha / 2))
    return c * math.sqrt((n + m) / (n * m)) if m else c / math.sqrt(n)


def ks_uniform(values: np.ndarray, lo: float, hi: float) -> float:
    """One-sample KS distance of ``values`` from Uniform(lo, hi)."""
    v = np.sort((np.asarray(values) - lo) / (hi - lo))
    n = v.size
    i = np.arange(1, n + 1)
    return float(max(np.max(i / n - v), np.max(v - (i - 1) / n)))


def ks_two(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample KS distance."""
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    return float(np.max(np.abs(np.searchsorted(a, grid, side="right") / a.size
                               - np.searchsorted(b, grid, side="right") / b.size)))
