"""The fast path's chain: which order a dataset takes, and the stages wired from it to the loop.

    Jobs (order.py) -> [ReadAhead (readahead.py), remote datasets] -> Fill (fill.py) -> Produce (producer.py)
        -> Collate (collate.py) -> [DevicePrefetcher (device.py), device='cuda'] -> Count (position.py)

Each stage takes its upstream and explicit collaborators (the order, the dataset's read plan, the batcher and
its slot ring, the fill policy, the stats, the position), never the loader; ``DataLoader._start`` asks
``fast_iterator`` for the iteration and gets a ``FastIterator``.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

from torch.utils.data.dataloader import _BaseDataLoaderIter

from .device import DevicePrefetcher
from .._transforms.sequences import Bucket, PackSequences
from .collate import Collate, Collator
from .fill import Fill, Reservations
from .group import GroupFill, group_ring, group_size
from .mixing import MixOrder
from .order import Jobs, Order
from .packing import BucketOrder, PackedOrder
from .position import Count, Progress, in_own_process
from .producer import FillPolicy, Produce
from .readahead import ReadAhead
from .stage import innermost, shape


def order_for(
    dataset, batch_size: int, kind: str, seed: int, r: int, w: int, *, drop_last: bool, window: int, split: str | None
):
    """The Order for a fastload.Dataset: ``PackedOrder`` (PackSequences), ``BucketOrder`` (Bucket) or ``Order``;
    ``split`` None picks whole shards per rank for a remote dataset with world size > 1 (else samples)."""
    explicit = split is not None
    if split is None:
        split = "shards" if getattr(dataset, "remote", False) and w > 1 else "samples"
    shard_sizes = dataset.reader.sizes if kind == "quasi" or split == "shards" else None
    common = dict(kind=kind, seed=seed, rank=r, world_size=w, drop_last=drop_last, window=window)
    mixing = getattr(dataset, "mixing", None)  # fastload.mix: drawn by weight over several datasets (mixing.py)
    if mixing is not None:
        if split == "shards":
            if explicit:
                raise ValueError("split='shards' cannot apply to a mix: it draws samples across datasets by weight")
            split = _strided(_MIX_WHY)
        return MixOrder(mixing, batch_size, **common)
    bucketed = [(n, t) for n, t in dataset.sequences.items() if isinstance(t, Bucket)]
    packed = [(n, t) for n, t in dataset.sequences.items() if isinstance(t, PackSequences)]
    if (packed or bucketed) and split == "shards":
        if explicit:
            raise ValueError("split='shards' needs plain batches: Bucket and PackSequences form their own")
        split = _strided(_SEQUENCES_WHY)
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


def for_rank(order: Order, rank: int, world: int, remote_shards: Any = None) -> Order:
    """The same order (kind, seed, batching) for process ``rank`` of ``world``; ``order`` itself when it is
    that process's already. ``remote_shards``: the shard sizes of a remote dataset whose split was not given, so
    that its default (``order_for``: whole shards per rank on several ranks, else samples) follows ``world`` as it
    would for a loader built under it (accelerate retargets one built before the process group)."""
    if isinstance(order, PackedOrder):
        if (order.pack_rank, order.pack_world) == (rank, world):
            return order
        was = order.pack_world
    elif (order.rank, order.world_size) == (rank, world):
        return order
    else:
        was = order.world_size
    common = dict(
        kind=order.kind, seed=order.seed, rank=rank, world_size=world, drop_last=order.drop_last, window=order.window
    )
    if remote_shards is not None and world > 1 and was <= 1 and isinstance(order, (PackedOrder, BucketOrder)):
        _strided(_SEQUENCES_WHY)  # as order_for says it for a loader built on several ranks
    if isinstance(order, MixOrder):
        return MixOrder(order.mixing, order.batch_size, **common)
    if isinstance(order, PackedOrder):
        return PackedOrder(order.lengths, order.tokens_per_batch, **common)
    if isinstance(order, BucketOrder):
        return BucketOrder(order.bucket_ids, order.batch_size, **common)
    split, sizes = order.split, order.shard_sizes
    if remote_shards is not None:
        split, sizes = ("shards" if world > 1 else "samples"), remote_shards
    shards = sizes if order.kind == "quasi" or split == "shards" else None
    try:
        return Order(order.num_samples, order.batch_size, shard_sizes=shards, split=split, **common)
    except ValueError as e:
        if remote_shards is None or split != "shards":
            raise
        split = _strided(str(e))
        return Order(order.num_samples, order.batch_size, shard_sizes=shards, split=split, **common)


_MIX_WHY = "a mix draws its samples across datasets by weight"
_SEQUENCES_WHY = "Bucket and PackSequences form their own batches"


def _strided(why: str) -> str:
    warnings.warn(
        f"fastload: a remote dataset with world_size > 1 reads whole shards per rank by default "
        f"(split='shards'), which cannot apply here ({why}): every rank reads every shard it needs "
        f"(split='samples')",
        RuntimeWarning,
        stacklevel=5,
    )  # the line that made the loader (or, through accelerate's prepare, retargeted it)
    return "samples"


SUPERSEDED = (
    "fastload: this iterator of the DataLoader was stopped when a newer iter(loader) of the same loader "
    "started: a loader runs one iteration at a time (its slots, plans and decoders are shared). Iterate "
    "the newer iterator, or use two loaders"
)
RELOADED = (
    "fastload: this iterator of the DataLoader was stopped when load_state_dict() was called on its loader: that "
    "replaces the position and seed the iteration reads, so it could only go on with batches of neither. Call "
    "iter(loader) for an iteration from the loaded position"
)


class FastIterator(
    Count, _BaseDataLoaderIter
):  # a torch DataLoader iterator by type (Lightning checks); no base __init__
    """One iteration of the fast path: the chain's last stage (``Count``), plus what an iterator the loop
    holds must do: its length, and stopping the producer thread when the epoch ends or it is dropped.

    Threads: every ``next()`` runs under ``guard``, the loader's lock (``Count``), which also covers starting
    an iteration (``DataLoader._start``, which may ``supersede`` this one) and ``state_dict``: the chain of one
    iteration is never run by two threads at once (one iterator shared by threads hands each batch to one of
    them, whole), no new iteration touches the loader's slots, plans and decoders while a ``next()`` of this one
    is in flight, and a stopped iteration's ``next()`` never reaches the chain again. ``owner`` is the thread
    that started it: ``DataLoader`` refuses a new iteration from another thread while this one runs.

    Fork: an iteration belongs to the process that started it (its producer thread and queued batches stay
    there). In a forked child it is not running, its ``next()`` raises saying so (instead of waiting forever for
    a thread that is not there), and closing or collecting it there touches nothing."""

    def __init__(self, source: Any, progress: Progress, producer: Produce, length: int, guard: Any = None):
        Count.__init__(self, source, progress, guard)
        self.producer, self.length = producer, length
        self.owner = threading.current_thread()

    @property
    def running(self) -> bool:
        """Started in this process, and neither run out, closed nor stopped: it still hands out batches."""
        return not self.ended and self.stopped is None and in_own_process(self)

    def __len__(self) -> int:
        return self.length

    def supersede(self, why: str = SUPERSEDED) -> None:
        """A newer iteration of the same loader starts, or a state is loaded into it (``why``: ``RELOADED``; called
        under ``guard``): stop this one (its producer and what it holds). Its ``next()`` then raises ``why``,
        unless it had run out already (StopIteration, as before)."""
        if not self.ended:
            self.stopped = why
        self._close()

    def close(self) -> None:
        """Stop the producer thread; ``next()`` raises StopIteration from now on. From another thread, after the
        ``next()`` in flight there (if any) has returned: it may be filling with the decoders this releases."""
        with self.guard:
            self._close()

    def _close(self) -> None:
        self.ended = True
        if in_own_process(self):  # a forked child's copy: the thread and the epoch are the parent's
            self.producer.close()

    def __del__(self):
        # not under ``guard``: the collector runs this in whichever thread it runs (a producer thread too, which
        # must not wait for the loop's next()), and an iterator being collected has no next() in flight
        try:
            self._close()
        except Exception:
            pass


def replaceable(live: FastIterator | None, what: str) -> FastIterator | None:
    """``live``, the loader's latest iteration, if it still runs and the calling thread may stop it for ``what``
    (a new iteration, a loaded state): it runs in this thread, or in one that has ended. None when nothing runs.
    A RuntimeError naming the fix when it runs in another thread that is alive (``DataLoader``'s docstring)."""
    if live is None or not live.running:
        return None
    owner, me = live.owner, threading.current_thread()
    if owner is me or not owner.is_alive():
        return live
    raise RuntimeError(
        f"fastload: {what} in thread {me.name!r} while an iteration of this DataLoader runs in thread "
        f"{owner.name!r}: on the fast path a loader runs one iteration at a time (its batch buffers, "
        f"plans and decoders are shared), so two threads cannot iterate it at once. Give each thread "
        f"its own loader, e.g. fastload.DataLoader(dataset, ...) made in that thread (one dataset can "
        f"serve several loaders), or end the other iteration first (let it run out, or call close() on "
        f"its iterator)"
    )


def fast_iterator(
    *,
    plan: Any,
    epoch: int,
    start: int,
    batcher: Any,
    slots: Any,
    progress: Progress,
    policy: FillPolicy,
    stats: Any,
    length: int,
    num_workers: int,
    depth: int,
    timeout: float,
    persistent: bool,
    reading: Any = None,
    image_keys: list | None = None,
    device: Any = None,
    guard: Any = None,
    collator: Collator | None = None,
    state: dict | None = None,
) -> FastIterator:
    """The iteration over epoch ``epoch`` from batch ``start``, every stage given what it uses; it creates the
    stages and changes none of the objects it is given (the loader sets them up where it makes them: the host
    ring's bound under a device prefetcher, the batcher's device and per-sample transform workers,
    ``Batcher.begin_iteration``).

    ``plan``: the ``Order`` (or ``_sampling.SamplerOrder``); ``slots``: the host ``SlotRing``; ``reading``:
    a remote dataset's read plan (None: local); ``image_keys``: image entries to hand out in torch's
    contiguous layout (``memory_format``); ``device``: ``(ring, transforms)`` of the device prefetcher for
    ``device='cuda'`` (there ToDtype/Normalize and the contiguous copy run on the device); ``guard``: the loader's
    lock that every ``next()`` holds (``FastIterator``; None: one of the iteration's own); ``collator``: the
    ``Collator`` of ``batcher``'s slots, which the loader keeps with its slots, so that its CPU output buffers are
    made once, not every epoch (None: a new one). ``state``: a chain's nested state (``FastIterator.state()``,
    saved mid-epoch) to reset every stage from, each from its part; it must be at ``(epoch, start)``."""
    source: Any = Jobs(plan, epoch, start, batcher.needs_rng)
    if reading is not None:
        source = ReadAhead(source, reading)
    reserved = Reservations()
    group = group_size(batcher, remote=reading is not None, device=device is not None)
    if group > 1:  # cheap batches: several per fill (group.py)
        source = GroupFill(
            source, batcher, batcher.pool, group_ring(slots, batcher, group), reserved, policy.fills, group
        )
    else:
        source = Fill(source, batcher, batcher.pool, slots, reserved, policy.fills)
    # GPU decoders: always in a producer thread, even at num_workers=0 (long host work per batch; the rows
    # are handed on with an event, so no thread waits for the GPU)
    gpu_rows = batcher.images.device is not None
    producer = source = Produce(
        source,
        policy,
        stats,
        threads=num_workers > 0 or gpu_rows,
        always=gpu_rows,
        depth=depth,
        timeout=timeout,
        on_close=None if persistent else batcher.end_epoch,
        release=reserved.release,
    )
    on_device = device is not None
    source = Collate(
        source,
        collator if collator is not None else Collator.for_batcher(batcher),
        reserved,
        stats,
        policy.steps,
        tensor_transforms=not on_device,
        contiguous=None if on_device else image_keys,
    )
    if on_device:
        ring, transforms = device
        source = DevicePrefetcher(
            source,
            depth=depth,
            transforms=transforms,
            ring=ring,
            contiguous=image_keys if batcher.packed is None else (),
        )
    it = FastIterator(source, progress, producer, length, guard)
    if state is not None:
        at = innermost(state)
        if at != {"epoch": epoch, "batch": start}:
            raise ValueError(f"fastload: a chain state at {at} given to the chain of epoch {epoch} from batch {start}")
        # saved by a chain of other stages (another device, a remote copy): its position alone, where this chain
        # was built, says the same; else every stage resets from its own part
        if shape(state) == shape(it.state()):
            it.reset(state)
    return it
