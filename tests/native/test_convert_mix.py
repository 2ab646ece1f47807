"""csrc/convert.cc: mix_affine_u8_f32, MixUp/CutMix fused into the one-pass uint8 -> float32 ToDtype +
Normalize (issue 21's "MixUp/CutMix add < 2% to the loop"), against torchvision v2's formulas in float64 on
the same uint8 pixels, with and without AVX2, and its argument checks.

Tolerances: MixUp blends the uint8 values with the weights folded into the scale (lam * scale,
(1 - lam) * scale), two multiplies and two adds in float32, so it differs from the float64 formula by a few
rounding steps: at most 4 float32 epsilons of the largest term's magnitude (``bound``; measured about 1).
CutMix is the affine of one pixel or of its neighbour's: the same bits as affine_u8_f32 then the paste."""

import numpy as np
import pytest

from native_common import _C

EPS = float(np.finfo(np.float32).eps)


def constants(channels, seed=0):
    rng = np.random.default_rng(seed)
    std, mean = rng.uniform(0.1, 0.4, channels), rng.uniform(0.3, 0.6, channels)
    return (1 / 255 / std).astype(np.float32), (-mean / std).astype(np.float32)


def torchvision(x, scale, shift, kind, lam, box=None):
    """torchvision v2 on the normalized float64 batch: MixUp ``rolled * (1 - lam) + batch * lam``, CutMix the
    rolled batch's box pasted (NHWC here)."""
    norm = x.astype(np.float64) * scale.astype(np.float64) + shift.astype(np.float64)
    rolled = np.roll(norm, 1, axis=0)
    if kind == "mixup":
        return rolled * (1.0 - lam) + norm * lam
    x1, y1, x2, y2 = box
    out = norm.copy()
    out[:, y1:y2, x1:x2] = rolled[:, y1:y2, x1:x2]
    return out


def bound(scale, shift):
    return 4 * EPS * (255 * float(np.abs(scale).max()) + float(np.abs(shift).max()))


def run(x, scale, shift, kind, lam, box=None, avx2=True):
    buf = np.full(x.size + 16, -7.0, np.float32)  # 16 sentinels after the end
    out = buf[:x.size].reshape(x.shape)
    _C.mix_affine_u8_f32(x, out, scale.tolist(), shift.tolist(), kind, lam, box, avx2)
    assert np.all(buf[x.size:] == -7.0)
    return out


@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("n", [1, 2, 5])
@pytest.mark.parametrize("lam", [0.0, 0.03, 0.5, 0.97, 1.0])
@pytest.mark.parametrize("width", [1, 2, 11, 16])  # RGB samples of 21, 42, 231, 336 values: every remainder path
def test_mixup_is_torchvisions_blend_of_the_normalized_neighbours(channels, n, lam, width):
    scale, shift = constants(channels)
    x = np.random.default_rng(n).integers(0, 256, (n, 7, width, channels), np.uint8)
    outs = [run(x, scale, shift, "mixup", lam, avx2=avx2) for avx2 in (True, False)]
    assert np.array_equal(outs[0], outs[1])  # the same bits with and without AVX2
    ref = torchvision(x, scale, shift, "mixup", lam)
    assert np.abs(outs[0] - ref).max() <= bound(scale, shift)
    if lam == 1.0:  # lam = 1 is the image itself, lam = 0 its neighbour: affine_u8_f32's bits
        plain = np.empty(x.shape, np.float32)
        _C.affine_u8_f32(x, plain, scale.tolist(), shift.tolist())
        assert np.array_equal(outs[0], plain)


BOXES = [(0, 0, 0, 0), (3, 2, 3, 6), (0, 0, 11, 7), (1, 0, 10, 7), (2, 3, 9, 4), (9, 1, 11, 6), (0, 5, 4, 7)]


@pytest.mark.parametrize("channels", [1, 3, 5])
@pytest.mark.parametrize("n", [1, 2, 3, 6])
@pytest.mark.parametrize("box", BOXES)
def test_cutmix_is_the_affine_then_the_neighbours_original_box(channels, n, box):
    """Sample i's box comes from sample i - 1's original pixels, sample 0's from the last: never a chain."""
    scale, shift = constants(channels, seed=channels)
    x = np.random.default_rng(channels * n).integers(0, 256, (n, 7, 11, channels), np.uint8)
    plain = np.empty(x.shape, np.float32)
    _C.affine_u8_f32(x, plain, scale.tolist(), shift.tolist())
    ref = plain.copy()
    x1, y1, x2, y2 = box
    ref[:, y1:y2, x1:x2] = np.roll(plain, 1, axis=0)[:, y1:y2, x1:x2]
    for avx2 in (True, False):
        assert np.array_equal(run(x, scale, shift, "cutmix", 0.4, box, avx2), ref), avx2
    assert np.abs(ref - torchvision(x, scale, shift, "cutmix", 0.4, box)).max() <= bound(scale, shift)


def test_a_photo_sized_batch_with_imagenet_constants():
    """64 x 224 x 224 x 3 (the vector loop's long runs, the box rows' short ones)."""
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    scale, shift = (1 / 255 / std).astype(np.float32), (-mean / std).astype(np.float32)
    x = np.random.default_rng(5).integers(0, 256, (8, 224, 224, 3), np.uint8)
    assert np.abs(run(x, scale, shift, "mixup", 0.2) - torchvision(x, scale, shift, "mixup", 0.2)).max() \
        <= bound(scale, shift)
    box = (17, 40, 201, 133)
    ref = torchvision(x, scale, shift, "cutmix", 0.2, box)
    assert np.abs(run(x, scale, shift, "cutmix", 0.2, box) - ref).max() <= bound(scale, shift)


def test_every_bad_argument_is_a_clear_error():
    x = np.zeros((2, 4, 5, 3), np.uint8)
    out = np.empty(x.shape, np.float32)
    s3 = [1.0, 1.0, 1.0]
    cases = [
        (dict(src=x.astype(np.int16)), TypeError, "src: expected a uint8"),
        (dict(out=out.astype(np.float64)), TypeError, "out: expected a float32"),
        (dict(src=x.reshape(8, 5, 3), out=out.reshape(8, 5, 3)), ValueError, r"src: expected a batch \(N, H, W"),
        (dict(out=np.empty((2, 5, 4, 3), np.float32)), ValueError, r"out: expected src's shape \(2, 4, 5, 3\)"),
        (dict(scale=[1.0] * 17, shift=[0.0] * 17), ValueError, "one value per channel"),
        (dict(kind="mixer"), ValueError, "kind: expected 'mixup' or 'cutmix', got 'mixer'"),
        (dict(lam=1.5), ValueError, r"lam: expected a number in \[0, 1\]"),
        (dict(lam=float("nan")), ValueError, r"lam: expected a number in \[0, 1\]"),
        (dict(box=(0, 0, 1, 1)), ValueError, "MixUp has no box"),
        (dict(kind="cutmix"), TypeError, r"box: expected CutMix's box \(x1, y1, x2, y2\), got None"),
        (dict(kind="cutmix", box=(0, 0, 1)), TypeError, "box: expected CutMix's box"),
        (dict(kind="cutmix", box=(0, 0, 6, 4)), ValueError, "x2 <= 5"),
        (dict(kind="cutmix", box=(3, 0, 2, 4)), ValueError, r"box \(3, 0, 2, 4\) should satisfy"),
        (dict(kind="cutmix", box=(0, -1, 2, 4)), ValueError, "0 <= y1 <= y2 <= 4"),
    ]
    for change, exc, message in cases:
        args = dict(src=x, out=out, scale=s3, shift=[0.0, 0.0, 0.0], kind="mixup", lam=0.5, box=None) | change
        with pytest.raises(exc, match=message):
            _C.mix_affine_u8_f32(**args)
    shared = np.zeros(x.size * 5, np.uint8)
    with pytest.raises(ValueError, match="overlaps src"):
        _C.mix_affine_u8_f32(shared[: x.size].reshape(x.shape),
                             shared[4:4 + 4 * x.size].view(np.float32).reshape(x.shape), s3, s3, "mixup", 0.5)
