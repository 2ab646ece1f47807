"""The fast path's chain: which order a dataset takes, and the stages wired from it to the loop.

    Jobs (order.py) -> [ReadAhead (readahead.py), remote datasets] -> Fill (fill.py) -> Produce (producer.py)
        -> Collate (collate.py) -> [DevicePrefetcher (_prefetch.py), device='cuda'] -> Count (position.py)

Each stage takes its upstream and explicit collaborators (the order, the dataset's read plan, the batcher and
its slot ring, the fill policy, the stats, the position), never the loader; ``DataLoader._start`` asks
``fast_iterator`` for the iteration and gets a ``FastIterator``.
"""

from __future__ import annotations

import warnings

from .._sequences import Bucket, PackSequences
from .order import Order
from .packing import BucketOrder, PackedOrder


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


def _strided(why: str) -> str:
    warnings.warn(f"fastload: a remote dataset with world_size > 1 reads whole shards per rank by default "
                  f"(split='shards'), which cannot apply here ({why}): every rank reads every shard it needs "
                  f"(split='samples')", RuntimeWarning, stacklevel=5)  # the line that made the loader
    return "samples"
