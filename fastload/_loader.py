"""``fastload.DataLoader``: torch's DataLoader signature and semantics, fastload's speed.

Fast path (a ``fastload.Dataset`` whose samples batch to fixed shapes): the Order picks each batch's
indices, the Batcher fills a preallocated slot in one native call with the GIL released, and a
producer thread keeps ``prefetch_factor`` batches ready while the training step runs. Anything else
(any other Dataset, a custom ``collate_fn`` or ``batch_sampler``) takes the generic path: with
``num_workers > 0``, worker processes collate into shared-memory slots (``_workers.py``); with 0,
torch's own single-process iterator.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import warnings
from typing import Any, Iterator

import numpy as np
import torch

from ._batcher import Batcher, NotFastPath, Slot
from ._dataset import Dataset as PackedDataset
from ._prefetch import DevicePrefetcher
from ._stats import LoaderStats
from ._order import BucketOrder, Order, PackedOrder, default_seed, dist_info
from ._sequences import Bucket, PackSequences
from ._workers import generic_iterator

_END = object()


class DataLoader(torch.utils.data.DataLoader):
    """A drop-in ``torch.utils.data.DataLoader``.

    Extra keyword-only arguments: ``device`` ('cuda': batches arrive on the GPU, copied on a side stream
    and handed over by events, with ToDtype/Normalize run there), ``seed`` (shuffling and augmentation;
    drawn from torch's generator when None), ``order`` ('sequential', 'random', 'quasi'; default from
    ``shuffle``), ``rank``/``world_size`` (default from torch.distributed), ``window`` (shards per
    quasi-random window), ``on_error`` ('raise' or 'skip' corrupt samples), ``decoder``
    ('native'; 'dali': NVIDIA DALI executes the same plans, on the GPU with ``device='cuda'``, else in
    its CPU-only mode; 'nvjpeg': torchvision's GPU decoder, needs ``device='cuda'``), ``split`` ('samples':
    ranks take strided samples like DistributedSampler; 'shards': each rank reads only its own shards;
    default 'shards' for a remote dataset with world_size > 1, see ``_order.py``).

    On the fast path ``num_workers`` is the number of native decode threads (0 decodes in the calling
    thread; ``"auto"`` measures the best count once per dataset and machine, see ``_autotune.py``);
    batches depend only on (seed, epoch, rank, world size), never on ``num_workers``.
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor=None, persistent_workers=False,
                 pin_memory_device="", in_order=True, device=None, seed=None, order=None, rank=None,
                 world_size=None, window=8, on_error="raise", decoder="native", split=None):
        auto = isinstance(num_workers, str) and num_workers == "auto"
        if auto:
            num_workers = os.cpu_count() or 1  # replaced by the measured choice on the fast path
        super().__init__(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory,
                         drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
                         prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                         pin_memory_device=pin_memory_device, in_order=in_order)
        self.device = torch.device(device) if device is not None else None
        if self.device is not None and self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device={device!r}: fastload prefetches to 'cuda' devices (or keeps batches on 'cpu')")
        if self.device is not None and self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device={device!r} but CUDA is not available (torch.cuda.is_available() is False); "
                               f"use device=None to keep batches on the CPU")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error={on_error!r} should be 'raise' or 'skip'")
        # drawn only for the fast path: the generic path leaves torch's generators exactly as torch would
        self.seed = int(seed) if seed is not None else None
        self.on_error = on_error
        self.fast_path_reason: str | None = None
        self._batcher: Batcher | None = None
        self._order: Order | None = None
        self._user_sampler = sampler is not None
        self._next_epoch = 0
        self._resume_at = 0
        self._progress = (0, 0)  # (epoch, batches done) of the latest iteration
        self._slots: list[Slot] = []
        self._stats = LoaderStats()
        self._persistent_pool = None
        self.decoder = decoder
        try:
            self._batcher = self._fast_path(dataset, batch_size, batch_sampler, collate_fn)
        except NotFastPath as e:
            self.fast_path_reason = str(e)
            if decoder != "native":
                raise ValueError(f"decoder={decoder!r} needs fastload's fast path, which this loader cannot take: "
                                 f"{e}") from None
            return
        if self.seed is None:
            self.seed = default_seed(generator)
        if self._user_sampler and self._batcher.packed is not None:
            self._batcher = None
            self.fast_path_reason = "PackSequences forms its own batches; a custom sampler cannot drive it"
            return
        if not self._user_sampler:
            kind = order or ("random" if shuffle else "sequential")
            r, w = dist_info(rank, world_size)
            explicit = split is not None
            if split is None:
                split = "shards" if getattr(dataset, "remote", False) and w > 1 else "samples"
            shard_sizes = [s.count for s in dataset._segments] if kind == "quasi" or split == "shards" else None
            common = dict(kind=kind, seed=self.seed, rank=r, world_size=w, drop_last=drop_last, window=window)
            bucketed = [(n, t) for n, t in dataset.sequences.items() if isinstance(t, Bucket)]
            packed = [(n, t) for n, t in dataset.sequences.items() if isinstance(t, PackSequences)]
            if (packed or bucketed) and split == "shards":
                if explicit:
                    raise ValueError("split='shards' needs plain batches: Bucket and PackSequences form their own")
                split = _strided("Bucket and PackSequences form their own batches")
            if packed:
                name, spec = packed[0]
                self._order = PackedOrder(_first_dims(dataset, name), batch_size * spec.row_length, **common)
            elif bucketed:
                name, spec = bucketed[0]
                self._order = BucketOrder(spec.bucket_ids(_first_dims(dataset, name)), batch_size, **common)
            else:
                try:
                    self._order = Order(len(dataset), batch_size, shard_sizes=shard_sizes, split=split, **common)
                except ValueError as e:
                    if explicit or split != "shards":
                        raise
                    self._order = Order(len(dataset), batch_size, shard_sizes=shard_sizes,
                                        split=_strided(str(e)), **common)
        if auto and self._order is not None:
            from ._autotune import autotune

            self.num_workers = autotune(self._batcher, self._order, dataset, batch_size)
            self._batcher.num_threads = self.num_workers

    def _fast_path(self, dataset, batch_size, batch_sampler, collate_fn) -> Batcher:
        if not isinstance(dataset, PackedDataset):
            raise NotFastPath("the dataset is not a fastload.Dataset (fastload.open)")
        if not dataset.decode:
            raise NotFastPath("the dataset was opened with decode=False")
        if batch_size is None or batch_sampler is not None:
            raise NotFastPath("batch_size=None or a custom batch_sampler")
        if collate_fn is not None:
            raise NotFastPath("a custom collate_fn")
        return Batcher(dataset, batch_size, self.num_workers, self.on_error, self.decoder, self.device)

    @property
    def fast_path(self) -> bool:
        return self._batcher is not None

    # -- epochs and resume -------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Like ``DistributedSampler.set_epoch``: the next iteration runs this epoch's order."""
        self._next_epoch = int(epoch)
        self._resume_at = 0
        if self._user_sampler and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def state_dict(self) -> dict:
        """Where the loader is: restoring it yields exactly the batches that would have come next."""
        if self._order is None:
            raise RuntimeError("state_dict() needs the fast path with fastload's own order (no custom sampler); "
                               f"this loader runs torch's path: {self.fast_path_reason or 'a custom sampler'}")
        epoch, done = self._progress
        if done >= len(self._order):
            epoch, done = epoch + 1, 0
        return self._order.state_dict(done) | {"epoch": epoch}

    def load_state_dict(self, state: dict) -> None:
        if self._order is None:
            raise RuntimeError("load_state_dict() needs the fast path with fastload's own order")
        self._resume_at = self._order.load_state_dict(state)
        self._next_epoch = self._order.epoch
        self._progress = (self._next_epoch, self._resume_at)

    # -- iteration ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        if self._order is not None:
            return len(self._order)
        return super().__len__()

    def _on_device(self) -> bool:
        return self.device is not None and self.device.type == "cuda"

    def __iter__(self):
        if self._batcher is None:
            it = generic_iterator(self)  # shared-memory workers; None: torch's own iterator
            it = super().__iter__() if it is None else it
            return DevicePrefetcher(it, self.device, self.prefetch_factor or 2) if self._on_device() else it
        epoch, start = self._next_epoch, self._resume_at
        self._next_epoch, self._resume_at = epoch + 1, 0
        if self._order is not None:
            self._order.set_epoch(epoch)
            batches = self._order.batches(epoch, start)
            rng_for = lambda b: self._order.batch_rng(epoch, b)  # noqa: E731
        else:
            batches = _sampler_batches(self.sampler, self.batch_size, self.drop_last)
            seed = self.seed
            rng_for = lambda b: np.random.default_rng([seed, epoch, b, 1])  # noqa: E731
        if not self._batcher.needs_rng:
            rng_for = lambda b: None  # noqa: E731  (a Generator per batch costs more than a tiny batch)
        batches = self.dataset._reading(batches)  # a remote dataset downloads the coming batches' shards ahead
        self._progress = (epoch, start)
        it = _FastIterator(self, epoch, start, batches, rng_for)
        if not self._on_device():
            self._batcher.apply_tensor_transforms = True
            return it
        # on the device: the host iterator runs ahead, so progress counts batches handed to the caller
        self._batcher.apply_tensor_transforms = False
        it.report_progress = False
        done = [start]

        def handed() -> None:
            done[0] += 1
            self._progress = (epoch, done[0])

        keys = {(f.name if self.dataset.as_dict else i): self.dataset.pipelines[f.name].tensor
                for i, f in enumerate(self.dataset.schema) if f.name in self.dataset.pipelines}
        return DevicePrefetcher(it, self.device, self.prefetch_factor or 2, keys, on_yield=handed)

    def _free_slot(self, reserved: set) -> Slot:
        """A slot no caller holds and no pending batch uses; the ring grows when there is none."""
        for s in self._slots:
            if id(s) not in reserved and not s.in_use():
                return s
        slot = self._batcher.new_slot()
        self._slots.append(slot)
        return slot

    def stats(self) -> dict:
        """Counters since the loader was made: batches, time the loop waited for data, time filling
        batches, queue depth, slots in the ring, skipped samples (see ``stats_summary()``)."""
        return self._stats.as_dict() | {
            "slots": len(self._slots), "slot_bytes": sum(s.nbytes for s in self._slots),
            "skipped": self._batcher.skipped if self._batcher else 0, "fast_path": self.fast_path,
            "fast_path_reason": self.fast_path_reason, "num_workers": self.num_workers,
            "remote": getattr(self.dataset, "remote_stats", lambda: None)()}

    def stats_summary(self) -> str:
        """One line: throughput, the share of time the loop waited for data, whether it is input-bound."""
        return self._stats.summary()


def _strided(why: str) -> str:
    warnings.warn(f"fastload: a remote dataset with world_size > 1 reads whole shards per rank by default "
                  f"(split='shards'), which cannot apply here ({why}): every rank reads every shard it needs "
                  f"(split='samples')", RuntimeWarning, stacklevel=4)
    return "samples"


def _first_dims(dataset: PackedDataset, field: str) -> np.ndarray:
    """Every sample's first dimension of a variable-shape field, from the shape columns (no blobs read)."""
    parts = []
    for seg in dataset._segments:
        seg.open()
        parts.append(seg.take(field, "shape", np.arange(seg.count))[:, 0])
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _sampler_batches(sampler, batch_size: int, drop_last: bool) -> Iterator[np.ndarray]:
    batch = []
    for i in sampler:
        batch.append(i)
        if len(batch) == batch_size:
            yield np.asarray(batch, dtype=np.int64)
            batch = []
    if batch and not drop_last:
        yield np.asarray(batch, dtype=np.int64)


class _Producer:
    """State shared by the iterator and its background thread (which must not own the iterator,
    so that dropping the iterator after ``break`` stops the thread)."""

    def __init__(self, depth: int):
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
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


class _FastIterator:
    def __init__(self, loader: DataLoader, epoch: int, start: int, batches: Iterator[np.ndarray], rng_for):
        self.loader = loader
        self.batcher = loader._batcher
        self.epoch = epoch
        self.done = start
        self.batches = batches
        self.rng_for = rng_for
        self.timeout = loader.timeout
        self.stats = loader._stats
        self.report_progress = True
        self.thread = None
        self.producer = None
        if loader.persistent_workers and loader._persistent_pool is not None:
            self.batcher._pool = loader._persistent_pool
        if loader.num_workers > 0:
            depth = loader.prefetch_factor or 2
            self.producer = _Producer(depth)
            self.thread = threading.Thread(target=_produce, name="fastload-batcher", daemon=True,
                                           args=(self.producer, loader, batches, start, rng_for))
            self.thread.start()

    def __iter__(self):
        return self

    def __next__(self):
        started = self.stats.begin_next()
        if self.producer is None:
            return self._next_sync(started)
        try:
            item = self.producer.queue.get(timeout=self.timeout if self.timeout > 0 else None)
        except queue.Empty:
            self.close()
            raise RuntimeError(f"DataLoader timed out after {self.timeout} seconds") from None
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        slot, n, objects = item
        out = self.batcher.collate(slot, n, objects)
        with self.producer.lock:
            self.producer.reserved.discard(id(slot))
        self.stats.end_next(started, n, self.producer.queue.qsize())
        return self._count(out)

    def _next_sync(self, started: float):
        try:
            idx = next(self.batches)
        except StopIteration:
            self.close()
            raise
        slot = self.loader._free_slot(set())
        t = time.perf_counter()
        objects = self.batcher.fill(slot, idx, self.rng_for(self.done))
        self.stats.add_fill(time.perf_counter() - t)
        out = self.batcher.collate(slot, len(idx), objects)
        self.stats.end_next(started, len(idx))
        return self._count(out)

    def _count(self, out):
        self.done += 1
        if self.report_progress:
            self.loader._progress = (self.epoch, self.done)
        return out

    def close(self) -> None:
        self.stats.end_epoch()
        if self.producer is not None:
            self.producer.stop.set()
            if self.thread is not None and self.thread is not threading.current_thread():
                self.thread.join()
            self.thread = None
        if self.loader.persistent_workers:
            self.loader._persistent_pool = self.batcher._pool
        else:
            self.batcher.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __len__(self) -> int:
        return len(self.loader)


def _produce(p: _Producer, loader: DataLoader, batches, start: int, rng_for) -> None:
    batcher = loader._batcher
    b = start
    try:
        for idx in batches:
            if p.stop.is_set():
                return
            with p.lock:
                slot = loader._free_slot(p.reserved)
                p.reserved.add(id(slot))
            t = time.perf_counter()
            objects = batcher.fill(slot, idx, rng_for(b))
            loader._stats.add_fill(time.perf_counter() - t)
            b += 1
            if not p.put((slot, len(idx), objects)):
                return
        p.put(_END)
    except BaseException as e:  # handed to the consumer, re-raised there
        p.put(e)
