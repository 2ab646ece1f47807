"""Small per-batch host arrays (crop boxes, flips, row indices, an augmentation's columns) to the device without
a host wait.

A copy from pageable host memory makes the host wait for the stream it is queued on (CUDA's copy from
pageable memory stages the bytes synchronously behind the stream's queued work), so ``torch.as_tensor(x)
.to('cuda')`` in a decoder paced its producer thread by the GPU once per batch. :class:`Uploads` copies the
arrays with one memcpy into a small pinned buffer and one asynchronous copy from it. A buffer is refilled
only once the event recorded after its copy has completed, found by a query (never a synchronize); while
every buffer still has a copy queued (the GPU lags), one more is made, so a lagging GPU costs a few
kilobytes of pinned memory, not a wait.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class Uploads:
    """The pinned staging of one decoder stream (``streams``: a streams backend of ``fastload._ring``).

    ``put(*arrays)`` must be called inside ``streams.side_context()``: the device copies are allocated and
    queued on that side stream, whose later kernels read them in stream order."""

    def __init__(self, streams: Any, min_elements: int = 1024):
        self.streams = streams
        self.min_elements = min_elements
        self.buffers: list[list] = []  # [pinned int64 buffer, event after the copy that read it]

    def _buffer(self, n: int) -> torch.Tensor:
        s = self.streams
        for entry in self.buffers:
            if entry[0].numel() >= n and s.done(entry[1]):  # its copy has completed: a query, not a wait
                return entry
        entry = [s.host_empty((max(n, self.min_elements),), torch.int64), None]
        self.buffers.append(entry)
        return entry

    def put(self, *arrays: Any) -> list[torch.Tensor]:
        """Each array (any integer or bool array-like) as an int64 device tensor of its shape."""
        flat = [np.asarray(a).astype(np.int64, copy=False).reshape(-1) for a in arrays]
        total = sum(a.size for a in flat)
        s = self.streams
        entry = self._buffer(total)
        host = entry[0][:total]
        if total:
            host.numpy()[:] = np.concatenate(flat)
        dev = s.empty((total,), torch.int64, False)
        s.copy(dev, host)
        entry[1] = s.record(s.side)
        out, at = [], 0
        for a, src in zip(flat, arrays):
            out.append(dev[at : at + a.size].view(np.shape(src)))
            at += a.size
        return out

    def put_packed(self, arrays: list) -> list[torch.Tensor]:
        """Arrays of any dtype (an augmentation plan's columns, ``engine_torch.host_columns``) as device tensors of
        their dtype and shape, through the same pinned buffers: their bytes packed at 8-byte aligned offsets (so
        every dtype can view its slice), one memcpy and one asynchronous copy for all of them."""
        flat = [np.ascontiguousarray(a) for a in arrays]
        offsets, total = [], 0
        for a in flat:
            offsets.append(total)
            total += -(-a.nbytes // 8) * 8
        s = self.streams
        entry = self._buffer(total // 8)
        host = entry[0][: total // 8]
        raw = host.numpy().view(np.uint8)
        for a, off in zip(flat, offsets):
            raw[off : off + a.nbytes] = a.reshape(-1).view(np.uint8)
        dev = s.empty((total // 8,), torch.int64, False)
        s.copy(dev, host)
        entry[1] = s.record(s.side)
        dev_bytes = dev.view(torch.uint8)
        return [
            dev_bytes[off : off + a.nbytes].view(_TORCH_DTYPES[a.dtype.str[1:]]).view(a.shape)
            for a, off in zip(flat, offsets)
        ]


def augment_queued(s: Any, uploads: Uploads, aug: Any, out: torch.Tensor, what: str) -> None:
    """Queue ``aug`` (the plan's ``AugmentPlan``, or None) on the rows ``out`` on the current stream of ``s`` (the
    decoder's, inside its ``side_context``): the batched torch engine, after the decode's writes and before the
    event the rows are handed on with; padded crop windows first (``engine_torch.assemble_rows``: the decoder
    wrote their boxes at their ``decode_hw``, unflipped, :func:`decode_sizes`). Its host columns go up in one
    packed copy from pinned staging (a copy from pageable memory would make this thread wait for the stream);
    flips are the decoder's already."""
    pad, more = needs_padding(aug), beyond_flips(aug)
    if not (pad or more):
        return
    from .._augment.engine_torch import assemble_rows, augment_rows, host_columns, padding_columns

    host = (padding_columns(aug) if pad else []) + (host_columns(aug, flips=False) if more else [])
    cols = uploads.put_packed(host)
    pad_cols, aug_cols = (cols[:4], cols[4:]) if pad else ([], cols)

    def run() -> None:
        if pad:
            assemble_rows(out, pad_cols)
        if more:
            augment_rows(out, aug, flips=False, columns=aug_cols)

    s.launch(run, reads=(out, *cols), writes=(out,), what=what)


def needs_padding(aug: Any) -> bool:
    """Whether an ``AugmentPlan`` (or None) has padded crop windows to assemble (``engine_torch.padded``)."""
    pad = None if aug is None else aug.geometry.pad
    return pad is not None and bool(pad.active.any())


def decode_sizes(plan: Any, out_hw: tuple[int, int]) -> tuple[np.ndarray | None, np.ndarray]:
    """What a GPU decoder resamples each sample to, and whether it mirrors it: ``(sizes, flips)``, ``sizes``
    ``(n, 2)`` int64 (None when the pipeline has no padded RandomCrop: every sample at ``out_hw``). A padded
    window's box is decoded at its ``Padding.decode_hw`` and not mirrored (the assembly mirrors the window, as the
    native decoder does). Sizes also for a batch none of whose windows leaves its image: DALI keeps one graph
    (a graph per batch kind would be rebuilt whenever a batch, or the hybrid's GPU share, has no padded window)."""
    flips = np.asarray(plan.flips).astype(bool)
    aug = plan.augment
    pad = None if aug is None else aug.geometry.pad
    if pad is None:
        return None, flips
    sizes = np.tile(np.asarray(out_hw, np.int64), (len(flips), 1))
    sizes[pad.active] = pad.decode_hw[pad.active]
    return sizes, flips & ~pad.active.astype(bool)


def beyond_flips(aug: Any) -> bool:
    """Whether an ``AugmentPlan`` (or None) has anything for the engine to run on rows the decoder already
    cropped, resized and mirrored: vertical flips, affine maps or pixel operations."""
    if aug is None:
        return False
    geo = aug.geometry
    return bool(aug.steps) or bool(geo.vflip.any()) or bool(geo.has_affine.any())


_TORCH_DTYPES = {
    "b1": torch.bool,
    "u1": torch.uint8,
    "i1": torch.int8,
    "i2": torch.int16,
    "i4": torch.int32,
    "i8": torch.int64,
    "f2": torch.float16,
    "f4": torch.float32,
    "f8": torch.float64,
}
