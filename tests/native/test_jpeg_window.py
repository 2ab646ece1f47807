"""csrc/jpeg.cc's windowed decode (issue 32 item 3): decoding only the rows and iMCU columns a crop needs
(jpeg_skip_scanlines / jpeg_crop_scanline, with the margin that keeps chroma upsampling's edge handling off the
requested pixels) gives exactly the bytes of a full decode followed by the same crop + resize, for every kind of
JPEG (4:2:0, 4:2:2, 4:4:4, gray, CMYK, progressive, restart markers), odd image sizes, and crops that touch the
image edges or start and end on and next to iMCU boundaries. DCT-scaled decoding stays within the stated
tolerance of PIL (native_common.DCT_TOLERANCE)."""

import numpy as np
import pytest

from native_common import DCT_TOLERANCE, _C, encode, mad, photo, pil_crop_resize, pil_rgb

KINDS = {
    "rgb420": {},
    "rgb422": {"subsampling": 1},
    "rgb444": {"subsampling": 0},
    "gray": {"mode": "L"},
    "cmyk": {"mode": "CMYK"},
    "progressive": {"progressive": True},
    "progressive444": {"progressive": True, "subsampling": 0},
    "restart_rows": {"restart_marker_rows": 1},
    "restart_blocks": {"restart_marker_blocks": 5},  # intervals that end mid-row
}
SIZES = [(67, 101), (120, 161), (257, 255)]  # odd, partial iMCUs at the right and bottom edges


def jpeg(kind, hw):
    kw = dict(KINDS[kind])
    mode = kw.pop("mode", "RGB")
    return encode(photo(*hw, seed=hw[0]), mode, quality=92, **kw)


def crops(h, w):
    """(top, left, height, width) boxes: the whole image, each edge and corner, and boxes whose sides sit on,
    just before and just after 8- and 16-pixel (iMCU) boundaries, plus seeded random ones."""
    out = [(0, 0, h, w), (0, 0, h // 2, w // 3), (h - h // 3, w - w // 2, h // 3, w // 2), (0, w - 9, h, 9),
           (h - 5, 0, 5, w), (h // 2, w // 2, h - h // 2, w - w // 2)]
    for a in (7, 8, 9, 15, 16, 17, 31, 32, 33, 48):
        if a + 20 <= min(h, w):
            out.append((a, a, min(h, w) - a - (a % 5), min(h, w) - a))
            out.append((a, 1, 16, a))  # ends on/next to a boundary
            out.append((h - a - 3, w - a - 3, a, a))
    rng = np.random.default_rng(h * 1000 + w)
    for _ in range(12):
        ch, cw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
        out.append((int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1)), ch, cw))
    return out


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("hw", SIZES)
def test_window_decode_is_the_full_decode(kind, hw):
    data = jpeg(kind, hw)
    full = _C.decode_jpeg(data)
    assert full.shape == (*hw, 3)
    for crop in crops(*hw):
        for out_hw in ((224, 224), (crop[2], crop[3]), (max(1, crop[2] // 3), max(1, crop[3] // 2))):
            got = _C.decode_crop_resize(data, crop, out_hw, False, dct_scaling=False)
            ref = _C.resize_crop(full, crop, out_hw, False)
            assert np.array_equal(got, ref), (kind, hw, crop, out_hw, int(np.abs(got.astype(int) - ref).max()))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_dct_scaled_window_close_to_pil(kind):
    hw = (511, 389)
    data = jpeg(kind, hw)
    ref_img = pil_rgb(data)
    for crop, out_hw in [((0, 0, 511, 389), (60, 48)), ((3, 5, 300, 250), (100, 80)), ((17, 33, 401, 350), (150, 170)),
                         ((200, 140, 311, 249), (70, 50)), ((255, 0, 256, 389), (127, 190))]:
        got = _C.decode_crop_resize(data, crop, out_hw, False)
        ref = pil_crop_resize(ref_img, crop, out_hw)
        assert mad(got, ref) <= DCT_TOLERANCE, (kind, crop, out_hw, mad(got, ref))
