"""fastload/decoders/_base.py: the one decoder interface, ``decode(sources, plan, out) -> [(k, message)]``, for
the native, DALI, nvJPEG and hybrid decoders; ``JpegOnly``; the plan object decoders take (its slices, issue
21's augmentation attached and refused); and ``ImageSources`` read from the packed files."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
from fastload._augment.color import ColorJitter
from fastload._augment.engine_native import run_native
from fastload._augment.engine_torch import run_torch
from fastload._augment.filters import RandomErasing
from fastload._augment.geometry import RandomHorizontalFlip as AugmentFlip, RandomRotation, RandomVerticalFlip
from fastload._augment.plan import PlanBuilder
from fastload.decoders._base import ImageSources, JpegOnly, geometry_only
from fastload.decoders.hybrid import HybridDecoder, HybridSplit
from fastload.decoders.native import NativeDecoder
from fastload.decoders.nvjpeg import NvjpegDecoder
from fastload.formats._layout import IMAGE_JPEG, IMAGE_RAW
from conftest import make_image_folder
from decoders.conftest import HAVE_DALI, OUT_HW, SAMPLES, mad, native, pil_decode, plan, plan_of, sizes


def sources_of(blobs):
    return ImageSources.from_bytes(blobs, sizes(SAMPLES[:len(blobs)]))


def every_decoder():
    decoders = [NativeDecoder(), NvjpegDecoder(len(SAMPLES), OUT_HW, device="cpu", decode_fn=pil_decode),
                HybridDecoder(NativeDecoder(), NativeDecoder(), HybridSplit(), len(SAMPLES))]
    if HAVE_DALI:
        from fastload.decoders.dali import DaliDecoder

        decoders.append(DaliDecoder(len(SAMPLES), OUT_HW))
    return decoders


def test_every_decoder_takes_the_same_call():
    p = plan(SAMPLES, 2)
    ref = native(SAMPLES, p, True)
    rgb = [k for k in range(len(SAMPLES)) if k != 7]  # PIL inverts Adobe CMYK (test_nvjpeg.py)
    for dec in every_decoder():
        out = torch.full((len(SAMPLES), *OUT_HW, 3), 77, dtype=torch.uint8)
        assert dec.decode(sources_of(SAMPLES), p, out) == [], dec
        assert mad(out.numpy()[rgb], ref[rgb]).max() < 4.0, dec  # the GPU decoders' bound vs DCT-scaled native
        dec.close()


def augmented(p, *transforms):
    """``p`` extended by issue 21's augmentations (what the pipeline will attach once they are wired)."""
    b = PlanBuilder.from_crop_plan(p)
    for t in transforms:
        t.plan(b, np.arange(p.n), np.random.default_rng(0))
    return p.with_augment(b.finish())


def gpu_decoders():
    """The GPU decoders as the CPU runs them: nvjpeg with PIL decoding, DALI's CPU-only mode."""
    return [dec for dec in every_decoder() if not isinstance(dec, (NativeDecoder, HybridDecoder))]


def test_gpu_decoders_run_the_augmentation_on_their_rows_with_the_torch_engine():
    """nvjpeg and DALI execute the whole plan: their crop/resize/flip, then the batched torch engine on their rows
    (vertical flips, affine maps, pixel operations), byte for byte what run_torch gives on the rows they decode
    for the plan's geometry alone (flips=False: the decoder mirrored already). Fails with the engine not called,
    called with the plan's flips again."""
    p = plan(SAMPLES, 3)
    q = augmented(p, RandomVerticalFlip(0.5), RandomRotation(30, interpolation="bilinear"),
                  ColorJitter(0.4, 0.4, 0.4, 0.1), RandomErasing(1.0))
    assert q.augment.geometry.vflip.any() and q.augment.steps and q.flips.any()
    for dec in gpu_decoders():
        tiles = torch.full((len(SAMPLES), *OUT_HW, 3), 77, dtype=torch.uint8)
        assert dec.decode(sources_of(SAMPLES), plan_of(q.crops, q.flips), tiles) == [], dec
        expect = run_torch(tiles.permute(0, 3, 1, 2).contiguous(), q.augment, flips=False).permute(0, 2, 3, 1)
        out = torch.full((len(SAMPLES), *OUT_HW, 3), 77, dtype=torch.uint8)
        assert dec.decode(sources_of(SAMPLES), q, out) == [], dec
        assert torch.equal(out, expect), dec
        dec.close()


def test_gpu_decoders_zero_failed_rows_after_the_augmentation():
    """A failed sample's row is zero, as without augmentation: the engine runs before the zeroing (an inversion
    run after it turned the row white). Fails with the augmentation moved after the zeroing."""
    from fastload._augment.tone import RandomInvert

    blobs = list(SAMPLES)
    blobs[2] = blobs[2][:2] + bytes(40) + blobs[2][42:]  # corrupt
    q = augmented(plan(SAMPLES, 4), RandomInvert(1.0))
    for dec in gpu_decoders():
        out = torch.full((len(SAMPLES), *OUT_HW, 3), 77, dtype=torch.uint8)
        assert [k for k, _ in dec.decode(sources_of(blobs), q, out)] == [2], dec
        assert not out[2].any(), dec
        dec.close()


def test_padded_crop_windows_run_on_the_gpu_decoders():
    """A decoder never drops part of a plan: a padded RandomCrop window (a box decoded at its own size, then
    placed on the fill) is no longer refused by the GPU decoders; they write it as the native decoder does
    (tests/decoders/test_gpu_padding.py compares the pixels), the fill (0) around the image."""
    padded = fastload.transforms.ImagePipeline([fastload.transforms.RandomCrop(OUT_HW, padding=9)]).plan(
        np.asarray(sizes(SAMPLES))[:, 0], np.asarray(sizes(SAMPLES))[:, 1], np.random.default_rng(1))
    pad = padded.augment.geometry.pad
    assert pad.active.any()
    for dec in gpu_decoders():
        out = torch.full((len(SAMPLES), *OUT_HW, 3), 77, dtype=torch.uint8)
        assert dec.decode(sources_of(SAMPLES), padded, out) == [], dec
        hole = (pad.rows < 0)[:, :, None] | (pad.cols < 0)[:, None, :]
        assert hole.any() and (out.numpy()[hole] == 0).all(), dec
        dec.close()


def test_geometry_only_refuses_what_a_crop_only_decoder_cannot_run():
    """geometry_only, for a decoder that executes crop/resize/flip only (a new decoder before it augments):
    vertical flips, pixel operations and padded windows are refused by name."""
    p = plan(SAMPLES, 2)
    for extra, words in [((RandomVerticalFlip(1.0),), "vertical flips"),
                         ((ColorJitter(brightness=0.5),), "pixel operations (brightness)")]:
        with pytest.raises(NotImplementedError, match=r"executes crop, resize and horizontal flip only.*"
                                                      + words.replace("(", r"\(").replace(")", r"\)")):
            geometry_only(augmented(p, *extra), len(SAMPLES), "croponly")
    geometry_only(p, len(SAMPLES), "croponly")


def test_the_native_decoder_executes_the_augmentation_fused_as_on_decoded_tiles():
    """decode -> crop/resize/flip -> vertical flip, affine, pixel operations, per sample in the decode threads: the
    same bytes as the decoded batch run through the native engine afterwards, with any thread count."""
    p = plan(SAMPLES, 3)
    q = augmented(p, RandomVerticalFlip(0.5), RandomRotation(30, interpolation="bilinear"),
                  ColorJitter(0.4, 0.4, 0.4, 0.1), RandomErasing(1.0))
    assert q.augment.geometry.has_affine.all() and q.augment.steps
    expect = run_native(native(SAMPLES, plan_of(q.crops, q.flips), True), q.augment)
    for threads in (0, 3):
        out = np.zeros((len(SAMPLES), *OUT_HW, 3), np.uint8)
        assert NativeDecoder(fastload._C.Pool(threads)).decode(sources_of(SAMPLES), q, out) == []
        assert np.array_equal(out, expect)


def test_a_horizontal_flip_planned_by_the_augmentation_is_the_decoders_flip():
    p = plan(SAMPLES, 5)
    q = augmented(p, AugmentFlip(1.0))
    assert np.array_equal(q.flips, 1 - p.flips) and np.array_equal(q.crops, p.crops)
    out = np.zeros((len(SAMPLES), *OUT_HW, 3), np.uint8)
    assert NativeDecoder().decode(sources_of(SAMPLES), q, out) == []
    assert np.array_equal(out, native(SAMPLES, plan_of(p.crops, 1 - p.flips), True))
    with pytest.raises(ValueError, match="PlanBuilder.from_crop_plan"):
        p.take(0, 3).with_augment(q.augment)


def test_plan_slices_carry_their_samples_and_their_augmentation():
    p = augmented(plan(SAMPLES, 1), ColorJitter(brightness=0.5, contrast=0.5))
    part = p.take(3, 7)
    assert part.n == 4 and np.array_equal(part.crops, p.crops[3:7]) and np.array_equal(part.flips, p.flips[3:7])
    assert np.array_equal(part.out_hw, p.out_hw[3:7]) and part.augment.n == 4
    for j in range(4):
        assert [(op, {k: np.asarray(v).tolist() for k, v in row.items()}) for op, row in part.augment.ops_of(j)] == \
            [(op, {k: np.asarray(v).tolist() for k, v in row.items()}) for op, row in p.augment.ops_of(3 + j)]
    assert p.take(5, 2).n == 0 and p.take(9, 20).n == p.n - 9
    crops, flips, out_hw = p  # unpacks as the named tuple it was
    assert crops is p.crops and flips is p.flips and out_hw is p.out_hw


def test_a_plan_of_another_length_is_refused():
    p = plan(SAMPLES, 0)
    with pytest.raises(ValueError, match="the plan has 11 samples but 3 images"):
        NativeDecoder().decode(sources_of(SAMPLES[:3]), p, np.zeros((3, *OUT_HW, 3), np.uint8))


def test_gpu_decoders_report_raw_images_with_a_hint():
    class Fake:
        closed = False

        def decode(self, sources, plan, out):
            return [(0, "its own failure")]

        def close(self):
            Fake.closed = True

    src = ImageSources.from_bytes([b"a", b"b", b"c"], [(1, 1)] * 3, [IMAGE_RAW, IMAGE_RAW, IMAGE_JPEG])
    dec = JpegOnly(Fake(), "dali")
    fails = dec.decode(src, plan_of(np.zeros((3, 4), np.int32), np.zeros(3, np.uint8)), None)
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
    src = ImageSources(*ds.reader.image_sources(at, "image"))
    assert len(src) == src.n == 5 and src.meta.dtype == np.int64 and (src.meta[:, 2] == IMAGE_JPEG).all()
    assert [bytes(b) for b in src] == [ds[int(i)][0] for i in idx]
    assert [bytes(src[k]) for k in range(-5, 5)] == [ds[int(i)][0] for i in idx] * 2
    part = src[2:]
    regions, region, offset, length = part.regions, part.region, part.offset, part.length
    assert [bytes(b) for b in part] == [ds[int(i)][0] for i in idx[2:]]
    assert [bytes(memoryview(regions[r])[o:o + n]) for r, o, n in zip(region, offset, length)] == \
        [ds[int(i)][0] for i in idx[2:]]

