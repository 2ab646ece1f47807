"""csrc/convert.cc: affine_u8_f32, the one-pass uint8 -> float32 multiply-add behind CPU ToDtype +
Normalize, against float64 numpy, with and without AVX2, at every length around its vector period, and
its argument checks."""

import numpy as np
import pytest

from native_common import _C


def constants(channels, seed=0):
    rng = np.random.default_rng(seed)
    std, mean = rng.uniform(0.1, 0.4, channels), rng.uniform(0.3, 0.6, channels)
    return (1 / 255 / std).astype(np.float32), (-mean / std).astype(np.float32)


def expected(x, scale, shift):
    """A float32 multiply, then a float32 add: what the kernel promises, bit for bit."""
    c = x.shape[-1]
    prod = (x.astype(np.float32) * scale.reshape((1,) * (x.ndim - 1) + (c,))).astype(np.float32)
    return (prod + shift.reshape((1,) * (x.ndim - 1) + (c,))).astype(np.float32)


@pytest.mark.parametrize("channels", [1, 3, 4, 5, 16])
@pytest.mark.parametrize("avx2", [True, False])
def test_matches_a_float32_multiply_then_add(channels, avx2):
    scale, shift = constants(channels)
    rng = np.random.default_rng(channels)
    for pixels in [0, 1, 7, 8, 9, 23, 24, 25, 8 * 16 + 3, 1000, 224 * 224]:  # around the vector period
        x = rng.integers(0, 256, (pixels, channels), np.uint8)
        out = np.full(x.shape, np.nan, np.float32)
        _C.affine_u8_f32(x, out, scale.tolist(), shift.tolist(), avx2)
        assert np.array_equal(out, expected(x, scale, shift)), (pixels, channels)
        wide = x.astype(np.float64) * scale.astype(np.float64) + shift.astype(np.float64)
        assert np.abs(out - wide).max(initial=0) <= 2e-6 * np.abs(wide).max(initial=1)


def test_both_code_paths_write_the_same_bits_and_nothing_past_the_end():
    scale, shift = constants(3, seed=1)
    x = np.random.default_rng(2).integers(0, 256, (3, 37, 41, 3), np.uint8)
    outs = []
    for avx2 in (True, False):
        buf = np.full(x.size + 16, -7.0, np.float32)  # 16 sentinels after the end
        _C.affine_u8_f32(x, buf[:x.size].reshape(x.shape), scale, shift, avx2)
        assert np.all(buf[x.size:] == -7.0)
        outs.append(buf[:x.size])
    assert np.array_equal(outs[0], outs[1])


def test_every_bad_argument_is_a_clear_error():
    x = np.zeros((2, 4, 4, 3), np.uint8)
    out = np.empty(x.shape, np.float32)
    s3 = [1.0, 1.0, 1.0]
    cases = [
        (dict(src=x.astype(np.int16)), TypeError, "src: expected a uint8"),
        (dict(out=out.astype(np.float64)), TypeError, "out: expected a float32"),
        (dict(src=x.transpose(0, 3, 1, 2).copy().transpose(0, 2, 3, 1)), ValueError, "src: expected a C-contiguous"),
        (dict(out=np.empty((2, 3, 4, 4), np.float32).transpose(0, 2, 3, 1)), ValueError, "out: expected a C-contiguous"),
        (dict(src=np.zeros((2, 4, 4, 4), np.uint8)), ValueError, "last dimension to be the 3 channels"),
        (dict(out=np.empty((2, 4, 4, 2), np.float32)), ValueError, "out: has 64 elements"),
        (dict(scale=[], shift=[]), ValueError, "one value per channel"),
        (dict(scale=[1.0] * 17, shift=[0.0] * 17), ValueError, "one value per channel"),
        (dict(shift=[0.0, 0.0]), ValueError, "got 3 and 2"),
        (dict(scale=1.0), TypeError, "sequences of floats"),
    ]
    for change, exc, message in cases:
        args = dict(src=x, out=out, scale=s3, shift=[0.0, 0.0, 0.0]) | change
        with pytest.raises(exc, match=message):
            _C.affine_u8_f32(**args)
    ro = np.empty(x.shape, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _C.affine_u8_f32(x, ro, s3, s3)
    shared = np.zeros(x.size * 5, np.uint8)
    with pytest.raises(ValueError, match="overlaps src"):
        _C.affine_u8_f32(shared[: x.size].reshape(x.shape), shared[4:4 + 4 * x.size].view(np.float32).reshape(x.shape),
                         s3, s3)


@pytest.mark.parametrize("avx2", [True, False])
def test_an_unaligned_out_is_refused(avx2):
    # numpy puts a float32 array at any byte address; the kernels store through float pointers (UB unaligned)
    x = np.arange(2 * 5 * 7 * 3, dtype=np.uint8).reshape(2, 5, 7, 3)
    out = np.frombuffer(bytearray(4 * x.size + 1), np.float32, count=x.size, offset=1).reshape(x.shape)
    assert out.flags.writeable and out.flags.c_contiguous and not out.flags.aligned
    with pytest.raises(ValueError, match="aligned to 4 bytes"):
        _C.affine_u8_f32(x, out, [0.5] * 3, [0.0] * 3, avx2=avx2)
    with pytest.raises(ValueError, match="aligned to 4 bytes"):
        _C.mix_affine_u8_f32(x, out, [0.5] * 3, [0.0] * 3, "mixup", 0.5, avx2=avx2)
    assert not out.any()  # untouched


@pytest.mark.parametrize("misalign", [0, 1, 4])
def test_a_batch_sized_output_streamed_or_not_is_the_same_bits_and_stops_at_its_end(misalign):
    """Outputs of 2**20 floats and more (a batch of images) are written with streaming stores when 32-byte aligned
    (``misalign`` 0), else with ordinary ones: the same bits either way, through the remainder after the last
    whole period, and nothing written past the end."""
    scale, shift = constants(3, seed=4)
    x = np.random.default_rng(5).integers(0, 256, (9, 223, 227, 3), np.uint8)
    assert x.size >= 1 << 20 and x.size % 24 != 0
    buf = np.full(x.size + 64, -7.0, np.float32)
    start = (-(buf.ctypes.data // 4)) % 8 + misalign  # floats to the first 32-byte boundary, then misaligned
    out = buf[start:start + x.size].reshape(x.shape)
    assert (out.ctypes.data % 32 == 0) == (misalign == 0)
    _C.affine_u8_f32(x, out, scale.tolist(), shift.tolist(), True)
    assert np.array_equal(out, expected(x, scale, shift))
    assert np.all(buf[:start] == -7.0) and np.all(buf[start + x.size:] == -7.0)
