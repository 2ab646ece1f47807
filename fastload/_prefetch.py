"""Prefetch to the device: batches copied on a side stream, handed over by events, never a host sync.

``DevicePrefetcher`` wraps any iterator of batches (tensors in lists, tuples, dicts...). For each batch
it (1) waits on the side stream for the device slot's release event, (2) copies every CPU tensor into
the slot's device buffers with ``non_blocking=True`` (pinned host memory makes that a true async DMA),
(3) runs ``ToDtype``/``Normalize`` there, and (4) records a copy event. When the batch is handed out,
the consumer's current stream waits on that event (``Stream.wait_event``): the host never blocks.

Device memory is a ring of slots allocated once on the consumer's stream (so the caching allocator
never hands a block that a side-stream copy still writes to another tensor). A slot is rewritten only
after the caller has dropped every view of it (storage use counts) *and* an event recorded on the
consumer stream at that moment has completed on the side stream, so kernels still queued on the
consumer stream finish reading it first. A host batch is kept referenced until its copy event has
completed, so a pinned host slot is never refilled while its DMA is in flight. If the caller holds
every slot, the ring grows instead of aliasing.

The same class runs with a null backend on ``device="cpu"``, which is how the ring logic is tested on
machines without a GPU (tests/cuda/ holds the CUDA tests).
"""

from __future__ import annotations

import collections
from typing import Any, Iterable, Iterator, Mapping

import torch
from torch.utils._pytree import tree_flatten_with_path, tree_unflatten

from ._tensor_transforms import TensorPipeline


def _refs(t: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


class _CudaBackend:
    def __init__(self, device: torch.device):
        self.device = device
        self.side = torch.cuda.Stream(device=device)

    def consumer(self):
        return torch.cuda.current_stream(self.device)

    def side_context(self):
        return torch.cuda.stream(self.side)

    def record_on(self, stream) -> torch.cuda.Event:
        ev = torch.cuda.Event()
        ev.record(stream)
        return ev

    def side_waits(self, ev) -> None:
        if ev is not None:
            self.side.wait_event(ev)

    def consumer_waits(self, ev) -> None:
        self.consumer().wait_event(ev)

    @staticmethod
    def done(ev) -> bool:
        return ev is None or ev.query()


class _HostBackend:
    """device='cpu': no streams; every event is complete."""

    def __init__(self, device: torch.device):
        self.device = device
        self.side = None

    def consumer(self):
        return None

    def side_context(self):
        return _Null()

    def record_on(self, stream):
        return None

    def side_waits(self, ev) -> None:
        pass

    def consumer_waits(self, ev) -> None:
        pass

    @staticmethod
    def done(ev) -> bool:
        return True


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _DeviceSlot:
    def __init__(self):
        self.buffers: dict[Any, torch.Tensor] = {}
        self.baseline: dict[Any, int] = {}
        self.release_event = None
        self.copy_event = None
        self.host = None  # the host batch, kept alive until copy_event completes
        self.handed = False

    def buffer(self, key, shape, dtype, device, channels_last: bool) -> torch.Tensor:
        buf = self.buffers.get(key)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            fmt = torch.channels_last if channels_last else torch.contiguous_format
            buf = torch.empty(shape, dtype=dtype, device=device, memory_format=fmt)
            self.buffers[key] = buf
            self.baseline[key] = _refs(buf)
        return buf

    def in_use(self) -> bool:
        return any(_refs(b) != self.baseline[k] for k, b in self.buffers.items())


def _channels_last(t: torch.Tensor) -> bool:
    return t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)


class DevicePrefetcher:
    """Iterate ``source`` with every batch already on ``device`` (see the module docstring).

    ``transforms`` maps a top-level key of the batch (an index of a list/tuple batch, or a dict key)
    to the ``TensorPipeline`` (ToDtype/Normalize) to run on that tensor on the device. ``depth`` is
    how many batches are copied ahead. ``on_yield`` is called once per batch handed out.
    """

    def __init__(self, source: Iterable, device: Any, depth: int = 2,
                 transforms: Mapping[Any, TensorPipeline] | None = None, on_yield=None):
        self.device = torch.device(device)
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError(f"device={device!r} but CUDA is not available (torch.cuda.is_available() is "
                                   f"False); use device=None to keep batches on the CPU")
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
            self.backend = _CudaBackend(self.device)
        elif self.device.type == "cpu":
            self.backend = _HostBackend(self.device)
        else:
            raise ValueError(f"device={device!r}: fastload prefetches to 'cuda' devices (or 'cpu')")
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth={depth!r} should be an int >= 1")
        self.source = source
        self._src: Iterator = iter(source)
        self.depth = depth
        self.transforms = {k: p for k, p in (transforms or {}).items() if p}
        self.on_yield = on_yield
        self._slots: list[_DeviceSlot] = []
        self._inflight: collections.deque = collections.deque()
        self._exhausted = False

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return len(self.source)

    # -- slots -------------------------------------------------------------------------------
    def _reclaim(self) -> None:
        consumer = self.backend.consumer()
        for slot in self._slots:
            if slot.host is not None and self.backend.done(slot.copy_event):
                slot.host = None  # the DMA finished: the host batch (a pinned slot) may be refilled
            if slot.handed and not slot.in_use():
                # kernels already queued on the consumer stream may still read it: fence them
                slot.release_event = self.backend.record_on(consumer)
                slot.handed = False

    def _free_slot(self) -> _DeviceSlot:
        busy = {id(s) for s, _ in self._inflight}
        for slot in self._slots:
            if not slot.handed and id(slot) not in busy and slot.host is None and not slot.in_use():
                return slot
        slot = _DeviceSlot()
        self._slots.append(slot)
        return slot

    # -- copying -----------------------------------------------------------------------------
    def _enqueue(self, host: Any) -> tuple[_DeviceSlot, Any]:
        with_paths, spec = tree_flatten_with_path(host)
        leaves = [leaf for _, leaf in with_paths]
        slot = self._free_slot()
        plans = []
        # allocate first, on the consumer's stream: blocks the caller frees are reused in its order
        for i, leaf in enumerate(leaves):
            # tensors already on the device are copied too (device to device, cheap): the caller then
            # never holds the producer's buffer, which may be rewritten once this copy has finished
            if not isinstance(leaf, torch.Tensor):
                plans.append(None)
                continue
            cl = _channels_last(leaf)
            staging = slot.buffer((i, "in"), leaf.shape, leaf.dtype, self.device, cl)
            pipe = self._pipeline_for(with_paths[i][0])
            out = slot.buffer((i, "out"), leaf.shape, pipe.dtype, self.device, cl) if pipe is not None else None
            plans.append((staging, pipe, out))
        with self.backend.side_context():
            self.backend.side_waits(slot.release_event)
            result = []
            for leaf, plan in zip(leaves, plans):
                if plan is None:
                    result.append(leaf)
                    continue
                staging, pipe, out = plan
                staging.copy_(leaf, non_blocking=True)
                done = pipe.apply(staging, out=out) if pipe is not None else staging
                result.append(done.detach())  # a new view: the slot's use count now sees the caller's hold
            slot.copy_event = self.backend.record_on(self.backend.side)
        slot.host = host
        return slot, tree_unflatten(result, spec)

    def _pipeline_for(self, path: tuple) -> TensorPipeline | None:
        """The pipeline of the top-level entry (list index or dict key) a tensor sits in, if it is that entry."""
        if not self.transforms:
            return None
        if not path:  # the batch is a single tensor
            return self.transforms.get(0)
        if len(path) != 1:
            return None
        key = getattr(path[0], "idx", getattr(path[0], "key", None))
        return self.transforms.get(key)

    def __next__(self):
        self._reclaim()
        while len(self._inflight) < self.depth and not self._exhausted:
            try:
                host = next(self._src)
            except StopIteration:
                self._exhausted = True
                break
            self._inflight.append(self._enqueue(host))
        if not self._inflight:
            raise StopIteration
        slot, out = self._inflight.popleft()
        self.backend.consumer_waits(slot.copy_event)
        slot.handed = True
        if self.on_yield is not None:
            self.on_yield()
        return out

    def close(self) -> None:
        close = getattr(self._src, "close", None)
        if close is not None:
            close()
        self._inflight.clear()


def to_device(iterable: Iterable, device: Any = "cuda", *, depth: int = 2,
              transforms: Mapping[Any, Any] | None = None) -> DevicePrefetcher:
    """Prefetch batches of any iterable (e.g. a ``torch.utils.data.DataLoader``) to ``device``.

    Copies run on a side CUDA stream with ``non_blocking=True`` into device buffers allocated once;
    the consumer stream waits on an event, never the host. Use ``pin_memory=True`` on a torch loader
    so the copies are truly asynchronous. ``transforms`` maps a batch key (list index or dict key) to a
    list of ``ToDtype``/``Normalize`` to run on the device, e.g. ``{0: [ToDtype(torch.float16,
    scale=True), Normalize(mean, std)]}``.
    """
    pipes = {k: v if isinstance(v, TensorPipeline) else TensorPipeline(list(v)) for k, v in (transforms or {}).items()}
    return DevicePrefetcher(iterable, device, depth, pipes)
