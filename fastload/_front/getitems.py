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

Randomness. One seed per call is drawn from torch's default generator, as ``ds[i]`` draws one per sample,
and the whole batch's crops and flips are planned from it. In a DataLoader worker torch has seeded that
generator with the worker's seed (``get_worker_info().seed``: the loader's base seed, drawn from its
``generator`` or torch's each epoch, plus the worker id), and every call advances it: workers, batches and
epochs differ, and ``torch.manual_seed`` before building the iterator makes a run repeat exactly (at any
``num_workers``, as long as it is the same). In the main process (``num_workers=0``) it is torch's global
generator. The draws differ from ``ds[i]``'s (one per batch, not one per sample), so a random transform
gives other crops than ``[ds[i] ...]`` would; deterministic transforms give the same bytes.

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
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
import weakref
from typing import Any

import numpy as np
import torch

from .._fill.batcher import Batcher
from ..fields import NotFastPath
from .._errors import FastloadError, FastPathWarning
from .getitems_shm import SharedBatches, items as shared_items
from .._ring import SlotRing
from .._transforms.sequences import PackSequences
from ..fast.collate import Collator


_INHERITED: list = []  # in a forked child: batchers made by the parent, kept here for good (BatchItems.__del__)


class BatchItems:
    """One process's state for one dataset: a Batcher sized for the largest batch asked for, its slots, a lock.

    ``reason`` says why the dataset has no batch path (None when it has one, or "" when that needs no
    warning). The batcher sees the dataset through a weak proxy: the dataset holds this state, so a strong
    reference back would make a cycle, and a cycle's slots live until the garbage collector runs -- possibly
    in a forked worker (see ``__del__``)."""

    def __init__(self, ds: Any, quiet: bool = False):
        ds = weakref.proxy(ds)
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.batcher: Batcher | None = None
        self.ring: SlotRing | None = None
        self.reason: str | None = None
        self.probe = False  # the batcher only showed that the dataset batches: the first call makes the real one
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
    if state.reason is not None:
        return [ds[int(i)] for i in idx]
    with state.lock:
        batcher = state.batcher_for(len(idx))
        slot = state.ring.acquire()
        rng = np.random.default_rng(int(torch.randint(0, 2**62, ()).item())) if batcher.needs_rng else None
        try:
            objects = batcher.fill(slot, idx, rng)
            batch = state.collator.collate(slot, len(idx), objects)
        except (FastloadError, ValueError) as e:
            failed = e
        else:
            rows = _split(ds, batcher.parts, batch, len(idx))
            return rows if state.shared is None else shared_items(state, batch, rows, ds.as_dict)
    for i in idx:  # ds[i] names the bad sample (and its error has no loader-only hint)
        ds[int(i)]
    raise failed


def _split(ds: Any, parts: list, batch: Any, n: int) -> list:
    """The collated ``batch`` as n samples, each as ds[i] gives it (each field's part cuts its entry, fields/)."""
    values = list(batch.values()) if ds.as_dict else batch
    columns = [part.split(v, n) for part, v in zip(parts, values)]
    if ds.as_dict:
        return [dict(zip(ds.schema.names, row)) for row in zip(*columns)]
    return [tuple(row) for row in zip(*columns)]
