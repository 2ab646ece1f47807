"""decoder='nvjpeg' without a GPU: its batched crop/resize/flip and its failure handling, run on the CPU
with PIL standing in for nvJPEG's decode (same libjpeg-turbo pixels), against PIL and the native decoder.
tests/cuda/test_nvjpeg.py runs the real thing on a GPU. PIL's stand-in is tests/decoders/conftest.py's pil_decode."""

from __future__ import annotations

import io
import warnings

import pytest
import torch
from PIL import Image

from fastload.decoders.nvjpeg import NvjpegDecoder
from decoders.conftest import OUT_HW, SAMPLES, encode, mad, native, pil_decode, plan, plan_of

TOLERANCE = 1.0  # mean absolute difference per sample vs native with dct_scaling=False (float vs int16 weights)


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


def test_one_large_photo_does_not_pad_the_batch_and_settings_do_not_change_pixels(monkeypatch):
    """Row 7 through the decoder: a batch with one large photo is resampled in chunks sized by pixels (the
    large one alone, not every image padded to it), and TF32/matmul precision and an enclosing autocast do
    not change a pixel (the arithmetic sets its own precision: float64, autocast off)."""
    from fastload.decoders import _resample

    blobs = [SAMPLES[1], SAMPLES[6], encode(600, 800, 12), SAMPLES[10], SAMPLES[1]]
    p = plan(blobs, 3)
    ref = torch.empty((5, *OUT_HW, 3), dtype=torch.uint8)
    assert NvjpegDecoder(5, OUT_HW, device="cpu", decode_fn=pil_decode).decode(blobs, p, ref) == []
    padded = []
    real = _resample.crop_resize_flip
    monkeypatch.setattr(_resample, "crop_resize_flip", lambda images, *a, **k: (padded.append(tuple(images.shape)),
                                                                               real(images, *a, **k))[1])
    budget = 3 * 90 * 90 * 2
    dec = NvjpegDecoder(5, OUT_HW, device="cpu", decode_fn=pil_decode, max_pixels=budget)
    out = torch.empty_like(ref)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert dec.decode(blobs, p, out) == []
    finally:
        torch.set_float32_matmul_precision(before)
    assert torch.equal(out, ref)
    assert (1, 3, 600, 800) in padded and all(n * c * h * w <= budget or n == 1 for n, c, h, w in padded), padded


def test_a_resize_then_a_crop_runs_on_the_rounded_box_and_says_so_once(monkeypatch):
    """nvJPEG's batched resampling takes whole-pixel boxes: a plan with Plan.frames (Resize then CenterCrop) runs
    on Plan.crops, the window's source box rounded, with one warning naming the decoder and the native way out."""
    import numpy as np

    from fastload import _ring
    from fastload.transforms import ImagePipeline, Plan, Resize, CenterCrop

    monkeypatch.setattr(_ring, "_warned", set())
    sizes = [Image.open(io.BytesIO(b)).size for b in SAMPLES[:3]]
    p = ImagePipeline([Resize(41), CenterCrop(OUT_HW)]).plan(
        np.array([h for _, h in sizes]), np.array([w for w, _ in sizes]), np.random.default_rng(0)
    )
    assert p.frames is not None
    dec = NvjpegDecoder(3, OUT_HW, device="cpu", decode_fn=pil_decode)
    out = torch.zeros((3, *OUT_HW, 3), dtype=torch.uint8)
    with pytest.warns(RuntimeWarning, match="the nvjpeg decoder resamples a resize followed by a crop.*native"):
        assert dec.decode(SAMPLES[:3], p, out) == []
    rounded = torch.zeros_like(out)
    assert dec.decode(SAMPLES[:3], Plan(p.crops, p.flips, p.out_hw), rounded) == []
    assert torch.equal(out, rounded)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dec.decode(SAMPLES[:3], p, out)  # once
