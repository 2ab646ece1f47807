"""fastload/decoders/native.py and the one decoder interface (decoders/_base.py): ``decode(sources, crops,
flips, out) -> [(k, message)]`` for the native, DALI, nvJPEG and hybrid decoders, and ``ImageSources``
read from the packed files. The native decoder is checked bit for bit against the raw ``_C.decode_batch``
call; the others against it within their documented tolerances (test_dali.py, test_nvjpeg_cpu.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
from fastload import _C
from fastload import transforms as T
from fastload._images import ImageDecoding, JpegOnly
from fastload.decoders._base import ImageSources
from fastload.decoders.hybrid import HybridDecoder, HybridSplit
from fastload.decoders.native import NativeDecoder
from fastload.decoders.nvjpeg import NvjpegDecoder
from fastload.formats._layout import IMAGE_JPEG, IMAGE_RAW
from conftest import make_image_folder
from test_dali import HAVE_DALI, OUT_HW, SAMPLES, mad, native, plan, sizes
from test_nvjpeg_cpu import pil_decode


def sources_of(blobs):
    """``blobs`` (SAMPLES, some of them damaged) with the sizes of the SAMPLES they stand for."""
    return ImageSources.from_bytes(blobs, sizes(SAMPLES[:len(blobs)]))


@pytest.mark.parametrize("dct_scaling", [True, False])
def test_the_native_decoder_is_one_decode_batch_call(dct_scaling):
    p = plan(SAMPLES, 3)
    out = np.full((len(SAMPLES), *OUT_HW, 3), 77, np.uint8)
    dec = NativeDecoder(_C.Pool(2), dct_scaling=dct_scaling)
    assert dec.decode(sources_of(SAMPLES), p.crops, p.flips, out) == []
    assert np.array_equal(out, native(SAMPLES, p, dct_scaling))
    rows = torch.zeros((len(SAMPLES), *OUT_HW, 3), dtype=torch.uint8)  # a CPU tensor works too
    assert NativeDecoder(dct_scaling=dct_scaling).decode(sources_of(SAMPLES), p.crops, p.flips, rows) == []
    assert np.array_equal(rows.numpy(), out)


def test_slices_decode_their_own_rows_and_report_relative_positions():
    blobs = list(SAMPLES)
    blobs[6] = SAMPLES[6][:40]  # truncated inside its header
    p = plan(SAMPLES, 1)
    src = sources_of(blobs)
    whole = np.full((len(blobs), *OUT_HW, 3), 77, np.uint8)
    fails = NativeDecoder().decode(src, p.crops, p.flips, whole)
    assert [k for k, _ in fails] == [6] and not whole[6].any()
    parts = np.full_like(whole, 77)
    k = 4
    assert NativeDecoder().decode(src[:k], p.crops[:k], p.flips[:k], parts[:k]) == []
    assert [j for j, _ in NativeDecoder().decode(src[k:], p.crops[k:], p.flips[k:], parts[k:])] == [6 - k]
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
    assert NativeDecoder().decode(src, whole, np.array([0, 1], np.uint8), out) == []
    assert np.array_equal(out[0], pixels[0]) and np.array_equal(out[1], pixels[1][:, ::-1])


def test_every_decoder_takes_the_same_call():
    p = plan(SAMPLES, 2)
    ref = native(SAMPLES, p, True)
    decoders = [NativeDecoder(), NvjpegDecoder(len(SAMPLES), OUT_HW, device="cpu", decode_fn=pil_decode),
                HybridDecoder(NativeDecoder(), NativeDecoder(), HybridSplit(), len(SAMPLES))]
    if HAVE_DALI:
        from fastload.decoders.dali import DaliDecoder

        decoders.append(DaliDecoder(len(SAMPLES), OUT_HW))
    rgb = [k for k in range(len(SAMPLES)) if k != 7]  # PIL inverts Adobe CMYK (test_nvjpeg_cpu.py)
    for dec in decoders:
        out = torch.full((len(SAMPLES), *OUT_HW, 3), 77, dtype=torch.uint8)
        assert dec.decode(sources_of(SAMPLES), p.crops, p.flips, out) == [], dec
        assert mad(out.numpy()[rgb], ref[rgb]).max() < 4.0, dec  # the GPU decoders' bound vs DCT-scaled native
        dec.close()


def test_the_hybrid_of_two_native_decoders_is_the_native_decoder():
    blobs = list(SAMPLES)
    blobs[1], blobs[9] = b"", b"\xff\xd8\xff" + bytes(50)
    p = plan(SAMPLES, 4)
    ref = np.full((len(blobs), *OUT_HW, 3), 77, np.uint8)
    expected = NativeDecoder().decode(sources_of(blobs), p.crops, p.flips, ref)
    assert [k for k, _ in expected] == [1, 9]
    split = HybridSplit(cpu_share=0.5)
    hybrid = HybridDecoder(NativeDecoder(), NativeDecoder(_C.Pool(2)), split, len(blobs))
    for _ in range(3):  # the cut moves with the measured rates; the pixels and failures do not
        out = torch.full((len(blobs), *OUT_HW, 3), 77, dtype=torch.uint8)
        assert hybrid.decode(sources_of(blobs), p.crops, p.flips, out) == expected
        assert np.array_equal(out.numpy(), ref)
    assert split.cpu_rate and split.gpu_rate
    hybrid.close()
    split.close()


def test_gpu_decoders_report_raw_images_with_a_hint():
    class Fake:
        closed = False

        def decode(self, sources, crops, flips, out):
            return [(0, "its own failure")]

        def close(self):
            Fake.closed = True

    src = ImageSources.from_bytes([b"a", b"b", b"c"], [(1, 1)] * 3, [IMAGE_RAW, IMAGE_RAW, IMAGE_JPEG])
    dec = JpegOnly(Fake(), "dali")
    fails = dec.decode(src, np.zeros((3, 4), np.int32), np.zeros(3, np.uint8), None)
    assert fails[0] == (0, "its own failure") and fails[1][0] == 1 and "decoder='dali'" in fails[1][1]
    assert len(fails) == 2
    dec.close()
    assert Fake.closed


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoders")
    make_image_folder(root / "src", classes=2, per_class=6)
    fastload.pack(root / "src", root / "shards", workers=0, shard_size=4096)
    fastload.pack(root / "src", root / "lmdb", workers=0, format="lmdb")
    return root


@pytest.mark.parametrize("fmt", ["shards", "lmdb"])
def test_image_sources_read_the_packed_files_through_the_reader(packed, fmt):
    ds = fastload.open(packed / fmt, decode=False)
    idx = np.array([7, 0, 11, 3, 5])
    at = ds.reader.locate(idx)
    src = ImageSources.of(ds.reader, at, "image")
    assert len(src) == 5 and src.meta.dtype == np.int64 and (src.meta[:, 2] == IMAGE_JPEG).all()
    assert [bytes(b) for b in src] == [ds[int(i)][0] for i in idx]
    regions, region, offset, length = src[2:].located()
    assert [bytes(memoryview(regions[r])[o:o + n]) for r, o, n in zip(region, offset, length)] == \
        [ds[int(i)][0] for i in idx[2:]]


def test_fill_makes_one_decode_call_per_image_field(packed):
    ds = fastload.open(packed / "shards", transforms={"image": [T.RandomResizedCrop(16), T.RandomHorizontalFlip()]})
    ref = [x.clone() for x, _ in fastload.DataLoader(ds, batch_size=5, seed=2)]
    calls = []

    class Recording(NativeDecoder):
        def decode(self, sources, crops, flips, out):
            calls.append((len(sources), crops.shape, flips.shape, out.shape))
            return super().decode(sources, crops, flips, out)

    loader = fastload.DataLoader(ds, batch_size=5, seed=2)
    images = ImageDecoding("native", None, 5, 0)
    images._decoders["image"] = Recording()
    loader._batcher.images = images
    got = [x.clone() for x, _ in loader]
    assert all(torch.equal(a, b) for a, b in zip(ref, got)) and len(got) == len(ref) == 3
    assert calls == [(5, (5, 4), (5,), (5, 16, 16, 3))] * 2 + [(2, (2, 4), (2,), (2, 16, 16, 3))]
