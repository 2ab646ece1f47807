"""decoder='nvjpeg' without a GPU: its batched crop/resize/flip and its failure handling, run on the CPU
with PIL standing in for nvJPEG's decode (same libjpeg-turbo pixels), against PIL and the native decoder.
tests/cuda/test_nvjpeg.py runs the real thing on a GPU. PIL's stand-in is tests/decoders/conftest.py's pil_decode."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from fastload.decoders._resample import crop_resize_flip
from fastload.decoders.nvjpeg import NvjpegDecoder
from decoders.conftest import OUT_HW, SAMPLES, mad, native, pil_decode, plan, plan_of

TOLERANCE = 1.0  # mean absolute difference per sample vs native with dct_scaling=False (float vs int16 weights)


@pytest.mark.parametrize("seed", range(4))
def test_batched_resample_matches_pil_crop_resize(seed):
    rng = np.random.default_rng(seed)
    n = 6
    imgs = [rng.integers(0, 256, (int(rng.integers(8, 90)), int(rng.integers(8, 90)), 3), dtype=np.uint8)
            for _ in range(n)]
    crops, flips, ref = [], [], []
    for im in imgs:
        h, w = im.shape[:2]
        ch, cw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
        top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        flip = bool(rng.integers(0, 2))
        pil = Image.fromarray(im).crop((left, top, left + cw, top + ch)).resize((24, 20), Image.BILINEAR)
        ref.append(np.asarray(pil.transpose(Image.FLIP_LEFT_RIGHT) if flip else pil))
        crops.append([top, left, ch, cw])
        flips.append(flip)
    hmax, wmax = max(i.shape[0] for i in imgs), max(i.shape[1] for i in imgs)
    padded = torch.zeros((n, 3, hmax, wmax), dtype=torch.uint8)
    for k, i in enumerate(imgs):
        padded[k, :, :i.shape[0], :i.shape[1]] = torch.from_numpy(i).permute(2, 0, 1)
    out = torch.empty((n, 20, 24, 3), dtype=torch.uint8)
    crop_resize_flip(padded, torch.tensor(crops), torch.tensor(flips), (20, 24), out, chunk=4)
    diff = mad(out.numpy(), np.stack(ref))
    assert diff.max() < 0.6, diff  # PIL rounds between its two passes; this rounds once
    assert np.abs(out.numpy().astype(int) - np.stack(ref)).max() <= 2


@pytest.mark.parametrize("seed", [0, 1])
def test_decoder_matches_native_on_the_same_plans(seed):
    p = plan(SAMPLES, seed)
    exact = native(SAMPLES, p, False)
    dec = NvjpegDecoder(len(SAMPLES), OUT_HW, device="cpu", decode_fn=pil_decode)
    out = torch.full((len(SAMPLES), *OUT_HW, 3), 77, dtype=torch.uint8)
    assert dec.decode(SAMPLES, p, out) == []
    rgb = [k for k, b in enumerate(SAMPLES) if Image.open(io.BytesIO(b)).mode != "CMYK"]  # PIL inverts Adobe CMYK
    assert mad(out.numpy()[rgb], exact[rgb]).max() < TOLERANCE


def test_corrupt_and_outside_samples_fail_alone():
    p = plan(SAMPLES[:4], 0)
    blobs = list(SAMPLES[:4])
    blobs[1] = blobs[1][:40]  # truncated: the batch decode raises, the rest must still come out
    crops = p.crops.copy()
    crops[3] = [0, 0, 10_000, 5]  # taller than the image
    dec = NvjpegDecoder(4, OUT_HW, device="cpu", decode_fn=pil_decode)
    out = torch.full((4, *OUT_HW, 3), 77, dtype=torch.uint8)
    failures = dict(dec.decode(blobs, plan_of(crops, p.flips), out))
    assert sorted(failures) == [1, 3]
    assert "could not decode" in failures[1] and "lies outside" in failures[3]
    assert (out[[1, 3]] == 0).all()
    good = NvjpegDecoder(4, OUT_HW, device="cpu", decode_fn=pil_decode)
    ref = torch.empty((2, *OUT_HW, 3), dtype=torch.uint8)
    good.decode([SAMPLES[0], SAMPLES[2]], plan_of(p.crops[[0, 2]], p.flips[[0, 2]]), ref)
    assert torch.equal(out[[0, 2]], ref)


def test_out_buffer_is_checked():
    dec = NvjpegDecoder(2, OUT_HW, device="cpu", decode_fn=pil_decode)
    with pytest.raises(ValueError, match="uint8 cpu tensor of shape"):
        dec.decode(SAMPLES[:2], plan(SAMPLES[:2]), torch.empty((2, 3, 3, 3)))


def _batch(seed: int, sizes: list[tuple[int, int]]):
    rng = np.random.default_rng(seed)
    imgs = [torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8)) for h, w in sizes]
    crops = torch.tensor([[int(rng.integers(0, h // 4)), int(rng.integers(0, w // 4)), h // 2, w // 2]
                          for h, w in sizes])
    flips = torch.from_numpy(rng.integers(0, 2, len(sizes)).astype(bool))
    return imgs, crops, flips


def test_chunks_are_sized_by_pixels_not_by_the_largest_image(monkeypatch):
    """One large photo among small ones: each padded chunk stays within the pixel budget (the large one
    alone), instead of the whole batch padded to the large one's size; the pixels are the same."""
    from fastload.decoders import _resample

    sizes = [(30, 40)] * 5 + [(400, 300)] + [(36, 28)] * 6
    imgs, crops, flips = _batch(0, sizes)
    ref = torch.empty((12, 20, 24, 3), dtype=torch.uint8)
    _resample.resample(imgs, crops, flips, (20, 24), ref, max_pixels=1 << 30)  # one chunk
    padded = []
    real = _resample.crop_resize_flip
    monkeypatch.setattr(_resample, "crop_resize_flip", lambda images, *a, **k: (padded.append(images.shape),
                                                                               real(images, *a, **k))[1])
    out = torch.empty_like(ref)
    budget = 3 * 40 * 40 * 4
    _resample.resample(imgs, crops, flips, (20, 24), out, max_pixels=budget)
    assert torch.equal(out, ref)
    assert all(n * c * h * w <= budget or n == 1 for n, c, h, w in padded), padded
    assert padded == [(5, 3, 30, 40), (1, 3, 400, 300), (6, 3, 36, 28)]


def test_pixels_do_not_depend_on_matmul_precision_or_autocast():
    """TF32, set_float32_matmul_precision and an enclosing autocast (the training loop's, at num_workers=0)
    must not change a decoded pixel."""
    imgs, crops, flips = _batch(1, [(50, 70), (64, 48), (33, 90)])
    ref = torch.empty((3, 20, 24, 3), dtype=torch.uint8)
    from fastload.decoders._resample import resample

    resample(imgs, crops, flips, (20, 24), ref)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        out = torch.empty_like(ref)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            resample(imgs, crops, flips, (20, 24), out)
    finally:
        torch.set_float32_matmul_precision(before)
    assert torch.equal(out, ref)
