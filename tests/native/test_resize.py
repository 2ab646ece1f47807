"""csrc/resize.cc: crop + resize + flip against PIL, argument errors, no read past the end of a raw
sample, and every SIMD kernel (scalar, SSSE3 or AVX2 horizontally, SSE2 or AVX2 vertically) writing the same
bytes, each in its own process (FASTLOAD_SIMD picks a narrower kernel than the CPU has)."""

import numpy as np
import pytest

from simd_common import assert_simd_levels_agree
from native_common import CROPS, IMG, _C, Image, batch_args, mad, maxdiff, mixed_samples, photo, pil_crop_resize, run_batch

@pytest.mark.parametrize("crop,out_hw", CROPS)
def test_resize_crop_matches_pil(crop, out_hw):
    got = _C.resize_crop(IMG, crop, out_hw, False)
    ref = pil_crop_resize(IMG, crop, out_hw)
    assert got.shape == ref.shape
    assert mad(got, ref) <= 0.5 and maxdiff(got, ref) <= 3
    assert np.array_equal(_C.resize_crop(IMG, crop, out_hw, True), got[:, ::-1])


NOISE = np.random.default_rng(0).integers(0, 256, (375, 500, 3), dtype=np.uint8)


def pil_bicubic(rgb, crop, out_hw):
    top, left, h, w = crop
    img = Image.fromarray(rgb).crop((left, top, left + w, top + h))
    return np.asarray(img.resize((out_hw[1], out_hw[0]), Image.BICUBIC))


@pytest.mark.parametrize("image", ["photo", "noise"])
@pytest.mark.parametrize("crop,out_hw", CROPS)
def test_bicubic_resize_crop_matches_pil(image, crop, out_hw):
    """interpolation=1: PIL's BICUBIC (a = -0.5, support 2 scaled by the downscale factor, clipped to uint8 after
    each pass): at most 1 level off in under 2% of the bytes (the int16 weights), on noise too (its negative lobes
    overshoot and clip)."""
    img = IMG if image == "photo" else NOISE
    got = _C.resize_crop(img, crop, out_hw, False, 1)
    ref = pil_bicubic(img, crop, out_hw)
    assert maxdiff(got, ref) <= 1 and mad(got, ref) <= 0.02
    assert np.array_equal(_C.resize_crop(img, crop, out_hw, True, 1), got[:, ::-1])
    if crop[2:] != (1, 1):  # the bilinear result is another image (what a bicubic ignored would give)
        assert mad(_C.resize_crop(img, crop, out_hw, False, 0), ref) > 0.3


def test_decode_batch_resizes_each_sample_with_its_interpolation():
    samples = mixed_samples()
    n = len(samples)
    interp = (np.arange(n) % 2).astype(np.uint8)
    args = batch_args(samples, (64, 80))
    assert run_batch(_C.Pool(2), args, dct_scaling=False, interpolation=interp) == []
    for k, (data, enc, hw, crop, flip) in enumerate(samples):
        if enc == 1:
            alone = _C.resize_crop(np.frombuffer(data, np.uint8).reshape(*hw, 3), crop, (64, 80), bool(flip), int(interp[k]))
        else:
            alone = _C.decode_crop_resize(data, crop, (64, 80), bool(flip), False, int(interp[k]))
        assert np.array_equal(args["out"][k], alone), k
    bilinear = batch_args(samples, (64, 80))
    run_batch(_C.Pool(2), bilinear, dct_scaling=False)
    assert np.array_equal(bilinear["out"][0], args["out"][0]) and not np.array_equal(bilinear["out"][1], args["out"][1])
    with pytest.raises(ValueError, match="interpolation"):
        run_batch(_C.Pool(0), batch_args(samples, (8, 8)), interpolation=np.full(n, 2, np.uint8))
    with pytest.raises(ValueError, match="interpolation"):
        run_batch(_C.Pool(0), batch_args(samples, (8, 8)), interpolation=np.zeros(n + 1, np.uint8))
    with pytest.raises(ValueError, match="interpolation"):
        _C.resize_crop(IMG, None, (8, 8), False, 2)


def test_resize_crop_none_and_errors():
    assert np.array_equal(_C.resize_crop(IMG, None, (375, 500)), IMG)
    with pytest.raises(ValueError, match="not inside"):
        _C.resize_crop(IMG, (0, 0, 376, 10), (8, 8))
    with pytest.raises(ValueError, match="not inside"):
        _C.resize_crop(IMG, (-1, 0, 10, 10), (8, 8))
    with pytest.raises(ValueError, match="out_hw"):
        _C.resize_crop(IMG, None, (0, 8))
    with pytest.raises(TypeError, match="uint8"):
        _C.resize_crop(IMG.astype(np.float32), None, (8, 8))
    with pytest.raises(ValueError, match="shape"):
        _C.resize_crop(IMG[..., 0], None, (8, 8))
    strided = IMG[::2, ::3]  # non-contiguous input is copied, not misread
    assert np.array_equal(_C.resize_crop(strided, None, (10, 10)),
                          _C.resize_crop(np.ascontiguousarray(strided), None, (10, 10)))


def test_raw_sample_at_end_of_region():
    # SIMD loads near the right edge must not read past the region (run under ASan to see it).
    img = photo(9, 13, seed=5)
    samples = [(img.tobytes(), 1, (9, 13), (t, l, 9 - t, 13 - l), f)
               for t in (0, 4, 8) for l in (0, 5, 12) for f in (0, 1)]
    for sample in samples:
        args = batch_args([sample], (7, 29))
        args["regions"] = [np.frombuffer(sample[0], np.uint8).copy()]
        assert run_batch(_C.Pool(0), args) == []
        ref = pil_crop_resize(img, sample[3], (7, 29))[:, ::-1 if sample[4] else 1]
        assert maxdiff(args["out"][0], ref) <= 3


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
    h.update(_C.resize_crop(img, crop, out_hw, bool(k % 3), 1).tobytes())  # bicubic: negative weights, more taps
print(h.hexdigest())
"""


@pytest.mark.skipif(not hasattr(_C, "resize_crop"), reason="no resize_crop binding")
def test_every_kernel_writes_the_same_bytes():
    assert_simd_levels_agree(PROBE, levels=("ssse3", "scalar"))


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
                for interpolation in (0, 1):
                    h.update(_C.resize_crop(img, crop, (16, out_w), flip, interpolation).tobytes())
print(h.hexdigest())
"""


@pytest.mark.skipif(not hasattr(_C, "resize_crop"), reason="no resize_crop binding")
def test_kernels_stay_inside_an_image_that_ends_at_a_guard_page():
    # a kernel that loads past the image's end dies here (SIGSEGV)
    assert_simd_levels_agree(GUARDED, levels=("ssse3", "scalar"))
