"""The resize kernels (csrc/resize.cc: scalar, SSSE3 or AVX2 horizontally, SSE2 or AVX2 vertically) compute the same integers, so they write the
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


GUARDED = r"""
import ctypes, hashlib, mmap, sys
import numpy as np
from fastload import _C
# An image whose last byte is the last byte before a PROT_NONE page: a kernel that loads past the
# source's end crashes here instead of reading a neighbour's bytes unnoticed.
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
page = mmap.PAGESIZE
h = hashlib.sha256()
rng = np.random.default_rng(1)
for H, W in [(37, 41), (64, 85), (9, 300), (120, 7)]:
    size = H * W * 3
    span = (size + page - 1) // page * page
    base = libc.mmap(None, span + page, 3, 0x22, -1, 0)  # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
    assert base not in (None, ctypes.c_void_p(-1).value)
    assert libc.mprotect(base + span, page, 0) == 0  # PROT_NONE
    img = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(base + span - size)).reshape(H, W, 3)
    img[:] = rng.integers(0, 256, img.shape, dtype=np.uint8)
    for out_w in (5, 64, 224):  # upscales and downscales: 1 to 4+ tap pairs per output pixel
        for top, left in [(0, 0), (H // 2, W // 3), (H - 4 if H > 4 else 0, W - 3)]:
            crop = (top, left, H - top, W - left)  # every crop reaches the image's last row and column
            for flip in (False, True):
                h.update(_C.resize_crop(img, crop, (16, out_w), flip).tobytes())
print(h.hexdigest())
"""


@pytest.mark.skipif(not hasattr(_C, "resize_crop"), reason="no resize_crop binding")
def test_kernels_stay_inside_an_image_that_ends_at_a_guard_page():
    digests = set()
    for level in (None, "ssse3", "scalar"):
        env = {k: v for k, v in os.environ.items() if k != "FASTLOAD_SIMD"}
        if level:
            env["FASTLOAD_SIMD"] = level
        out = subprocess.run([sys.executable, "-c", GUARDED], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, f"FASTLOAD_SIMD={level}: exit {out.returncode}\n{out.stderr[-2000:]}"
        digests.add(out.stdout.strip())
    assert len(digests) == 1
