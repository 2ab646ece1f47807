"""Batched crop + antialiased resize + flip on any torch device: two batched matrix products per chunk.

For GPU decoders that hand back whole decoded images (nvJPEG through torchvision). Each output row and
column is a weighted sum of source pixels; the weights are PIL's (and the native core's, csrc/resize.cc)
antialiased triangle filter over the planned crop, built for the whole batch at once as dense matrices
``Wy (n, out_h, H)`` and ``Wx (n, out_w, W)`` with zeros outside the crop, so that::

    out[k] = Wy[k] @ image[k] @ Wx[k].T        (per channel; a flip reverses Wx's rows)

No per-sample Python: images of different sizes are padded into one tensor (zeros never get weight),
and the batch runs in chunks that bound the temporary memory. The float result is rounded once (the
native core rounds between its two passes, so single pixels may differ by one gray level).
"""

from __future__ import annotations

import torch


def axis_weights(start: torch.Tensor, length: torch.Tensor, out: int, size: int) -> torch.Tensor:
    """``(n, out, size)`` float32 weights resampling ``[start, start + length)`` of an axis of ``size``
    source pixels to ``out`` pixels with PIL's antialiased triangle (bilinear) filter."""
    start = start.to(torch.float64).view(-1, 1, 1)
    length = length.to(torch.float64).view(-1, 1, 1)
    dev = start.device
    scale = length / out
    filterscale = torch.clamp(scale, min=1.0)
    support = filterscale  # the triangle's support is 1, widened when shrinking
    center = (torch.arange(out, device=dev, dtype=torch.float64).view(1, -1, 1) + 0.5) * scale
    x = torch.arange(size, device=dev, dtype=torch.float64).view(1, 1, -1) - start  # crop coordinates
    xmin = torch.clamp(torch.trunc(center - support + 0.5), min=0.0)
    xmax = torch.minimum(torch.trunc(center + support + 0.5), length)
    w = torch.clamp(1.0 - ((x - center + 0.5) / filterscale).abs(), min=0.0)
    w = torch.where((x >= xmin) & (x < xmax), w, torch.zeros((), dtype=w.dtype, device=dev))
    total = w.sum(dim=2, keepdim=True)
    w = torch.where(total > 0, w / torch.where(total > 0, total, torch.ones_like(total)), w)
    return w.to(torch.float32)


def crop_resize_flip(images: torch.Tensor, crops: torch.Tensor, flips: torch.Tensor, out_hw: tuple[int, int],
                     out: torch.Tensor, chunk: int = 32) -> None:
    """Write ``images`` (``(n, C, H, W)`` uint8, padded), each cropped to ``crops[k]`` = (top, left,
    height, width), resized to ``out_hw`` and mirrored where ``flips[k]``, into ``out`` (``(n, oh, ow, C)``
    uint8). ``crops`` and ``flips`` may be CPU tensors; they are moved to the images' device once."""
    n, _, h, w = images.shape
    oh, ow = out_hw
    crops = crops.to(images.device, torch.int64)
    flips = flips.to(images.device, torch.bool)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        c = crops[lo:hi]
        wy = axis_weights(c[:, 0], c[:, 2], oh, h)
        wx = axis_weights(c[:, 1], c[:, 3], ow, w)
        wx = torch.where(flips[lo:hi].view(-1, 1, 1), wx.flip(1), wx)
        x = images[lo:hi].to(torch.float32)
        rows = torch.matmul(wy.unsqueeze(1), x)  # (k, C, oh, W)
        res = torch.matmul(rows, wx.transpose(1, 2).unsqueeze(1))  # (k, C, oh, ow)
        out[lo:hi].copy_(res.round_().clamp_(0, 255).permute(0, 2, 3, 1))
