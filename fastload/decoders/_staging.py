"""Small per-batch host arrays (crop boxes, flips, row indices) to the device without a host wait.

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
            out.append(dev[at:at + a.size].view(np.shape(src)))
            at += a.size
        return out
