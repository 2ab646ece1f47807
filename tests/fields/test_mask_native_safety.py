"""csrc/mask.cc against crafted mask PNGs: chunks that would make libpng's simplified API convert the gray
values (gamma, transparency) fail the sample instead of changing class ids, harmless chunks decode as Pillow
does, and a header whose size the blob cannot hold is refused before any memory is taken for it."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
from PIL import Image

from fastload import _C
from fastload import transforms as T
from fastload._augment.masks import decode_masks
from fastload.fields.mask import encode_png

from .test_mask import blobs
from .test_mask_native import _chunk, sources


def with_chunks(png: bytes, *chunks: bytes) -> bytes:
    """``png`` with ``chunks`` inserted right after IHDR (where colour chunks must be)."""
    return png[:33] + b"".join(chunks) + png[33:]


def gray_png(h: int, w: int, body: bytes) -> bytes:
    ihdr = h.to_bytes(4, "big")
    ihdr = w.to_bytes(4, "big") + ihdr + bytes([8, 0, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", body) + _chunk(b"IEND", b"")


MASK = blobs(24, 30, 5, labels=5) * 40  # class ids 0, 40, ... 160: far from any gray that gamma keeps
CONVERTING = {
    "gAMA": _chunk(b"gAMA", (100000).to_bytes(4, "big")),  # linear: libpng would re-encode the ids to sRGB
    "tRNS": _chunk(b"tRNS", int(MASK[0, 0]).to_bytes(2, "big")),  # that id would be composited onto the buffer
}


@pytest.mark.parametrize("kind", list(CONVERTING))
def test_a_colour_chunk_fails_the_sample_instead_of_changing_class_ids(kind):
    png = with_chunks(encode_png(MASK), CONVERTING[kind])
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png))), MASK)  # Pillow reads the ids unchanged
    with pytest.raises(ValueError, match=f"{kind} chunk"):
        _C.decode_mask(png, *MASK.shape)
    # in a batch, after a good mask of the same size on the same thread (whose pixels libpng would composite on)
    pngs = [encode_png(MASK[::-1].copy()), png]
    plan = T.ImagePipeline([T.CenterCrop((24, 30))]).plan(np.full(2, 24), np.full(2, 30), np.random.default_rng(0))
    out = np.full((2, 24, 30), 7, np.uint8)
    fails = decode_masks(_C.Pool(0), sources(pngs), np.full((2, 2), (24, 30)), plan, out)
    assert [k for k, _ in fails] == [1] and f"{kind} chunk" in fails[0][1]
    assert np.array_equal(out[0], MASK[::-1]) and not out[1].any()


def test_pillows_transparency_is_refused_too():
    buf = io.BytesIO()
    Image.fromarray(MASK, "L").save(buf, format="PNG", transparency=int(MASK[3, 3]))
    with pytest.raises(ValueError, match="tRNS chunk"):
        _C.decode_mask(buf.getvalue(), *MASK.shape)


def test_harmless_chunks_decode_as_pillow_does():
    png = with_chunks(encode_png(MASK), _chunk(b"sBIT", b"\x04"), _chunk(b"tEXt", b"Comment\x00labels"),
                      _chunk(b"pHYs", bytes(9)))
    assert np.array_equal(_C.decode_mask(png, *MASK.shape), MASK)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png))), MASK)


def test_a_header_the_blob_cannot_hold_is_refused_before_decoding():
    # 4000 x 4000 pixels from a ~100-byte PNG: deflate shrinks data at most 1032 times, so no such PNG exists
    png = gray_png(4000, 4000, zlib.compress(bytes(40)))
    with pytest.raises(ValueError, match=r"cannot hold 4000x4000 pixels"):
        _C.decode_mask(png, 4000, 4000)


def test_a_mask_over_the_image_pixel_limit_is_refused():
    # 2^28 pixels + one row (the images' limit): a blob big enough for the ratio, so the limit itself refuses
    h, w = 16385, 16384
    png = gray_png(h, w, np.random.default_rng(0).integers(0, 256, 300_000, np.uint8).tobytes())
    with pytest.raises(ValueError, match=r"more than .*2\^28"):
        _C.decode_mask(png, h, w)
    plan = T.ImagePipeline([T.CenterCrop(8)]).plan(np.full(1, h), np.full(1, w), np.random.default_rng(0))
    out = np.full((1, 8, 8), 7, np.uint8)
    fails = decode_masks(_C.Pool(0), sources([png]), np.array([[h, w]]), plan, out)
    assert len(fails) == 1 and "2^28" in fails[0][1] and not out.any()
