"""fastload/decoders/_resample.py: the nvJPEG decoder's batched crop/resize/flip as matrix products, against
PIL, chunked by pixels, and independent of matmul precision and autocast."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from fastload.decoders._resample import crop_resize_flip
from decoders.conftest import mad


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
