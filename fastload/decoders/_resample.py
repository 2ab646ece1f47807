"""Batched crop + antialiased resize + flip on any torch device: two batched matrix products per chunk.

For GPU decoders that hand back whole decoded images (nvJPEG through torchvision). Each output row and
column is a weighted sum of source pixels; the weights are PIL's (and the native core's, csrc/resize.cc)
antialiased triangle filter over the planned crop, built for the whole batch at once as dense matrices
``Wy (n, out_h, H)`` and ``Wx (n, out_w, W)`` with zeros outside the crop, so that::

    out[k] = Wy[k] @ image[k] @ Wx[k].T        (per channel; a flip reverses Wx's rows)

No per-sample Python: images of different sizes are padded into one tensor (zeros never get weight).
``resample`` pads per chunk, and sizes the chunks by pixels, so one 4000x3000 photo among small ones
does not pad the whole batch to its size (256 such rows were ~9 GB of uint8 plus the float copies, kept
by the caching allocator afterwards).

Precision. The products run in float64 with autocast off: float32 matmuls follow global settings (TF32
on Ampere and later, ``torch.set_float32_matmul_precision``, an enclosing ``autocast`` at
num_workers=0), so the pixels would change with the user's training settings. The result is rounded
once (the native core rounds between its two passes, so single pixels may differ by one gray level).
"""

from __future__ import annotations

import warnings
from typing import Sequence

import torch

MAX_PIXELS = 1 << 24  # elements (padded H x W x C, summed over a chunk) resampled at once: 128 MB in float64


def axis_weights(
    start: torch.Tensor, length: torch.Tensor, out: int, size: int, used: torch.Tensor | None = None
) -> torch.Tensor:
    """``(n, out, size)`` float64 weights resampling ``[start, start + length)`` of an axis of ``size``
    source pixels to ``out`` pixels with PIL's antialiased triangle (bilinear) filter. ``used`` (n,): to that
    many pixels per sample instead (<= ``out``; a padded crop's box at its own size), the rows past it zero."""
    start = start.to(torch.float64).view(-1, 1, 1)
    length = length.to(torch.float64).view(-1, 1, 1)
    dev = start.device
    n_out = torch.full_like(length, float(out)) if used is None else used.to(torch.float64).view(-1, 1, 1)
    scale = length / n_out
    filterscale = torch.clamp(scale, min=1.0)
    support = filterscale  # the triangle's support is 1, widened when shrinking
    center = (torch.arange(out, device=dev, dtype=torch.float64).view(1, -1, 1) + 0.5) * scale
    x = torch.arange(size, device=dev, dtype=torch.float64).view(1, 1, -1) - start  # crop coordinates
    xmin = torch.clamp(torch.trunc(center - support + 0.5), min=0.0)
    xmax = torch.minimum(torch.trunc(center + support + 0.5), length)
    w = torch.clamp(1.0 - ((x - center + 0.5) / filterscale).abs(), min=0.0)
    inside = (x >= xmin) & (x < xmax)
    if used is not None:
        inside &= torch.arange(out, device=dev).view(1, -1, 1) < n_out
    w = torch.where(inside, w, torch.zeros((), dtype=w.dtype, device=dev))
    total = w.sum(dim=2, keepdim=True)
    return torch.where(total > 0, w / torch.where(total > 0, total, torch.ones_like(total)), w)


def crop_resize_flip(
    images: torch.Tensor,
    crops: torch.Tensor,
    flips: torch.Tensor,
    out_hw: tuple[int, int],
    out: torch.Tensor,
    chunk: int = 32,
    sizes: torch.Tensor | None = None,
) -> None:
    """Write ``images`` (``(n, C, H, W)`` uint8, padded), each cropped to ``crops[k]`` = (top, left,
    height, width), resized to ``out_hw`` and mirrored where ``flips[k]``, into ``out`` (``(n, oh, ow, C)``
    uint8). ``crops`` and ``flips`` may be CPU tensors; they are moved to the images' device once.
    ``sizes`` (n, 2): sample k resized to ``sizes[k]`` (<= ``out_hw``) instead, at the top left of its row, the
    rest zero (a padded crop's box, ``engine_torch.assemble_rows``); such a sample must not be flipped."""
    n, _, h, w = images.shape
    oh, ow = out_hw
    crops = crops.to(images.device, torch.int64)
    flips = flips.to(images.device, torch.bool)
    with torch.autocast(images.device.type, enabled=False):
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            c = crops[lo:hi]
            sz = None if sizes is None else sizes[lo:hi].to(images.device)
            wy = axis_weights(c[:, 0], c[:, 2], oh, h, None if sz is None else sz[:, 0])
            wx = axis_weights(c[:, 1], c[:, 3], ow, w, None if sz is None else sz[:, 1])
            wx = torch.where(flips[lo:hi].view(-1, 1, 1), wx.flip(1), wx)
            x = images[lo:hi].to(torch.float64)
            rows = torch.matmul(wy.unsqueeze(1), x)  # (k, C, oh, W)
            res = torch.matmul(rows, wx.transpose(1, 2).unsqueeze(1))  # (k, C, oh, ow)
            out[lo:hi].copy_(res.round_().clamp_(0, 255).permute(0, 2, 3, 1))


def chunks(sizes: Sequence[tuple[int, int, int]], max_pixels: int = MAX_PIXELS) -> list[tuple[int, int]]:
    """Consecutive ``[lo, hi)`` ranges of images (``(C, H, W)`` each) whose padded size, count x largest
    H x largest W x C, stays within ``max_pixels`` (an image larger than that alone)."""
    out, lo = [], 0
    ch = hmax = wmax = 0
    for k, (c, h, w) in enumerate(sizes):
        nh, nw, nc = max(hmax, h), max(wmax, w), max(ch, c)
        if k > lo and (k - lo + 1) * nh * nw * nc > max_pixels:
            out.append((lo, k))
            lo, nh, nw, nc = k, h, w, c
        ch, hmax, wmax = nc, nh, nw
    if lo < len(sizes):
        out.append((lo, len(sizes)))
    return out


def resample(
    images: Sequence[torch.Tensor],
    crops: torch.Tensor,
    flips: torch.Tensor,
    out_hw: tuple[int, int],
    out: torch.Tensor,
    max_pixels: int = MAX_PIXELS,
    sizes: torch.Tensor | None = None,
) -> None:
    """``crop_resize_flip`` over decoded images of any sizes (``(C, H, W)`` uint8 each) into ``out``
    (``(n, oh, ow, C)``), padded chunk by chunk with chunks sized by ``max_pixels``; ``sizes`` as there."""
    for lo, hi in chunks([tuple(im.shape) for im in images], max_pixels):
        with warnings.catch_warnings():  # strided nested tensors are 'prototype'; padding is all we use
            warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")
            padded = torch.nested.as_nested_tensor(list(images[lo:hi])).to_padded_tensor(0)
        crop_resize_flip(
            padded,
            crops[lo:hi],
            flips[lo:hi],
            out_hw,
            out[lo:hi],
            chunk=hi - lo,
            sizes=None if sizes is None else sizes[lo:hi],
        )
