"""The fast path's iterator: the calling thread or a producer thread fills each batch, whichever the
measurements say is faster.

A producer thread overlaps filling the next batches with the caller's step: what ``num_workers > 0``
asks for, and what a training loop needs. But handing a batch over (queue, wake-up, GIL hand-over) has
a cost of its own, and when the caller does almost nothing between batches (a benchmark, an evaluation
loop over tiny records) and a batch costs little to fill, that cost is most of the work: then the
calling thread fills each batch itself. ``FillPolicy`` (one per loader, kept across epochs) holds the
median of the latest fill times and of the caller's times between batches and decides:

  * producer thread  while the fill time is unknown (the start of the first epoch), when filling costs
                     >= ``INLINE_BELOW`` per batch, or when the caller's own time per batch exceeds the
                     fill time (there is work to hide the fill behind);
  * calling thread   when filling is cheap and the caller's time is under half the fill time.

The switch happens mid-epoch in both directions: the producer hands the rest of the batch sequence
back (``_HANDBACK``, after the batches it already queued) or is started on it. Which thread fills a
batch changes neither the batches nor their RNGs nor resume: the sequence is one iterator, consumed
by one thread at a time. ``num_workers`` stays the size of the native pool in both modes.

GPU decoders (``decoder='nvjpeg'/'dali'/'auto'`` with ``device='cuda'``) always fill in a producer thread,
even at ``num_workers=0``: their calls are long host work (nvJPEG's and DALI's host phases, the plan's
uploads) that the training thread should not pay; they hand each batch on with an event, not a host wait.
"""

from __future__ import annotations

import atexit
import collections
import queue
import threading
import time
import weakref
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data.dataloader import _BaseDataLoaderIter

from ._dropin import contiguous_images

INLINE_BELOW = 1e-3  # seconds per batch fill from which a producer thread always fills
SAMPLES = 3  # measurements needed before the policy changes the mode (a cold first batch does not decide)

_END = object()
_HANDBACK = object()


class FillPolicy:
    """Median fill time and caller time per batch (latest 8 each); whether a producer thread should fill."""

    def __init__(self):
        self.fills: collections.deque = collections.deque(maxlen=8)
        self.steps: collections.deque = collections.deque(maxlen=8)

    @staticmethod
    def _median(values) -> float | None:
        values = sorted(values)  # a snapshot (the producer thread appends concurrently); np.median costs
        return values[len(values) // 2] if len(values) >= SAMPLES else None  # more than a tiny batch

    @property
    def fill_cost(self) -> float | None:
        return self._median(self.fills)

    @property
    def step_cost(self) -> float | None:
        return self._median(self.steps)

    def threaded(self, now: bool) -> bool:
        """Whether a producer thread should fill the next batches; ``now`` is the current mode."""
        fill, step = self.fill_cost, self.step_cost
        if fill is None or step is None:
            return now
        if fill >= INLINE_BELOW:
            return True
        return step > fill if not now else step >= 0.5 * fill


class _Producer:
    """State shared by the iterator and its background thread (which must not own the iterator,
    so that dropping the iterator after ``break`` stops the thread)."""

    def __init__(self, depth: int):
        self.thread: threading.Thread | None = None
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.handback = threading.Event()
        self.reserved: set[int] = set()
        self.lock = threading.Lock()

    def put(self, item) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False


_LIVE: "weakref.WeakSet[_Producer]" = weakref.WeakSet()  # producers whose thread may still run


@atexit.register
def _stop_producers() -> None:
    """At interpreter exit, before finalization: stop every producer thread and wait for the batch it is
    filling. A daemon thread still inside a native call (GIL released) when Python finalizes is ended by
    pthread_exit as it takes the GIL back, and that forced unwind through the binding's GIL guard aborted the
    whole process ("terminate called without an active exception", exit 134) -- e.g. a script that stops
    mid-epoch, or a DDP rank whose last epoch's iterator was not drained."""
    producers = list(_LIVE)
    for p in producers:
        p.stop.set()
    for p in producers:
        if p.thread is not None and p.thread is not threading.current_thread():
            p.thread.join(timeout=30)


class FastIterator(_BaseDataLoaderIter):  # a torch DataLoader iterator by type (Lightning checks); no base __init__
    def __init__(self, loader: Any, epoch: int, start: int, batches: Iterator[np.ndarray], rng_for,
                 progress: Any = None, tensor_transforms: bool = True):
        self.loader = loader
        self.batcher = loader._batcher
        self.policy: FillPolicy = loader._fill_policy
        self.epoch = epoch
        self.done = start
        self.batches = batches
        self.rng_for = rng_for
        self.timeout = loader.timeout
        self.stats = loader._stats
        self.progress = progress  # an _order.Progress to advance per batch handed out, or None
        self.tensor_transforms = tensor_transforms  # ToDtype/Normalize here (False: the device prefetcher runs them)
        ds = loader.dataset
        self.image_keys = [] if loader.memory_format == torch.channels_last else \
            [(f.name if ds.as_dict else i) for i, f in enumerate(ds.schema) if f.kind == "image"]
        if not tensor_transforms:  # a device prefetcher takes the batches: the NCHW transpose runs there,
            self.contiguous_on_device, self.image_keys = self.image_keys, []  # not on the CPU of this thread
        self.thread = None
        self.producer = None
        self._returned_at: float | None = None
        self.batcher.images.bind_device()
        # GPU decoders: always in a producer thread, even at num_workers=0 (long host work per batch;
        # the rows are handed on with an event, so no thread waits for the GPU)
        self.gpu_rows = self.batcher.images.device is not None
        if (loader.num_workers > 0 or self.gpu_rows) and self._threaded(True):
            self._start_producer()

    def _threaded(self, now: bool) -> bool:
        return self.gpu_rows or self.policy.threaded(now)

    def _start_producer(self) -> None:
        """Fill the remaining batches in a background thread (the batch sequence and RNGs are unchanged)."""
        loader = self.loader
        self.producer = _Producer(loader.prefetch_factor or 2)
        self.thread = threading.Thread(target=_produce, name="fastload-batcher", daemon=True,
                                       args=(self.producer, loader, self.batches, self.done, self.rng_for))
        self.producer.thread = self.thread
        _LIVE.add(self.producer)
        self.thread.start()

    def _take_back(self) -> None:
        """The producer has stopped pulling from the batch sequence: fill in this thread from now on."""
        self.thread.join()
        self.thread = None
        self.producer = None

    def __iter__(self):
        return self

    def __next__(self):
        started = self.stats.begin_next()
        if self._returned_at is not None:
            self.policy.steps.append(started - self._returned_at)  # the caller's own time for one batch
        out = self._next_threaded(started) if self.producer is not None else self._next_inline(started)
        self._returned_at = time.perf_counter()
        return out

    def _next_threaded(self, started: float):
        p = self.producer
        try:
            item = p.queue.get(timeout=self.timeout if self.timeout > 0 else None)
        except queue.Empty:
            self.close()
            raise RuntimeError(f"DataLoader timed out after {self.timeout} seconds") from None
        if item is _END:
            self.close()
            raise StopIteration
        if item is _HANDBACK:
            self._take_back()
            return self._next_inline(started)
        if isinstance(item, BaseException):
            self.close()
            raise item
        slot, n, objects = item
        out = self.batcher.collate(slot, n, objects, self.tensor_transforms)
        with p.lock:
            p.reserved.discard(id(slot))
        self.stats.end_next(started, n, p.queue.qsize())
        if not p.handback.is_set() and not self._threaded(True):
            p.handback.set()  # cheap batches, a caller that waits on them: the hand-off costs more than it hides
        return self._count(out)

    def _next_inline(self, started: float):
        try:
            idx = next(self.batches)
        except StopIteration:
            self.close()
            raise
        slot = self.loader._free_slot(set())
        t = time.perf_counter()
        objects = self.batcher.fill(slot, idx, self.rng_for(self.done))
        cost = time.perf_counter() - t
        self.stats.add_fill(cost)
        self.policy.fills.append(cost)
        out = self.batcher.collate(slot, len(idx), objects, self.tensor_transforms)
        self.stats.end_next(started, len(idx))
        out = self._count(out)
        if (self.loader.num_workers > 0 or self.gpu_rows) and self._threaded(False):
            self._start_producer()  # batches got expensive, or the caller has work to hide them behind
        return out

    def _count(self, out):
        if self.image_keys and self.batcher.packed is None:
            out = contiguous_images(out, self.image_keys)
        self.done += 1
        if self.progress is not None:
            self.progress.advance()
        return out

    def close(self) -> None:
        self.stats.end_epoch()
        if self.producer is not None:
            self.producer.stop.set()
            if self.thread is not None and self.thread is not threading.current_thread():
                self.thread.join()
            self.thread = None
        if not self.loader.persistent_workers:
            self.batcher.end_epoch()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __len__(self) -> int:
        return len(self.loader)


def _produce(p: _Producer, loader: Any, batches, start: int, rng_for) -> None:
    batcher = loader._batcher
    b = start
    try:
        while not p.stop.is_set():
            if p.handback.is_set():
                p.put(_HANDBACK)  # after every batch already queued; this thread no longer touches `batches`
                return
            try:
                idx = next(batches)
            except StopIteration:
                p.put(_END)
                return
            with p.lock:
                slot = loader._free_slot(p.reserved)
                p.reserved.add(id(slot))
            t = time.perf_counter()
            objects = batcher.fill(slot, idx, rng_for(b))
            cost = time.perf_counter() - t
            loader._stats.add_fill(cost)
            loader._fill_policy.fills.append(cost)
            b += 1
            if not p.put((slot, len(idx), objects)):
                return
    except BaseException as e:  # handed to the consumer, re-raised there
        p.put(e)
