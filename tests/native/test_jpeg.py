"""csrc/jpeg.cc: JPEG decoding against PIL for every variant (4:2:0, 4:4:4, 4:2:2, progressive, gray, CMYK),
header info, decoding only the window a crop needs, DCT-scaled decoding, corrupt and absurd input."""

import numpy as np
import pytest

from native_common import (CROPS, DCT_TOLERANCE, JPEG, VARIANTS, _C, encode, mad, maxdiff, photo, pil_crop_resize,
                           pil_rgb)

RNG = np.random.default_rng(1234)

@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_decode_matches_pil(name):
    data = VARIANTS[name]
    got = _C.decode_jpeg(data)
    assert got.shape == (375, 500, 3) and got.dtype == np.uint8
    assert mad(got, pil_rgb(data)) <= 0.5


def test_jpeg_info():
    assert _C.jpeg_info(VARIANTS["rgb420"]) == (375, 500, 3)
    assert _C.jpeg_info(VARIANTS["gray"]) == (375, 500, 1)
    assert _C.jpeg_info(VARIANTS["cmyk"]) == (375, 500, 4)


@pytest.mark.parametrize("data", [JPEG[: len(JPEG) // 2], JPEG[:-2], JPEG[:300], b"",
                                  bytes(RNG.integers(0, 256, 5000, dtype=np.uint8)),
                                  b"\xff\xd8" + bytes(RNG.integers(0, 256, 5000, dtype=np.uint8))])
def test_corrupt_jpeg_raises(data):
    with pytest.raises(ValueError):
        _C.decode_jpeg(data)
    with pytest.raises(ValueError):
        _C.decode_crop_resize(data, (0, 0, 375, 500), (32, 32))


def test_absurd_dimensions_refused():
    data = bytearray(encode(photo(16, 16)))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = (60000).to_bytes(2, "big") * 2  # 60000 x 60000 pixels
    with pytest.raises(ValueError, match="too large"):
        _C.decode_jpeg(bytes(data))


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("crop,out_hw", CROPS)
def test_decode_crop_resize_matches_pil(name, crop, out_hw):
    data = VARIANTS[name]
    got = _C.decode_crop_resize(data, crop, out_hw, False, dct_scaling=False)
    ref = pil_crop_resize(pil_rgb(data), crop, out_hw)
    assert mad(got, ref) <= 0.5 and maxdiff(got, ref) <= 3
    # Decoding only the needed window (crop_scanline / skip_scanlines) changes no pixel.
    assert np.array_equal(got, _C.resize_crop(_C.decode_jpeg(data), crop, out_hw, False))


@pytest.mark.parametrize("name", ["rgb420", "rgb422", "progressive", "gray", "cmyk"])
@pytest.mark.parametrize("crop,out_hw", [
    ((0, 0, 375, 500), (40, 60)),     # 1/8
    ((0, 0, 375, 500), (80, 120)),    # 1/4
    ((0, 0, 375, 500), (150, 200)),   # 1/2
    ((21, 37, 301, 403), (70, 90)),   # 1/4, unaligned box
    ((120, 250, 250, 250), (31, 31)), # 1/8, bottom-right corner
])
def test_dct_scaled_close_to_pil(name, crop, out_hw):
    data = VARIANTS[name]
    got = _C.decode_crop_resize(data, crop, out_hw, False)
    ref = pil_crop_resize(pil_rgb(data), crop, out_hw)
    assert mad(got, ref) <= DCT_TOLERANCE
    assert np.array_equal(_C.decode_crop_resize(data, crop, out_hw, True), got[:, ::-1])
