"""The fast path's chain: which order a dataset takes, and the stages wired from it to the loop.

    Jobs (order.py) -> [ReadAhead (readahead.py), remote datasets] -> Fill (fill.py) -> Produce (producer.py)
        -> Collate (collate.py) -> [DevicePrefetcher (device.py), device='cuda'] -> Count (position.py)

Each stage takes its upstream and explicit collaborators (the order, the dataset's read plan, the batcher and
its slot ring, the fill policy, the stats, the position), never the loader; ``DataLoader._start`` asks
``fast_iterator`` for the iteration and gets a ``FastIterator``.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch.utils.data.dataloader import _BaseDataLoaderIter

from .device import DevicePrefetcher
from .._sequences import Bucket, PackSequences
from ..fields.image import ImagePart
from .collate import Collate, Collator
from .fill import Fill, Reservations, host_limit
from .order import Jobs, Order
from .packing import BucketOrder, PackedOrder
from .position import Count, Progress
from .producer import FillPolicy, Produce
from .readahead import ReadAhead


def order_for(dataset, batch_size: int, kind: str, seed: int, r: int, w: int, *, drop_last: bool, window: int,
              split: str | None):
    """The Order for a fastload.Dataset: ``PackedOrder`` (PackSequences), ``BucketOrder`` (Bucket) or ``Order``;
    ``split`` None picks whole shards per rank for a remote dataset with world size > 1 (else samples)."""
    explicit = split is not None
    if split is None:
        split = "shards" if getattr(dataset, "remote", False) and w > 1 else "samples"
    shard_sizes = dataset.reader.sizes if kind == "quasi" or split == "shards" else None
    common = dict(kind=kind, seed=seed, rank=r, world_size=w, drop_last=drop_last, window=window)
    bucketed = [(n, t) for n, t in dataset.sequences.items() if isinstance(t, Bucket)]
    packed = [(n, t) for n, t in dataset.sequences.items() if isinstance(t, PackSequences)]
    if (packed or bucketed) and split == "shards":
        if explicit:
            raise ValueError("split='shards' needs plain batches: Bucket and PackSequences form their own")
        split = _strided("Bucket and PackSequences form their own batches")
    if packed:
        name, spec = packed[0]
        return PackedOrder(dataset.reader.first_dims(name), batch_size * spec.row_length, **common)
    if bucketed:
        name, spec = bucketed[0]
        lengths = dataset.reader.first_dims(name)
        spec.check_all(lengths, name)  # a local dataset checked them at open; a remote one only has them now
        return BucketOrder(spec.bucket_ids(lengths), batch_size, **common)
    try:
        return Order(len(dataset), batch_size, shard_sizes=shard_sizes, split=split, **common)
    except ValueError as e:
        if explicit or split != "shards":
            raise
        return Order(len(dataset), batch_size, shard_sizes=shard_sizes, split=_strided(str(e)), **common)


def for_rank(order: Order, rank: int, world: int) -> Order:
    """The same order (kind, seed, batching) for process ``rank`` of ``world``; ``order`` itself when it is
    that process's already."""
    if isinstance(order, PackedOrder):
        if (order.pack_rank, order.pack_world) == (rank, world):
            return order
    elif (order.rank, order.world_size) == (rank, world):
        return order
    common = dict(kind=order.kind, seed=order.seed, rank=rank, world_size=world, drop_last=order.drop_last,
                  window=order.window)
    if isinstance(order, PackedOrder):
        return PackedOrder(order.lengths, order.tokens_per_batch, **common)
    if isinstance(order, BucketOrder):
        return BucketOrder(order.bucket_ids, order.batch_size, **common)
    shards = order.shard_sizes if order.kind == "quasi" else None
    return Order(order.num_samples, order.batch_size, shard_sizes=shards, **common)


def _strided(why: str) -> str:
    warnings.warn(f"fastload: a remote dataset with world_size > 1 reads whole shards per rank by default "
                  f"(split='shards'), which cannot apply here ({why}): every rank reads every shard it needs "
                  f"(split='samples')", RuntimeWarning, stacklevel=5)  # the line that made the loader
    return "samples"


class _Superseded:
    """What a superseded iteration's last stage reads from instead of its stopped producer."""

    def __next__(self):
        raise RuntimeError("fastload: this iterator of the DataLoader was stopped when a newer iter(loader) of the "
                           "same loader started: a loader runs one iteration at a time (its slots, plans and "
                           "decoders are shared). Iterate the newer iterator, or use two loaders")


class FastIterator(Count, _BaseDataLoaderIter):  # a torch DataLoader iterator by type (Lightning checks); no base __init__
    """One iteration of the fast path: the chain's last stage (``Count``), plus what an iterator the loop
    holds must do: its length, and stopping the producer thread when the epoch ends or it is dropped."""

    def __init__(self, source: Any, progress: Progress, producer: Produce, length: int):
        Count.__init__(self, source, progress)
        self.producer, self.length = producer, length

    def __len__(self) -> int:
        return self.length

    def supersede(self) -> None:
        """A newer iteration of the same loader starts: stop this one (its producer and what it holds). Its
        ``next()`` then raises, saying why, unless it had run out already (the producer closes at the epoch's
        end: StopIteration, as before)."""
        if not self.producer.closed:
            self.source = _Superseded()
        self.close()

    def close(self) -> None:
        self.producer.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def fast_iterator(*, plan: Any, epoch: int, start: int, batcher: Any, slots: Any, progress: Progress,
                  policy: FillPolicy, stats: Any, length: int, num_workers: int, depth: int, timeout: float,
                  persistent: bool, reading: Any = None, image_keys: list | None = None,
                  device: Any = None) -> FastIterator:
    """The iteration over epoch ``epoch`` from batch ``start``, every stage given what it uses.

    ``plan``: the ``Order`` (or ``_sampling.SamplerOrder``); ``slots``: the host ``SlotRing``; ``reading``:
    a remote dataset's read plan (None: local); ``image_keys``: image entries to hand out in torch's
    contiguous layout (``memory_format``); ``device``: ``(ring, transforms)`` of the device prefetcher for
    ``device='cuda'`` (there ToDtype/Normalize and the contiguous copy run on the device)."""
    source: Any = Jobs(plan, epoch, start, batcher.needs_rng)
    if reading is not None:
        source = ReadAhead(source, reading)
    reserved = Reservations()
    batcher.images.bind_device()
    source = Fill(source, batcher, batcher.pool, slots, reserved, policy.fills)
    # per-sample transform workers: forked here, in the caller's thread, before the producer thread runs
    images = {p.name: p.pipeline for p in batcher.parts if isinstance(p, ImagePart)}
    batcher.images.start_fallbacks(batcher.pool, images)
    # GPU decoders: always in a producer thread, even at num_workers=0 (long host work per batch; the rows
    # are handed on with an event, so no thread waits for the GPU)
    gpu_rows = batcher.images.device is not None
    producer = source = Produce(source, policy, stats, threads=num_workers > 0 or gpu_rows, always=gpu_rows,
                                depth=depth, timeout=timeout, on_close=None if persistent else batcher.end_epoch,
                                release=reserved.release)
    on_device = device is not None
    # a device prefetcher keeps each host batch until its copy ran: bound the host ring by those copies
    slots.pending, slots.limit = (device[0].holds, host_limit(depth)) if on_device else (None, None)
    source = Collate(source, Collator.for_batcher(batcher), reserved, stats, policy.steps,
                     tensor_transforms=not on_device, contiguous=None if on_device else image_keys)
    if on_device:
        ring, transforms = device
        source = DevicePrefetcher(source, depth=depth, transforms=transforms, ring=ring,
                                  contiguous=image_keys if batcher.packed is None else ())
    return FastIterator(source, progress, producer, length)
