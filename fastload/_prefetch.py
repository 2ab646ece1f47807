"""Prefetch to the device: batches copied on a side stream, handed over by events, never a host sync.

``DevicePrefetcher`` wraps any iterator of batches (tensors in lists, tuples, dicts...). For each batch
it takes a device slot from a ``DeviceRing`` (``_ring.py``: allocated once, reused across epochs), and
follows the ring's protocol: the side stream waits on an event recorded on the consumer stream after
the slot was acquired (so after its buffers' allocation and after the caller's last use of it), copies
every CPU tensor in with ``non_blocking=True`` (pinned host memory makes that a true async DMA), runs
``ToDtype``/``Normalize`` there, and records a copy event. When the batch is handed out the consumer's
current stream waits on that event (``Stream.wait_event``): the host never blocks. The host batch stays
referenced until the copy event has completed, so a pinned host slot is never refilled under its DMA.

``to_device(iterable)`` wraps any re-iterable (a torch DataLoader, a list of batches) so that every
``for`` is a new pass over it, like a DataLoader.

With ``device='cpu'`` the same code runs on ``HostStreams`` (no streams, everything at once); tests run
it on a simulated GPU whose queued work runs late (tests/sim_streams.py); tests/cuda/ on a real one.
"""

from __future__ import annotations

import collections
from typing import Any, Iterable, Iterator, Mapping

import torch
from torch.utils._pytree import tree_flatten_with_path, tree_unflatten
from torch.utils.data.dataloader import _BaseDataLoaderIter

from ._ring import Slot, SlotRing, streams_for
from ._tensor_transforms import TensorPipeline


def check_device(device: Any) -> torch.device:
    """``device`` as a torch.device with an index for CUDA; a clear error for anything else."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device={device!r} but CUDA is not available (torch.cuda.is_available() is "
                               f"False); use device=None to keep batches on the CPU")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.type != "cpu":
        raise ValueError(f"device={device!r}: fastload prefetches to 'cuda' devices (or 'cpu')")
    return dev


class DeviceRing(SlotRing):
    """Device slots and the streams that fill them; one per loader, kept across epochs."""

    def __init__(self, device: Any, streams=None):
        super().__init__(Slot)
        self.device = check_device(device)
        self.streams = streams if streams is not None else streams_for(self.device)

    def reclaim(self) -> None:
        """Let go of host batches whose copies have completed (their pinned slots may be refilled)."""
        for slot in self.slots:
            if slot.host is not None and self.streams.done(slot.copy_event):
                slot.host = None

    def ready(self, slot: Slot) -> bool:
        return slot.host is None


def _check_depth(depth: Any) -> None:
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth={depth!r} should be an int >= 1")


def _channels_last(t: torch.Tensor) -> bool:
    return t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)


class DevicePrefetcher(_BaseDataLoaderIter):  # a torch DataLoader iterator by type; no base __init__
    """Iterate ``source`` with every batch already on ``device`` (see the module docstring).

    ``transforms`` maps a top-level key of the batch (an index of a list/tuple batch, or a dict key)
    to the ``TensorPipeline`` (ToDtype/Normalize) to run on that tensor on the device. ``depth`` is
    how many batches are copied ahead. ``on_yield`` is called once per batch handed out. ``ring`` is
    the device ring to fill (a new one when None).
    """

    def __init__(self, source: Iterable, device: Any = None, depth: int = 2,
                 transforms: Mapping[Any, TensorPipeline] | None = None, on_yield=None,
                 ring: DeviceRing | None = None):
        _check_depth(depth)
        self.ring = ring if ring is not None else DeviceRing(device)
        self.device = self.ring.device
        self.streams = self.ring.streams
        self.source = source
        self._src: Iterator = iter(source)
        self.depth = depth
        self.transforms = {k: p for k, p in (transforms or {}).items() if p}
        self.on_yield = on_yield
        self._inflight: collections.deque = collections.deque()
        self._exhausted = False

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return len(self.source)

    # -- copying -----------------------------------------------------------------------------------
    def _buffer(self, slot: Slot, key, shape, dtype, channels_last: bool) -> torch.Tensor:
        buf = slot.tensors.get(key)
        if buf is None or buf.shape != shape or buf.dtype != dtype or _channels_last(buf) != channels_last:
            buf = slot.put(key, self.streams.empty(tuple(shape), dtype, channels_last))  # on the consumer stream
            self.streams.record_stream(buf, self.streams.side)  # rule 4: freed only after the side stream's use
        return buf

    def _enqueue(self, host: Any) -> tuple[Slot, Any]:
        s = self.streams
        with_paths, spec = tree_flatten_with_path(host)
        leaves = [leaf for _, leaf in with_paths]
        slot = self.ring.acquire(ready=self.ring.ready)
        plans = []
        # allocate first, on the consumer's stream (rule 3a: the fence below is recorded after this)
        for i, leaf in enumerate(leaves):
            # tensors already on the device are copied too (device to device, cheap): the caller then
            # never holds the producer's buffer, which may be rewritten once this copy has finished
            if not isinstance(leaf, torch.Tensor):
                plans.append(None)
                continue
            cl = _channels_last(leaf)
            staging = self._buffer(slot, (i, "in"), leaf.shape, leaf.dtype, cl)
            pipe = self._pipeline_for(with_paths[i][0])
            out = self._buffer(slot, (i, "out"), leaf.shape, pipe.dtype, cl) if pipe is not None else None
            plans.append((staging, pipe, out))
        fence = s.record(s.consumer())  # after the allocations and after the caller's last use (rule 3)
        with s.side_context():
            s.wait(s.side, fence)
            result = []
            for leaf, plan in zip(leaves, plans):
                if plan is None:
                    result.append(leaf)
                    continue
                staging, pipe, out = plan
                s.copy(staging, leaf)
                if pipe is not None:
                    s.launch(lambda p=pipe, x=staging, o=out: p.apply(x, out=o), reads=(staging,), writes=(out,))
                    staging = out
                result.append(staging.detach())  # a new view: the slot's use count now sees the caller's hold
            slot.copy_event = s.record(s.side)
        slot.host = host  # referenced until the copy event has completed (rule 2)
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
        self.ring.reclaim()
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
        self.streams.wait(self.streams.consumer(), slot.copy_event)  # rule 5
        if self.on_yield is not None:
            self.on_yield()
        return out

    def close(self) -> None:
        close = getattr(self._src, "close", None)
        if close is not None:
            close()
        self._inflight.clear()


class DeviceLoader:
    """What ``to_device`` returns: each ``iter()`` is a new pass over the source, prefetched to the device."""

    def __init__(self, source: Iterable, device: Any, depth: int, transforms: Mapping[Any, TensorPipeline]):
        _check_depth(depth)
        self.source = source
        self.ring = DeviceRing(device)
        self.device = self.ring.device
        self.depth = depth
        self.transforms = transforms
        self._passes = 0

    def __iter__(self) -> DevicePrefetcher:
        it = iter(self.source)
        if it is self.source and self._passes:
            raise TypeError(f"to_device() was given a one-shot iterator ({type(self.source).__name__}) that an "
                            f"earlier pass has consumed; pass a re-iterable source (a DataLoader, a list of "
                            f"batches) to iterate more than once")
        self._passes += 1
        return DevicePrefetcher(it, depth=self.depth, transforms=self.transforms, ring=self.ring)

    def __len__(self) -> int:
        return len(self.source)


def to_device(iterable: Iterable, device: Any = "cuda", *, depth: int = 2,
              transforms: Mapping[Any, Any] | None = None) -> DeviceLoader:
    """Prefetch batches of any iterable (e.g. a ``torch.utils.data.DataLoader``) to ``device``.

    Copies run on a side CUDA stream with ``non_blocking=True`` into device buffers allocated once;
    the consumer stream waits on an event, never the host. Every ``for`` over the result is a new pass
    over ``iterable`` (a one-shot iterator can be passed once). Use ``pin_memory=True`` on a torch
    loader so the copies are truly asynchronous. ``transforms`` maps a batch key (list index or dict
    key) to a list of ``ToDtype``/``Normalize`` to run on the device, e.g. ``{0: [ToDtype(torch.float16,
    scale=True), Normalize(mean, std)]}``.
    """
    pipes = {k: v if isinstance(v, TensorPipeline) else TensorPipeline(list(v)) for k, v in (transforms or {}).items()}
    return DeviceLoader(iterable, device, depth, pipes)
