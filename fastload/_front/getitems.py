"""``Dataset.__getitems__``: one native batch decode for the samples torch's own DataLoader asks for.

torch's map-style fetcher calls ``dataset.__getitems__(indices)`` with one batch's indices when the dataset
defines it, then ``collate_fn`` on the list it returns. So torch's DataLoader, accelerate's DataLoaderShard,
Hugging Face's Trainer, Ray Train -- anything that rebuilds a loader around a fastload dataset -- decodes
through the fast path's ``Batcher.fill`` (one native call, GIL released) in its workers, instead of one
``ds[i]`` at a time.

What it returns is what ``[ds[i] for i in indices]`` returns: one item per index, each with ds[i]'s types,
shapes and dtypes (images CHW uint8 views, or ToDtype/Normalize's result; ints as int, floats as float,
ndarrays as tensors, Pad/Bucket fields as ``(padded, length)``). Items are views of one batch slot; the
slot comes from a ``SlotRing`` and is refilled only once no item of it is alive (``_ring.py``'s rule 1),
so the next call never overwrites a batch the caller (usually ``default_collate``, which copies) still holds.

Randomness. Each sample's draws (crop, flip, augmentation) are keyed by (seed, epoch, sample index), as on
fastload's own loader (``_draws.py``). The seed is the base seed torch's DataLoader draws once per iterator
from its ``generator`` (or torch's global generator): a worker knows it as ``get_worker_info().seed - id``, the
main process (``num_workers=0``) reads it from the iterator calling torch's fetcher. The epoch is 0, since every
epoch is a new iterator with a new seed -- except in a persistent worker, which keeps the first iterator's seed
and counts the epochs itself (torch gives it a new fetcher at each). It can count only the epochs it was handed a
batch in (torch tells a worker of a new epoch nothing else it could count): a persistent worker left without one in
some epoch (an epoch of fewer batches than ``num_workers``, in a run whose epochs vary in length) counts behind the
others by the epochs it missed from then on, and the samples it reads repeat the draws an earlier epoch gave them
(a known limit, tests/test_getitems_collate.py). So a sample gets the same pixels whichever worker, batch, batch
size or path (the shared-memory pool, plain rows for a user's ``collate_fn``, the pool
left after a worker's check) it goes through, at any ``num_workers``; ``torch.manual_seed`` (or ``generator=``)
before building the iterator makes a run repeat; ``fastload.DataLoader(ds, seed=that base seed)`` gives it the
same pixels in its epoch 0. A sample read again in one epoch (a sampler with replacement, repeated augmentation)
gets new draws, keyed by its occurrence as far as a process can count it: its earlier reads in this worker's
batches of the epoch, plus the rank under torch.distributed (rank 0's first reads keep the key above). What that
gives up: two reads of one sample that land in different workers of one rank are each a first read there and
draw alike (timm's RepeatAugSampler puts a sample's copies on different ranks, or next to each other in a rank's
sequence: in one batch but where they straddle a batch boundary), and a repeat's draws depend on which worker
read it. Called other than by torch's fetcher (``ds.__getitems__(idx)`` directly), the seed is one draw of torch's
generator per call. A dataset that cannot batch (the fallback to ``ds[i]``'s
reads below) plans each sample from the same keyed draws, so its pixels are the batch path's. ``ds[i]`` itself
keeps torchvision's habit (one draw of torch's generator per sample): its crops differ from these.

Rows own their storage objects. The rows' tensors view the slot through storage objects of their own
(``_own_storages``): torch's pickling of a tensor (a worker's queue) moves its storage to shared memory, and a
row's move must never move the slot's buffers under the native writers' numpy views (it did: a ``collate_fn``
returning the rows' tensors had the next batch written into freed heap memory).

Threads. The native pool has ``torch.get_num_threads()`` threads (0, the calling thread, when that is 1):
in a DataLoader worker torch sets it to 1, since the workers already decode batches in parallel and more
threads per worker would oversubscribe the cores; in the main process it is torch's intra-op budget
(``torch.set_num_threads``, ``OMP_NUM_THREADS``; torchrun sets 1 per rank). The state (pool, slots, lock)
belongs to the process that made it: a forked worker makes its own on its first call and never touches the
parent's (whose pool threads do not exist in the child; slots are never pinned, so nothing of the driver's
is freed in a child).

Falls back to ``[ds[i] for i in indices]`` where a batch cannot be decoded in one call: ``decode=False``
(nothing to decode), ``PackSequences`` (a lone sample is not packed), and, with one warning saying why,
images of no fixed output size or variable-shape arrays with no Pad/Bucket (they cannot share a slot).
Bad indices and bad samples raise exactly what ``ds[i]`` raises, naming the sample.

torch's internals. What a call learns of its caller comes from torch's private ``_MapDatasetFetcher.fetch`` frame
above it (and, in the main process, the iterator's ``_base_seed``): checked once at import (``_fetch_code``), and
where a worker holding this dataset finds no such frame, ``__getitems__`` says once per process why
(``degraded``) and goes on as a direct call would -- correct batches, without the keyed epochs and the pool.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
import weakref
from typing import Any, NamedTuple

import numpy as np
import torch

from .._draws import BatchDraws, ReadCounts, SampleDraws
from .._fill.batcher import Batcher
from ..fields import NotFastPath
from .._errors import FastloadError, FastPathWarning
from .getitems_shm import POOLED_COLLATES, SharedBatches, items as shared_items
from .._ring import SlotRing
from .._transforms.sequences import PackSequences
from ..fast.collate import Collator


_CALLER_DEPTH = 6  # frames searched above ds.__getitems__ (Subset and the like add one each)


def _fetch_code() -> tuple[Any, str | None]:
    """The code of torch's ``_MapDatasetFetcher.fetch`` (which calls ``dataset.__getitems__(index)``, then
    ``collate_fn``), as ``_torch_caller`` looks for it among the frames above a call; or None and why not: torch's
    private internals are not what this module was written against."""
    version = f"torch {torch.__version__}"
    try:
        from torch.utils.data._utils.fetch import _MapDatasetFetcher
    except ImportError as e:
        return None, f"{version} has no torch.utils.data._utils.fetch._MapDatasetFetcher ({e})"
    code = getattr(getattr(_MapDatasetFetcher, "fetch", None), "__code__", None)
    if code is None:
        return None, f"{version}'s _MapDatasetFetcher.fetch is not a plain Python function"
    if "__getitems__" not in code.co_names:
        return None, f"{version}'s _MapDatasetFetcher.fetch does not call dataset.__getitems__ itself"
    return code, None


def _iterator_type() -> type | None:
    """torch's ``_BaseDataLoaderIter`` (the caller of the fetcher in the main process, holding the base seed)."""
    try:
        from torch.utils.data.dataloader import _BaseDataLoaderIter
    except ImportError:
        return None
    return _BaseDataLoaderIter


_FETCH_CODE, _FETCH_PROBLEM = _fetch_code()
_ITERATOR = _iterator_type()
_SAID: set[str] = set()  # the reasons degraded() gave in this process (a forked worker inherits its parent's)


def degraded(reason: str) -> None:
    """Says once per process (and not again in a worker forked after it was said) that ``__getitems__`` cannot
    tell which torch loader calls it, why, and what that costs."""
    if reason in _SAID:
        return
    _SAID.add(reason)
    warnings.warn(
        f"fastload.Dataset.__getitems__ cannot find the torch DataLoader calling it: {reason}. Its batches are "
        "still ds[i]'s, but rows go to collate_fn as plain tensors (not the workers' shared-memory pool), a "
        "persistent worker does not count its epochs (a sample's random draws repeat each epoch), repeated "
        "reads of a sample in an epoch draw alike, and with num_workers=0 each batch draws its own seed (a run "
        "does not repeat under torch.manual_seed). fastload.DataLoader does not depend on torch's internals.",
        FastPathWarning,
        stacklevel=5,
    )


_INHERITED: list = []  # in a forked child: batchers made by the parent, kept here for good (BatchItems.__del__)


class BatchItems:
    """One process's state for one dataset: a Batcher sized for the largest batch asked for, its slots, a lock.

    ``reason`` says why the dataset has no batch path (None when it has one, or "" when that needs no
    warning). The batcher sees the dataset through a weak proxy: the dataset holds this state, so a strong
    reference back would make a cycle, and a cycle's slots live until the garbage collector runs -- possibly
    in a forked worker (see ``__del__``)."""

    def __init__(self, ds: Any, quiet: bool = False):
        ds = self.ds = weakref.proxy(ds)
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.batcher: Batcher | None = None
        self.ring: SlotRing | None = None
        self.reason: str | None = None
        self.probe = False  # the batcher only showed that the dataset batches: the first call makes the real one
        # the torch fetcher of the latest call (a weak reference) and the epochs seen: a persistent worker gets a
        # new fetcher at every epoch, and keeps its seed
        self.fetcher: Any = None
        self.epoch = 0
        # frames from ds.__getitems__'s caller up to torch's fetcher when last found (tried first), and
        # (a weak reference to that fetcher, its collate_fn, the main process's iterator seed): _torch_caller
        self.depth: int | None = None
        self.caller: tuple | None = None
        # occurrences: for each torch fetcher alive (an iterator's: in the main process a training and an evaluation
        # iterator over this dataset may take turns), (each sample's reads under it in this process, about one byte
        # per sample of the dataset: _draws.ReadCounts; the rank word)
        self.counted: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # in a torch DataLoader worker: the pool batches are collated into (_getitems_shm), None elsewhere
        self.shared: SharedBatches | None = SharedBatches() if torch.utils.data.get_worker_info() else None
        if not ds.decode or any(isinstance(t, PackSequences) for t in ds.sequences.values()):
            self.reason = ""
        else:
            try:
                self._make(ds, 1, threads=0)  # a probe: no pool threads until a real batch asks for a size
                self.probe = True
            except NotFastPath as e:
                self.reason = str(e)
                if quiet:
                    return
                warnings.warn(
                    f"fastload.Dataset.__getitems__ decodes '{ds.path}' sample by sample (as ds[i] "
                    f"does), not in one native batch call: {e}",
                    FastPathWarning,
                    stacklevel=5,
                )

    def _make(self, ds: Any, size: int, threads: int | None = None) -> None:
        if threads is None:
            threads = torch.get_num_threads()
        self.batcher = Batcher(ds, size, threads if threads > 1 else 0)
        self.batcher.images.fallback_processes = False  # per-sample transforms here: in the caller's process
        self.ring = SlotRing(functools.partial(self.batcher.new_slot, pin=False))
        self.collator = Collator.for_batcher(self.batcher)

    def batcher_for(self, size: int) -> Batcher:
        if self.probe or size > self.batcher.batch_size:
            # the probe's, or slots too small: a new batcher (and ring) of this size, with torch's threads
            self.probe = False
            self._make(self.batcher.ds, size)
        return self.batcher

    def epoch_of(self, fetcher: Any) -> int:
        """The epoch of a call from torch's ``fetcher`` in this process: 0 at its first fetcher, one more at each
        new one (a persistent worker's next epoch). Not called by a fetcher: 0."""
        if fetcher is None or torch.utils.data.get_worker_info() is None:
            return 0
        if self.fetcher is not None and self.fetcher() is not fetcher:
            self.epoch += 1
        self.fetcher = weakref.ref(fetcher)
        return self.epoch

    def occurrences(self, fetcher: Any, idx: np.ndarray) -> np.ndarray | None:
        """The occurrence words of batch ``idx`` (``_draws.py``; None: all 0): how often this process read each
        sample before under this fetcher (one epoch of one iterator; a worker sees only its own batches), plus
        the rank under torch.distributed."""
        counted = self.counted.get(fetcher)
        if counted is None:
            counted = self.counted[fetcher] = (ReadCounts(len(self.ds)), _rank_word())
        counts, rank_word = counted
        occ = counts.read(idx) + np.uint64(rank_word)
        return occ if occ.any() else None

    def __del__(self) -> None:
        # A forked child must never destroy its parent's native pool: the pool's threads do not exist
        # here, and the pool's destructor detaches them all the same, which aborted torch workers
        # ("std::system_error: Invalid argument", once the worker had started threads of its own: glibc
        # reuses the dead threads' descriptors). Kept, the pool is a few idle bytes.
        if self.pid != os.getpid() and self.batcher is not None:
            _INHERITED.append(self.batcher)


def _state(ds: Any) -> BatchItems:
    state = ds.batch_items
    if state is None or state.pid != os.getpid():  # a forked child never uses its parent's pool or slots
        # a parent that already knew the reason said it (or had none to say): its workers stay quiet
        state = ds.batch_items = BatchItems(ds, quiet=state is not None and state.reason is not None)
    return state


def batch_decodable(ds: Any) -> bool:
    """Whether ``__getitems__`` decodes ``ds``'s batches in one native call. A caller that asks has taken on
    saying why not (``fastload.DataLoader``'s FastPathWarning): ``__getitems__`` in this process, and in the
    workers forked from it, does not say it again."""
    state = ds.batch_items
    if state is None or state.pid != os.getpid():
        state = ds.batch_items = BatchItems(ds, quiet=True)
    return state.reason is None


def _plain_indices(ds: Any, items: list) -> np.ndarray | None:
    """``items`` as int64 in [0, len), negative ones wrapped as ds[i] does; None if any is not a plain
    in-range integer (the caller then takes ds[i]'s path, which raises ds[i]'s own error for it)."""
    if not all(isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_)) for i in items):
        return None
    idx = np.array(items, dtype=np.int64) if items else np.empty(0, np.int64)
    n = len(ds)
    idx = np.where(idx < 0, idx + n, idx)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        return None
    return idx


def get_items(ds: Any, indices: Any) -> list:
    """``[ds[i] for i in indices]``, decoded as one batch (see the module docstring)."""
    items = indices.tolist() if isinstance(indices, (torch.Tensor, np.ndarray)) else list(indices)
    idx = _plain_indices(ds, items)
    if idx is None:
        return [ds[i] for i in items]
    if not idx.size:
        return []
    state = _state(ds)
    caller = _torch_caller(state, ds)
    if state.reason is not None:
        if not ds.pipelines or caller.fetcher is None:
            return [ds[int(i)] for i in idx]
        with state.lock:
            draws = _draws(state, caller, idx)
        occ = draws.occurrences
        return [  # keyed per sample as the batch path's
            ds.read_sample(int(i), SampleDraws(draws.seed, draws.epoch, [i], None if occ is None else occ[k : k + 1]))
            for k, i in enumerate(idx)
        ]
    with state.lock:
        batcher = state.batcher_for(len(idx))
        slot = state.ring.acquire()
        rng = _draws(state, caller, idx) if batcher.needs_rng else None
        try:
            objects = batcher.fill(slot, idx, rng)
            batch = state.collator.collate(slot, len(idx), objects)
        except (FastloadError, ValueError) as e:
            failed = e
        else:
            rows = _split(ds, batcher.parts, _own_storages(batch, {}), len(idx))
            # by identity: a collate_fn may be unhashable (a dataclass collator, as Hugging Face's)
            pooled = state.shared is not None and any(caller.collate_fn is f for f in POOLED_COLLATES)
            return shared_items(state, batch, rows, ds.as_dict) if pooled else rows
    for i in idx:  # ds[i] names the bad sample (and its error has no loader-only hint)
        ds[int(i)]
    raise failed


class _Caller(NamedTuple):
    """What ``__getitems__`` learns of the torch loader calling it: the ``collate_fn`` its rows go to, the fetcher
    (None for both: not called by torch's fetcher), and the iterator's base seed (None: unknown)."""

    collate_fn: Any
    fetcher: Any
    base_seed: int | None


def _torch_caller(state: BatchItems, ds: Any) -> _Caller:
    """The torch ``_MapDatasetFetcher.fetch`` frame above this call, if any (through wrappers such as ``Subset``,
    whose ``__getitems__`` calls this one's): its fetcher and ``collate_fn``, and the base seed torch drew for the
    iterator (from the loader's ``generator``, or torch's global one, once per iterator). A worker has it as
    ``get_worker_info().seed - id``; the main process (``num_workers=0``) from the iterator calling the fetcher.

    ``state`` caches how many frames up the fetcher was found (tried first: one look instead of a walk) and what
    was learnt of the latest fetcher (its ``collate_fn``; in the main process the iterator's seed). Where torch's
    internals are not what this expects, it says why once (``degraded``) and goes on as if not called by torch."""
    info = torch.utils.data.get_worker_info()
    if _FETCH_CODE is None:
        degraded(str(_FETCH_PROBLEM))
        return _Caller(None, None, None)
    frame: Any = None
    try:
        if state.depth is not None:
            try:
                frame = sys._getframe(2 + state.depth)
            except ValueError:  # the stack is shallower than last time
                frame = None
            if frame is not None and frame.f_code is not _FETCH_CODE:
                frame = None
        if frame is None:
            frame, depth = sys._getframe(2), 0
            while frame is not None and frame.f_code is not _FETCH_CODE:
                depth += 1
                frame = frame.f_back if depth < _CALLER_DEPTH else None
            if frame is not None:
                state.depth = depth
        if frame is None:
            if info is not None and info.dataset is ds:  # torch's worker holds this very dataset: its fetcher calls
                degraded(
                    f"a DataLoader worker called it with no frame of torch's _MapDatasetFetcher.fetch within "
                    f"{_CALLER_DEPTH} frames above (torch {torch.__version__}'s internals differ)"
                )
            return _Caller(None, None, None)
        fetcher = frame.f_locals.get("self")
        it = frame.f_back.f_locals.get("self") if frame.f_back is not None and info is None else None
    finally:
        del frame
    cached = state.caller
    if cached is not None and cached[0]() is fetcher:
        _, collate_fn, base_seed = cached
    else:
        if not hasattr(fetcher, "collate_fn"):
            degraded(f"torch {torch.__version__}'s fetcher {type(fetcher).__name__} has no collate_fn")
            fetcher = None
        collate_fn, base_seed = getattr(fetcher, "collate_fn", None), None
        if it is not None and _ITERATOR is None:
            degraded(f"torch {torch.__version__} has no torch.utils.data.dataloader._BaseDataLoaderIter")
        elif it is not None and isinstance(it, _ITERATOR):
            base_seed = getattr(it, "_base_seed", None)
            if base_seed is None:
                degraded(f"torch {torch.__version__}'s DataLoader iterator has no _base_seed")
        if fetcher is not None:
            state.caller = (weakref.ref(fetcher), collate_fn, base_seed)
    if info is not None and fetcher is not None:  # not called by the fetcher: no iterator's seed (one draw per call)
        base_seed = int(info.seed) - int(info.id)
    return _Caller(collate_fn, fetcher, base_seed)


def _draws(state: BatchItems, caller: _Caller, idx: np.ndarray) -> BatchDraws:
    """The batch's draws: each sample's keyed by (seed, epoch, index, occurrence) (``_draws.py``), with seed the
    torch iterator's base seed and epoch 0 -- but in a persistent worker, which keeps its seed from the first
    iterator, the epochs that worker has seen: torch makes it a new fetcher at every epoch (``_ResumeIteration``).
    The occurrence is what this process can count: the sample's reads in this fetcher's earlier batches and this
    one, plus the rank (``_rank_word``). Called other than by torch's fetcher, the seed is one draw of torch's
    generator per call (and nothing is counted)."""
    seed = caller.base_seed
    if seed is None:
        seed = int(torch.randint(0, 2**62, ()).item())
    seed &= 2**64 - 1
    epoch = state.epoch_of(caller.fetcher)
    occ = state.occurrences(caller.fetcher, idx) if caller.fetcher is not None else None
    return BatchDraws([seed & 0xFFFFFFFF, seed >> 32], seed, epoch, occ)


def _rank_word() -> int:
    """``rank * 2**32`` under torch.distributed with more than one rank (read in a worker too: a forked worker
    inherits the process group; a spawned one has torchrun's ``RANK``/``WORLD_SIZE``), else 0."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() << 32 if dist.get_world_size() > 1 else 0
    try:
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0
    return rank << 32 if world > 1 and rank > 0 else 0


def _own_storages(obj: Any, aliases: dict) -> Any:
    """``obj`` (a collated batch: dicts, lists, tuples of tensors) with every tensor re-made as the same view of
    the same memory through a storage object of its own, one per buffer, that keeps the buffer referenced.

    The rows are cut from these, never from the slot's (or the CPU output ring's) own storages, because torch's
    pickling of a CPU tensor (a worker's queue, ``multiprocessing``) calls ``share_memory_()`` on its storage: that
    copies the storage into new shared memory, points the storage at the copy and frees the old memory -- which
    the slot's numpy arrays, what the native fill writes into, still pointed at. A ``collate_fn`` returning the
    rows' tensors (``[dict(r) for r in rows]``) thus had the next batch written into freed heap memory
    ("corrupted size vs. prev_size", a worker killed), and the main process received the slot itself. Moved
    now, a row's storage leaves the slot where it was; until then it holds the slot (``Slot.held``: the buffer's
    use count), so the slot is refilled only once no row, nor anything made from one, views it."""
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        alias = aliases.get(storage.data_ptr())
        if alias is None:
            whole = torch.empty(0, dtype=torch.uint8).set_(storage)  # a plain byte view: numpy takes any dtype
            alias = aliases[storage.data_ptr()] = torch.from_numpy(whole.numpy()).untyped_storage()
        return torch.empty(0, dtype=obj.dtype).set_(alias, obj.storage_offset(), obj.shape, obj.stride())
    if isinstance(obj, dict):
        return {k: _own_storages(v, aliases) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_own_storages(v, aliases) for v in obj)
    return obj


def _split(ds: Any, parts: list, batch: Any, n: int) -> list:
    """The collated ``batch`` as n samples, each as ds[i] gives it (each field's part cuts its entry, fields/)."""
    values = list(batch.values()) if ds.as_dict else batch
    columns = [part.split(v, n) for part, v in zip(parts, values)]
    if ds.as_dict:
        return [dict(zip(ds.schema.names, row)) for row in zip(*columns)]
    return [tuple(row) for row in zip(*columns)]
