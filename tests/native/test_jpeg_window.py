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
def test_boxes_a_column_or_two_wide_are_the_full_decode_at_every_column(kind):
    """A box one or two columns wide, at each column of the image (its first and last included): jpeg_crop_scanline
    keeps the window's end, so a window of at most one iMCU left 4:2:0's chroma one sample wide, which libjpeg-turbo's
    fancy upsampling got wrong by tens of levels (a one-column box at column 0, or at the last column where the one
    before starts an iMCU)."""
    for hw in ((24, 34), (20, 17)):
        data = jpeg(kind, hw)
        full = _C.decode_jpeg(data)
        for width in (1, 2):
            for x in range(hw[1] - width + 1):
                crop = (3, x, 10, width)
                got = _C.decode_crop_resize(data, crop, (10, width), False, dct_scaling=False)
                ref = full[3:13, x : x + width]
                assert np.array_equal(got, ref), (kind, hw, crop, int(np.abs(got.astype(int) - ref).max()))


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


# An encoder with any sampling factors (PIL writes 4:4:4, 4:2:2 and 4:2:0 only), built at test time against the
# libjpeg the native core links: luma h x v, chroma 1 x 1.
ENCODER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <jpeglib.h>
int main(int argc, char** argv) {
  int w = atoi(argv[2]), h = atoi(argv[3]);
  unsigned char* buf = malloc((size_t)w * h * 3);
  FILE* f = fopen(argv[1], "rb");
  if (!f || fread(buf, 1, (size_t)w * h * 3, f) != (size_t)w * h * 3) return 2;
  fclose(f);
  struct jpeg_compress_struct c;
  struct jpeg_error_mgr e;
  c.err = jpeg_std_error(&e);
  jpeg_create_compress(&c);
  FILE* o = fopen(argv[6], "wb");
  jpeg_stdio_dest(&c, o);
  c.image_width = w;
  c.image_height = h;
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 92, TRUE);
  c.comp_info[0].h_samp_factor = atoi(argv[4]);
  c.comp_info[0].v_samp_factor = atoi(argv[5]);
  c.comp_info[1].h_samp_factor = c.comp_info[1].v_samp_factor = 1;
  c.comp_info[2].h_samp_factor = c.comp_info[2].v_samp_factor = 1;
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW r = buf + (size_t)c.next_scanline * w * 3;
    jpeg_write_scanlines(&c, &r, 1);
  }
  jpeg_finish_compress(&c);
  fclose(o);
  return 0;
}
"""


@pytest.fixture(scope="module")
def sampled_jpeg(tmp_path_factory):
    """``make(rgb, h, v)``: JPEG bytes of ``rgb`` with luma sampling h x v (skips without a C compiler or libjpeg's
    header, which building the native core needs anyway)."""
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the test's JPEG encoder")
    d = tmp_path_factory.mktemp("encoder")
    (d / "enc.c").write_text(ENCODER)
    built = subprocess.run([cc, "-O1", str(d / "enc.c"), "-o", str(d / "enc"), "-ljpeg"], capture_output=True)
    if built.returncode:
        pytest.skip(f"could not build the test's JPEG encoder: {built.stderr.decode()[-300:]}")

    def make(rgb, h, v):
        (d / "in.rgb").write_bytes(np.ascontiguousarray(rgb).tobytes())
        subprocess.run([str(d / "enc"), str(d / "in.rgb"), str(rgb.shape[1]), str(rgb.shape[0]), str(h), str(v),
                        str(d / "out.jpg")], check=True)
        return (d / "out.jpg").read_bytes()

    return make


@pytest.mark.parametrize("hv", [(4, 2), (2, 4), (4, 1), (1, 4), (3, 2), (2, 2)], ids=lambda hv: f"h{hv[0]}v{hv[1]}")
def test_a_scaled_window_is_the_scaled_full_decode_for_any_sampling(sampled_jpeg, hv):
    """A DCT-scaled decode of a column window gives the columns of the scaled full decode (PIL's draft, the same
    libjpeg scaling). libjpeg-turbo's jpeg_crop_scanline sets a chroma component's width as if its IDCT had the
    smallest scaled size: for 4:1:0 (h4v2) and h2v4 at 1/2 and 1/4, where chroma is upsampled partly by the IDCT,
    part of the window came out wrong by up to 240 levels; those decode the whole width."""
    import io

    from PIL import Image

    H, W = 256, 320
    data = sampled_jpeg(photo(H, W, seed=5), *hv)
    rng = np.random.default_rng(1)
    for d in (2, 4):
        im = Image.open(io.BytesIO(data))
        im.draft("RGB", (W // d, H // d))
        ref = np.asarray(im.convert("RGB"))
        whole = _C.decode_crop_resize(data, (0, 0, H, W), (H // d, W // d), False)
        assert np.array_equal(whole, ref), (hv, d)  # the same scaled decode: the reference holds
        for _ in range(12):  # boxes on multiples of d: the scaled box is whole pixels, resized 1:1
            ch, cw = int(rng.integers(1, H // 8 + 1)) * 8, int(rng.integers(1, W // 8 + 1)) * 8
            t, left = int(rng.integers(0, (H - ch) // 8 + 1)) * 8, int(rng.integers(0, (W - cw) // 8 + 1)) * 8
            got = _C.decode_crop_resize(data, (t, left, ch, cw), (ch // d, cw // d), False)
            want = _C.resize_crop(ref, (t // d, left // d, ch // d, cw // d), (ch // d, cw // d), False)
            assert np.array_equal(got, want), (hv, d, (t, left, ch, cw), int(np.abs(got.astype(int) - want).max()))
