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
import os
from typing import Any, Iterable, Iterator, Mapping

import torch
from torch.utils._pytree import tree_flatten_with_path, tree_unflatten
from torch.utils.data.dataloader import _BaseDataLoaderIter

from .._ring import CopyHolds, Slot, SlotRing, cuda_available, same_stream, seen_consumer, streams_for
from .._transforms.tensor import TensorPipeline
from .stage import Stage, nested, upstream_state


class AfterCopy:
    """A batch with work to run on it on the device once copied (the collate stage's MixUp/CutMix plan,
    drawn on the host): ``then(batch) -> batch``, run on the consumer's stream when the batch is handed out."""

    __slots__ = ("batch", "then")

    def __init__(self, batch: Any, then: Any):
        self.batch, self.then = batch, then


def check_device(device: Any) -> torch.device:
    """``device`` as a torch.device; a clear error for anything else. ``'cuda'`` stays without an index
    here: a loader is often built before ``torch.cuda.set_device(local_rank)``, so the index is taken at
    the first iteration (``resolve_device``), not at construction."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if not cuda_available():
            raise RuntimeError(
                f"device={device!r} but CUDA is not available (torch.cuda.is_available() is "
                f"False); use device=None to keep batches on the CPU"
            )
    elif dev.type != "cpu":
        raise ValueError(f"device={device!r}: fastload prefetches to 'cuda' devices (or 'cpu')")
    return dev


def resolve_device(device: Any) -> torch.device:
    """``check_device``, with ``'cuda'`` made ``'cuda:<current device of this thread>'``."""
    dev = check_device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


class DeviceRing(SlotRing):
    """Device slots and the streams that fill them; one per loader, kept across epochs.

    Bounded: once it has ``limit`` slots (the prefetcher sets its depth + ``MARGIN``), a lagging GPU does not
    make it grow. A slot nobody holds is then reused although its latest copy has not completed, ordered *on
    the device*, never by a host wait (this runs in the training thread): its previous copy was queued
    earlier on the same side stream, and the side stream waits on the consumer's fence recorded after the
    slot was acquired, so after the reads of its previous batch (rule 3 of ``_ring.py``). The host memory
    that copy still reads (the slot's pinned staging) is parked in ``holds`` until its event completed
    (rule 2, a query), and the slot gets new staging. Slots the caller holds are never reused: a caller that
    keeps many batches still grows the ring.

    ``holds`` keeps every host batch a queued copy reads (and parked staging) until the copy completed; the
    fast path's host ring shares it, so that its producer thread can wait for the oldest copy instead of
    growing (``_ring.CopyHolds``, ``fill.py``)."""

    MARGIN = 2  # slots beyond the prefetch depth: the batch the caller is using, and one to spare

    def __init__(self, device: Any, streams=None):
        super().__init__(Slot)
        self.device = resolve_device(device)  # made at the first iteration: after set_device(local_rank)
        self.streams = streams if streams is not None else streams_for(self.device)
        self.used: set[int] = set()  # slots acquired since the latest pass began
        self.limit: int | None = None  # slots beyond which busy free slots are reused (None: grow)
        self.holds = CopyHolds(self.streams)  # host memory queued copies still read, until their events
        self._last: dict[int, int] = {}  # slot id -> when it was last acquired (the oldest is reused)
        self._acquired = 0
        self._constants: dict = {}  # (pipeline, channels) -> Normalize's constants, made on this ring's side stream

    def constants(self, pipe: TensorPipeline, channels: int):
        """``pipe``'s per-channel constants on this ring's side stream, where the pipeline runs: made there once
        (fill kernels queued in its order, before the copy that first needs them) and kept with the ring. Not
        on the pipeline: every loader over one dataset shares it, each with a side stream of its own, and a
        tensor written on one stream and read on another needs the reader to wait for the writer (a loader
        made each epoch read constants that the first loader's lagging stream had not written yet)."""
        key = (pipe, channels)
        if key not in self._constants:
            with self.streams.side_context():
                self._constants[key] = pipe.constants(channels, self.streams)
        return self._constants[key]

    def reclaim(self) -> None:
        """Let go of host batches whose copies have completed (their pinned slots may be refilled)."""
        self.holds.release()

    def ready(self, slot: Slot) -> bool:
        """Whether the slot's latest copy has completed: its pinned staging may be refilled (a query)."""
        return self.streams.done(slot.copy_event)

    def acquire(self, skip=(), ready=None) -> Slot:
        if self.pid != os.getpid():  # rule 6: a forked child starts empty
            return self._take(super().acquire(skip, ready))
        free = [s for s in self.slots if id(s) not in skip and not s.held()]
        slot = next((s for s in free if ready is None or ready(s)), None)
        if slot is None and free and self.limit is not None and len(self.slots) >= self.limit:
            slot = min(free, key=lambda s: self._last.get(id(s), -1))  # the oldest: its copy is the likeliest done
            self._park(slot)
        if slot is None:
            slot = self.make()
            self.slots.append(slot)
        return self._take(slot)

    def _take(self, slot: Slot) -> Slot:
        self.used.add(id(slot))
        self._acquired += 1
        self._last[id(slot)] = self._acquired
        return slot

    def _park(self, slot: Slot) -> None:
        """The slot's pinned staging stays referenced until its latest copy completed; the slot gets new
        staging (its host batch is in ``holds`` already)."""
        if self.streams.done(slot.copy_event):
            return
        staging = [k for k in slot.tensors if isinstance(k, tuple) and k[-1] == "pin"]
        keep = [slot.tensors.pop(k) for k in staging]
        for k in staging:
            slot.arrays.pop(k, None)
            slot.baseline.pop(k, None)
        if keep:
            self.holds.keep(slot.copy_event, keep)

    def begin_pass(self) -> None:
        """A new pass over the source: let go of the slots the previous pass never needed (an epoch whose
        caller held many batches grew the ring; at batch 256 float32 a slot is ~190 MB of device memory).
        Their memory returns to the allocator once the side stream's and the readers' work on it completed
        (rule 4); host memory their copies still read is parked until then."""
        if self.used:
            keep = [s for s in self.slots if id(s) in self.used or s.held()]
            for s in self.slots:
                if not any(s is k for k in keep):
                    self._park(s)
                    self._last.pop(id(s), None)
            self.slots = keep
        self.used = set()


def _check_depth(depth: Any) -> None:
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth={depth!r} should be an int >= 1")


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t`` covers its memory without gaps in some order of its dimensions (a plain memcpy)."""
    return t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last)


def _channels_last(t: torch.Tensor) -> bool:
    return t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)


class DevicePrefetcher(Stage, _BaseDataLoaderIter):  # a torch DataLoader iterator by type; no base __init__
    """Iterate ``source`` with every batch already on ``device`` (see the module docstring).

    The chain's device stage (``stage.Stage``; a plain iterable source works too, with no state): each batch in
    flight carries its upstream's state right after it was taken, and the stage's state is that of the last
    batch handed out (the copies queued ahead are not part of it, ``stage.py``'s prefetching rule); ``reset``
    drops the batches in flight (their host memory stays held until their copies completed, rule 2), resets the
    upstream and copies ahead again from there.

    ``transforms`` maps a top-level key of the batch (an index of a list/tuple batch, or a dict key)
    to the ``TensorPipeline`` (ToDtype/Normalize) to run on that tensor on the device. ``depth`` is
    how many batches are copied ahead. ``on_yield`` is called once per batch handed out. ``ring`` is
    the device ring to fill (a new one when None). ``contiguous``: entries to copy into torch's contiguous
    layout on the device.
    """

    def __init__(
        self,
        source: Iterable,
        device: Any = None,
        depth: int = 2,
        transforms: Mapping[Any, TensorPipeline] | None = None,
        on_yield=None,
        ring: DeviceRing | None = None,
        contiguous: Iterable = (),
    ):
        _check_depth(depth)
        self.ring = ring if ring is not None else DeviceRing(device)
        self.ring.begin_pass()
        self.ring.limit = depth + DeviceRing.MARGIN
        self.device = self.ring.device
        self.streams = self.ring.streams
        self.source = source
        self._src: Iterator = iter(source)
        self.depth = depth
        self.transforms = {k: p for k, p in (transforms or {}).items() if p}
        # entries to hand out in torch's contiguous layout, made on the device (the fast path's chain leaves
        # its channels_last images to us rather than transposing them on the CPU)
        self.contiguous = set(contiguous)
        self.on_yield = on_yield
        self._inflight: collections.deque = collections.deque()  # (slot, batch, then, upstream state after it)
        self._exhausted = False
        self._snapshot = upstream_state(source)

    def __len__(self) -> int:
        return len(self.source)

    # -- copying -----------------------------------------------------------------------------------
    def _buffer(self, slot: Slot, key, shape, dtype, channels_last: bool) -> torch.Tensor:
        buf = slot.tensors.get(key)
        if buf is None or buf.shape != shape or buf.dtype != dtype or _channels_last(buf) != channels_last:
            buf = slot.put(key, self.streams.empty(tuple(shape), dtype, channels_last))  # on the consumer stream
            # a new buffer, made on the current stream: the streams that read the old ones never read it, so it
            # is recorded for each stream it is handed to from now on (one queued on stream A may be handed out
            # on B, which read the old buffers: freed unrecorded, A could reuse it under B's queued reads)
            slot.readers.clear()
            self.streams.record_stream(buf, self.streams.side)  # rule 4: freed only after the side stream's use
        return buf

    def _enqueue(self, host: Any) -> tuple[Slot, Any, Any]:
        s = self.streams
        then = None
        if isinstance(host, AfterCopy):
            host, then = host.batch, host.then
        with_paths, spec = tree_flatten_with_path(host)
        leaves = [leaf for _, leaf in with_paths]
        slot = self.ring.acquire(ready=self.ring.ready)
        plans = []
        keep_host = False  # a copy reads the caller's memory itself (pinned, or on the device), not staging
        ready = []  # events after device sources' last writes (a GPU decoder's rows, _fill/images.py): waited on
        # allocate first, on the consumer's stream (rule 3a: the fence below is recorded after this)
        for i, leaf in enumerate(leaves):
            # tensors already on the device are copied too (device to device, cheap): the caller then
            # never holds the producer's buffer, which may be rewritten once this copy has finished
            if not isinstance(leaf, torch.Tensor):
                plans.append(None)
                continue
            ready.append(getattr(leaf, "fastload_ready", None))
            cl = _channels_last(leaf)
            staging = self._buffer(slot, (i, "in"), leaf.shape, leaf.dtype, cl)
            key = self._key(with_paths[i][0])
            pipe = self.transforms.get(key) if key is not None else None
            layout = cl and key in self.contiguous  # NHWC crosses PCIe; the NCHW transpose runs on the device
            consts = self.ring.constants(pipe, leaf.shape[1]) if pipe is not None and leaf.dim() > 1 else None
            out = None
            if pipe is not None or layout:
                out = self._buffer(
                    slot, (i, "out"), leaf.shape, pipe.dtype if pipe is not None else leaf.dtype, cl and not layout
                )
            if leaf.device.type != "cpu":  # e.g. a GPU decoder's rows: freed only after this read (rule 4)
                s.record_stream(leaf, s.side)
                keep_host = True
            elif s.is_pinned(leaf):
                keep_host = True
            else:
                # a copy from pageable memory waits for the side stream, which waits for the consumer: a
                # host sync. A memcpy into pinned staging first (refilled only once the copy completed)
                pinned = slot.tensors.get((i, "pin"))
                if pinned is None or pinned.shape != leaf.shape or pinned.dtype != leaf.dtype:
                    pinned = slot.put((i, "pin"), s.host_empty(tuple(leaf.shape), leaf.dtype))
                leaf = pinned.as_strided(leaf.shape, leaf.stride()).copy_(leaf) if _dense(leaf) else pinned.copy_(leaf)
            plans.append((leaf, staging, pipe, out, consts))
        # after the allocations and after the caller's last use (rule 3): the allocations were made on the
        # current stream, the last use was on the stream the slot was handed to (a consumer may switch)
        consumer = s.consumer()
        fences = [s.record(consumer)]
        if slot.receiver is not None and not same_stream(slot.receiver, consumer):  # a new object per call: ==
            fences.append(s.record(slot.receiver))
        fences += ready
        with s.side_context():
            for fence in fences:
                s.wait(s.side, fence)
            result = []
            for leaf, plan in zip(leaves, plans):
                if plan is None:
                    result.append(leaf)
                    continue
                src, staging, pipe, out, consts = plan
                s.copy(staging, src)
                if pipe is not None:
                    s.launch(
                        lambda p=pipe, x=staging, o=out, c=consts: p.apply(x, out=o, consts=c),
                        reads=(staging,) + tuple(consts or ()),
                        writes=(out,),
                    )
                    staging = out
                elif out is not None:
                    s.copy(out, staging)  # the layout change, a device kernel
                    staging = out
                result.append(staging.detach())  # a new view: the slot's use count now sees the caller's hold
            slot.copy_event = s.record(s.side)
        # referenced until the copy event has completed (rule 2); a batch copied into staging is free at once
        # (the generic path's shared-memory lease goes back to its worker now)
        if keep_host:
            self.ring.holds.keep(slot.copy_event, host)
        return slot, tree_unflatten(result, spec), then

    @staticmethod
    def _key(path: tuple) -> Any:
        """The top-level entry (list index or dict key) a tensor sits in, if it is that entry; else None."""
        if not path:  # the batch is a single tensor
            return 0
        if len(path) != 1:
            return None
        return getattr(path[0], "idx", getattr(path[0], "key", None))

    def __next__(self):
        self.ring.reclaim()
        while len(self._inflight) < self.depth and not self._exhausted:
            try:
                host = next(self._src)
            except StopIteration:
                self._exhausted = True
                break
            self._inflight.append(self._enqueue(host) + (upstream_state(self.source),))
        if not self._inflight:
            raise StopIteration
        slot, out, then, self._snapshot = self._inflight.popleft()
        consumer = self.streams.consumer()
        seen_consumer(consumer)  # streams fastload draws later avoid the loop's (_ring.draw_stream)
        self.streams.wait(consumer, slot.copy_event)  # rule 5
        if consumer not in slot.readers:
            # read there: if that is not the allocating stream, the memory is reused only after those reads
            for t in slot.tensors.values():
                self.streams.record_stream(t, consumer)
            slot.readers.add(consumer)
        slot.receiver = consumer  # the next fence for this slot is recorded there
        if then is not None:  # queued on the consumer's stream after the wait above: no host sync
            out = then(out)
        if self.on_yield is not None:
            self.on_yield()
        return out

    def state(self) -> dict:
        return nested(self._snapshot)

    def reset(self, state: dict | None = None) -> None:
        """Start over from ``state`` (the upstream's, nested under ``"source"``): the batches in flight are
        dropped; an upstream that is no stage cannot go back and is refused."""
        if not isinstance(self.source, Stage):
            raise TypeError(
                f"fastload: a device prefetcher over {type(self.source).__name__} (not a stage of fastload's chain) "
                f"cannot reset: its source has no state to go back to; make a new one over a new pass"
            )
        self._inflight.clear()
        super().reset(state)
        self._src = iter(self.source)
        self._exhausted = False
        self._snapshot = upstream_state(self.source)

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
        self._device = check_device(device)
        self.ring: DeviceRing | None = None  # made at the first pass: 'cuda' is the device current then
        self.depth = depth
        self.transforms = transforms
        self._passes = 0

    def __iter__(self) -> DevicePrefetcher:
        it = iter(self.source)
        if it is self.source and self._passes:
            raise TypeError(
                f"to_device() was given a one-shot iterator ({type(self.source).__name__}) that an "
                f"earlier pass has consumed; pass a re-iterable source (a DataLoader, a list of "
                f"batches) to iterate more than once"
            )
        self._passes += 1
        if self.ring is None:  # a loader wrapped before torch.cuda.set_device(local_rank) uses the rank's GPU
            self.ring = DeviceRing(self._device)
        return DevicePrefetcher(it, depth=self.depth, transforms=self.transforms, ring=self.ring)

    @property
    def device(self) -> torch.device:
        """The device batches go to (``'cuda'`` gets its index at the first pass)."""
        return self.ring.device if self.ring is not None else self._device

    def __len__(self) -> int:
        return len(self.source)


def to_device(
    iterable: Iterable, device: Any = "cuda", *, depth: int = 2, transforms: Mapping[Any, Any] | None = None
) -> DeviceLoader:
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
