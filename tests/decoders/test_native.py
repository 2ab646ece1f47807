"""fastload/decoders/native.py: the native decoder is one ``_C.decode_batch`` call per batch, bit for bit, over
``ImageSources`` (slices included) and raw images alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastload import _C
from fastload.decoders._base import ImageSources
from fastload.decoders.native import NativeDecoder
from fastload.formats._layout import IMAGE_RAW
from decoders.conftest import OUT_HW, SAMPLES, native, plan, plan_of, sizes


def sources_of(blobs):
    """``blobs`` (SAMPLES, some of them damaged) with the sizes of the SAMPLES they stand for."""
    return ImageSources.from_bytes(blobs, sizes(SAMPLES[:len(blobs)]))


@pytest.mark.parametrize("dct_scaling", [True, False])
def test_the_native_decoder_is_one_decode_batch_call(dct_scaling):
    p = plan(SAMPLES, 3)
    out = np.full((len(SAMPLES), *OUT_HW, 3), 77, np.uint8)
    dec = NativeDecoder(_C.Pool(2), dct_scaling=dct_scaling)
    assert dec.decode(sources_of(SAMPLES), p, out) == []
    assert np.array_equal(out, native(SAMPLES, p, dct_scaling))
    rows = torch.zeros((len(SAMPLES), *OUT_HW, 3), dtype=torch.uint8)  # a CPU tensor works too
    assert NativeDecoder(dct_scaling=dct_scaling).decode(sources_of(SAMPLES), p, rows) == []
    assert np.array_equal(rows.numpy(), out)


def test_slices_decode_their_own_rows_and_report_relative_positions():
    blobs = list(SAMPLES)
    blobs[6] = SAMPLES[6][:40]  # truncated inside its header
    p = plan(SAMPLES, 1)
    src = sources_of(blobs)
    whole = np.full((len(blobs), *OUT_HW, 3), 77, np.uint8)
    fails = NativeDecoder().decode(src, p, whole)
    assert [k for k, _ in fails] == [6] and not whole[6].any()
    parts = np.full_like(whole, 77)
    k = 4
    assert NativeDecoder().decode(src[:k], p.take(0, k), parts[:k]) == []
    assert [j for j, _ in NativeDecoder().decode(src[k:], p.take(k, p.n), parts[k:])] == [6 - k]
    assert np.array_equal(parts, whole)
    assert len(src[k:]) == len(blobs) - k and bytes(src[k:][0]) == blobs[k] and len(src[5:2]) == 0
    with pytest.raises(IndexError):
        src[len(blobs)]


def test_raw_images_are_cropped_and_resized_like_jpegs():
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (2, *OUT_HW, 3), dtype=np.uint8)
    src = ImageSources.from_bytes([p.tobytes() for p in pixels], [OUT_HW] * 2, IMAGE_RAW)
    out = np.zeros_like(pixels)
    whole = np.array([[0, 0, *OUT_HW]] * 2, np.int32)
    assert NativeDecoder().decode(src, plan_of(whole, np.array([0, 1], np.uint8)), out) == []
    assert np.array_equal(out[0], pixels[0]) and np.array_equal(out[1], pixels[1][:, ::-1])
