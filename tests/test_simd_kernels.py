"""The resize kernels (csrc/resize.cc: scalar or SSSE3 horizontally, SSE2 or AVX2 vertically) compute the same integers, so they write the
same bytes. Each runs in its own process (FASTLOAD_SIMD picks a narrower kernel than the CPU has)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fastload import _C

PROBE = r"""
import hashlib, numpy as np
from fastload import _C
rng = np.random.default_rng(0)
h = hashlib.sha256()
for k in range(60):
    H, W = int(rng.integers(1, 300)), int(rng.integers(1, 300))
    img = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
    top, left = int(rng.integers(0, H)), int(rng.integers(0, W))
    crop = (top, left, int(rng.integers(1, H - top + 1)), int(rng.integers(1, W - left + 1)))
    out_hw = (int(rng.integers(1, 260)), int(rng.integers(1, 260)))
    h.update(_C.resize_crop(img, crop, out_hw, bool(k % 2)).tobytes())
print(h.hexdigest())
"""


def digest(level: str | None) -> str:
    env = dict(os.environ)
    env.pop("FASTLOAD_SIMD", None)
    if level:
        env["FASTLOAD_SIMD"] = level
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(not hasattr(_C, "resize_crop"), reason="no resize_crop binding")
def test_every_kernel_writes_the_same_bytes():
    widest = digest(None)
    assert digest("ssse3") == widest
    assert digest("scalar") == widest
