"""``Dataset.__getitems__`` in torch's DataLoader workers: each batch collated once, into reused shared memory.

torch's worker calls ``collate_fn(dataset.__getitems__(indices))`` and puts the result on a queue, which moves
every tensor to shared memory and rebuilds it in the main process from a file descriptor. With plain items,
``default_collate`` stacks the samples' CHW views of the NHWC slot into a *fresh* shared-memory segment per
batch: a strided transposing copy (torch's generic loop: ~5x a plain copy for 3 uint8 channels) into pages the
kernel must zero and fault in, every batch. That was most of torch's per-batch cost under ``__getitems__``
(bench/results/getitems_cpu2.md). Here instead:

- In a worker whose loader's ``collate_fn`` is torch's ``default_collate`` (``POOLED_COLLATES``), ``__getitems__``
  returns ``Items``: one ``Row`` (a dict subclass) or ``RowTuple`` (a tuple subclass) per index, equal to ``ds[i]``,
  and the batch as the slot holds it. A user's ``collate_fn`` gets plain dicts/tuples instead, exactly
  ``ds[i]``'s types (code testing ``type(row) is dict`` works), and torch's collate if it calls default_collate.
- ``Row`` and ``RowTuple`` are registered in torch's ``default_collate_fn_map`` (the extension point its
  ``collate`` documents), so ``default_collate`` hands the list to ``collate_rows``. An ``Items`` list exactly as
  ``__getitems__`` returned it (the same rows holding the same values, checked by identity) is written once from
  the slot into a buffer of this worker's pool (uint8 images: one native NHWC -> NCHW copy,
  ``_C.hwc_to_chw_u8``): the dict or list that ``default_collate`` gives, with the same types, dtypes, shapes,
  strides and values. Anything else (a list changed since, another ``collate_fn_map``) is collated as plain
  dicts/tuples by torch.
  The first batch of each worker is also collated by torch and compared; on any difference the worker
  warns once and leaves this path.

The reuse protocol. A pool buffer is rewritten only when nobody can still read it:
- in the worker: its storages' use counts are back to the pool's own (``_ring.Slot.held``): the queue's
  feeder thread, a user's ``collate_fn``, anything still holding it keeps it;
- in the main process: a mark per buffer and field in a small shared-memory table (``flags``), set to a
  token unique to the batch when the worker leases the buffer. The batch reaches the main process through
  ``SharedBatch.__reduce__``, which rebuilds a plain dict/list (``_received``) and ties a finalizer to each
  received storage; when the last tensor viewing a field's storage is freed there (the user's batch, a
  pinned copy's source, any view of it), that field's mark is cleared, if it still holds the token.
  A field the batch no longer carries when pickled (a ``collate_fn`` replaced it) is unmarked by the worker
  once the batch object dies there.
When every buffer of the pool is held, the batch goes into fresh shared memory, as torch's own collate
does (``fresh`` counts those): the pool never grows past ``POOL_SIZE`` buffers per batch shape.

Not covered: a batch pickled to *two* processes (the first to let go frees the buffer), or forwarded by the
main process to a third one without a copy; both are outside what torch's loader does.
"""

from __future__ import annotations

import copy
import itertools
import warnings
import weakref
from typing import Any

import torch
from torch.utils.data._utils.collate import collate, default_collate, default_collate_fn_map

from .._errors import FastPathWarning
from .._native import native
from .._ring import Slot

#: buffers per batch shape in one worker: torch keeps prefetch_factor (2) batches per worker in flight,
#: the caller holds one, the pin-memory thread may hold one more
POOL_SIZE = 6

#: the loader ``collate_fn`` s whose worker rows are ``Row``/``RowTuple`` (collated from the pool): torch's own.
#: A user's collate_fn gets plain dicts/tuples, exactly ``ds[i]``'s types (``type(row) is dict`` holds), and
#: torch's collate where it calls default_collate on them
POOLED_COLLATES = [default_collate]


def _sendable(value: Any) -> Any:
    """``value`` with its tensors copied: a row's tensors view the worker's slot, and torch would move the slot
    itself into shared memory to send them (numpy views and native writers still pointing at the old memory)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_sendable(v) for v in value)
    if isinstance(value, dict):
        return {k: _sendable(v) for k, v in value.items()}
    return value


class Row(dict):
    """One sample of a dict dataset, as ``ds[i]`` gives it, from a batch ``collate_rows`` can hand out whole.
    Pickled (a ``collate_fn`` that returns the rows themselves), it is a plain dict of copies."""

    __slots__ = ()

    def __reduce__(self) -> tuple:
        return (dict, (_sendable(dict(self)),))

    def __copy__(self) -> "Row":
        return Row(self)

    def __deepcopy__(self, memo: dict) -> dict:
        return copy.deepcopy(dict(self), memo)


class RowTuple(tuple):
    """One sample of a tuple dataset, as ``ds[i]`` gives it (see ``Row``)."""

    __slots__ = ()

    def __reduce__(self) -> tuple:
        return (tuple, (_sendable(tuple(self)),))

    def __copy__(self) -> "RowTuple":
        return self

    def __deepcopy__(self, memo: dict) -> tuple:
        return copy.deepcopy(tuple(self), memo)


class Items(list):
    """``__getitems__``'s rows in a worker, with the batch as the slot holds it (the Collator's views).
    Pickled, it is a plain list of its rows (each as ``Row`` pickles)."""

    __slots__ = ("batch", "rows", "values", "state")
    batch: Any  # the Collator's batch: views of the slot
    rows: list  # the rows as made, to see a list changed since
    values: list | None  # each dict row's values as made (None: tuple rows, which cannot change)
    state: Any  # the process's _getitems.BatchItems

    def __reduce__(self) -> tuple:
        return (list, (list(self),))

    def __copy__(self) -> list:
        return list(self)


def items(state: Any, batch: Any, rows: list, as_dict: bool) -> Items:
    out = Items(Row(r) for r in rows) if as_dict else Items(RowTuple(r) for r in rows)
    out.batch, out.state = batch, state
    out.rows = list(out)
    out.values = [tuple(r.values()) for r in out] if as_dict else None
    return out


def _intact(batch: Items) -> bool:
    """The list and its rows are as ``__getitems__`` made them (same objects; dict rows: same keys, same values)."""
    if len(batch) != len(batch.rows) or any(a is not b for a, b in zip(batch, batch.rows)):
        return False
    if batch.values is None:
        return True  # tuple rows cannot change
    for row, values in zip(batch, batch.values):
        if len(row) != len(values) or any(a is not b for a, b in zip(row.values(), values)):
            return False
    return True


def collate_rows(batch: list, *, collate_fn_map: dict | None = None) -> Any:
    """``default_collate`` of a list of ``Row``/``RowTuple`` (see the module docstring)."""
    if (
        type(batch) is Items
        and collate_fn_map is default_collate_fn_map
        and batch.state.shared is not None
        and _intact(batch)
    ):
        return batch.state.shared.collate(batch)
    return collate(_plain(batch), collate_fn_map=collate_fn_map)


default_collate_fn_map[Row] = collate_rows
default_collate_fn_map[RowTuple] = collate_rows


# -- the worker's side ------------------------------------------------------------------------------
def _leaves(obj: Any) -> list:
    """The tensors of a (nested) dict/list/tuple, in order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _leaves(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _leaves(v)]
    return []


def _taking(outs: Any) -> dict:
    """default_collate's map, with every entry the slot's batch holds as a tensor (tensors, ints, floats) taken
    in turn from ``outs`` instead of collated: torch's own recursion then builds the containers (dicts, lists,
    the tuples of its string batches) exactly as default_collate does, around our tensors."""

    def take(batch: Any, *, collate_fn_map: Any = None) -> Any:
        return next(outs, None)  # None: the slot held fewer (the first batch's comparison says so)

    fn_map = {k: v for k, v in default_collate_fn_map.items() if k not in (Row, RowTuple)}
    fn_map.update({torch.Tensor: take, int: take, float: take})
    return fn_map


def _copy(src: torch.Tensor, out: torch.Tensor) -> None:
    """``out.copy_(src)``; a uint8 NCHW view of NHWC memory (the slot's images) by one native pass."""
    if src.dtype == torch.uint8 and src.dim() == 4 and not src.is_contiguous():
        nhwc = src.permute(0, 2, 3, 1)
        if nhwc.is_contiguous():
            native().hwc_to_chw_u8(nhwc.numpy(), out.numpy())
            return
    out.copy_(src)


def _differs(a: Any, b: Any, where: str = "batch") -> str | None:
    """Where ``a`` (this path's batch) differs from ``b`` (torch's default_collate's), or None."""
    if type(a) is not type(b) and not (isinstance(a, SharedBatch) and type(b) in (dict, list)):
        return f"{where}: {type(a).__name__} instead of {type(b).__name__}"
    if isinstance(b, torch.Tensor):
        if (a.dtype, a.shape, a.stride()) != (b.dtype, b.shape, b.stride()):
            return (
                f"{where}: {a.dtype} {tuple(a.shape)} strides {a.stride()} instead of {b.dtype} "
                f"{tuple(b.shape)} strides {b.stride()}"
            )
        return None if torch.equal(a, b) else f"{where}: other values"
    if isinstance(b, dict):
        if list(a) != list(b):
            return f"{where}: keys {list(a)} instead of {list(b)}"
        return next((d for k in b if (d := _differs(a[k], b[k], f"{where}[{k!r}]"))), None)
    if isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: {len(a)} entries instead of {len(b)}"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := _differs(x, y, f"{where}[{i}]"))), None)
    return None if a == b else f"{where}: {a!r} instead of {b!r}"


class Lease:
    """One batch's hold on a pool buffer: its row in ``flags``, its token, its storages, the fields sent."""

    def __init__(self, flags: torch.Tensor, row: int, token: int, tensors: list):
        self.flags, self.row, self.token = flags, row, token
        self.ptrs = [t.untyped_storage().data_ptr() for t in tensors]
        self.sent: set = set()

    def release_unsent(self) -> None:
        """The batch object died in the worker: unmark the fields that never left it."""
        marks = self.flags.numpy()
        for f in range(len(self.ptrs)):
            if f not in self.sent and marks[self.row, f] == self.token:
                marks[self.row, f] = 0


class SharedBatches:
    """One worker's pool of shared-memory batches, per batch shape (see the module docstring)."""

    def __init__(self, size: int | None = None):
        self.size = POOL_SIZE if size is None else size
        self.pools: dict[
            tuple, tuple[list[Slot], torch.Tensor]
        ] = {}  # (shape, dtype) per field -> ([Slot], flags (size, fields) int64 shared)
        self.tokens = itertools.count(1)
        self.fresh = 0  # batches collated into fresh memory: every buffer of their pool was held
        self.checked = False  # the first batch was compared with torch's default_collate

    def lease(self, specs: list) -> tuple[list, Lease | None]:
        """Tensors of the given (shape, dtype) to collate into, and the lease on them (None: fresh memory)."""
        key = tuple(specs)
        pool = self.pools.get(key)
        if pool is None:
            pool = self.pools[key] = ([], torch.zeros(self.size, max(len(specs), 1), dtype=torch.int64).share_memory_())
        slots, flags = pool
        marks = flags.numpy()
        row = next((j for j, s in enumerate(slots) if not marks[j].any() and not s.held()), None)
        if row is None:
            if len(slots) >= self.size:
                self.fresh += 1
                return [torch.empty(shape, dtype=dtype).share_memory_() for shape, dtype in specs], None
            slots.append(Slot({f: torch.empty(s, dtype=d).share_memory_() for f, (s, d) in enumerate(specs)}))
            row = len(slots) - 1
        # handed out as new tensors over the slot's storages: their use counts show who holds them (Slot.held)
        tensors = [
            torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, t.shape, t.stride())
            for t in slots[row].tensors.values()
        ]
        token = next(self.tokens)
        marks[row] = token
        return tensors, Lease(flags, row, token, tensors)

    def collate(self, batch: Items) -> Any:
        leaves = _leaves(batch.batch)
        outs, lease = self.lease([(tuple(t.shape), t.dtype) for t in leaves])
        for src, out in zip(leaves, outs):
            _copy(src, out)
        rest = iter(outs)
        plain = _plain(batch)
        result = collate(plain, collate_fn_map=_taking(rest))
        if not self.checked:
            self.checked = True
            left = sum(1 for _ in rest)
            expected = collate(plain, collate_fn_map=default_collate_fn_map)
            why = f"{left} of the slot's entries left over" if left else _differs(result, expected)
            if why is not None:
                return self.disable(batch, why, expected)
        if lease is not None:
            result = (SharedDict if isinstance(result, dict) else SharedList)(result)
            result.lease = lease
            weakref.finalize(result, lease.release_unsent).atexit = False
        return result

    @staticmethod
    def disable(batch: Items, why: str, expected: Any) -> Any:
        batch.state.shared = None
        warnings.warn(
            "fastload.Dataset.__getitems__ in a DataLoader worker: the batch written from the slot "
            f"differs from torch's default_collate of the same items ({why}); this worker collates "
            "them as torch does (slower: a new shared-memory batch each time)",
            FastPathWarning,
            stacklevel=3,
        )
        return expected


def _plain(rows: list) -> list:
    return [dict(r) if isinstance(r, dict) else tuple(r) for r in rows]


# -- the hand-over ----------------------------------------------------------------------------------
class SharedBatch:
    """A collated batch in pool buffers: pickled (to the main process), it arrives as a plain dict/list."""

    lease: Lease

    def _reduce(self, plain: Any) -> tuple:
        lease = self.lease
        marks = []
        for leaf in _leaves(plain):
            ptr = leaf.untyped_storage().data_ptr()
            for f, p in enumerate(lease.ptrs):
                if p == ptr:
                    marks.append((leaf, f))  # the same tensor object as in plain: pickled once
                    lease.sent.add(f)
        return (_received, (plain, lease.flags, lease.row, lease.token, marks))


class SharedDict(SharedBatch, dict):
    def __reduce__(self) -> tuple:
        return self._reduce(dict(self))

    def __copy__(self) -> dict:
        return dict(self)

    def __deepcopy__(self, memo: dict) -> dict:
        return copy.deepcopy(dict(self), memo)


class SharedList(SharedBatch, list):
    def __reduce__(self) -> tuple:
        return self._reduce(list(self))

    def __copy__(self) -> list:
        return list(self)

    def __deepcopy__(self, memo: dict) -> list:
        return copy.deepcopy(list(self), memo)


class _Held:
    """The main process's side of one batch: each field's mark is cleared when its last storage is freed."""

    def __init__(self, flags: torch.Tensor, row: int, token: int):
        self.flags, self.row, self.token = flags, row, token
        self.count: dict = {}

    def drop(self, field: int) -> None:
        self.count[field] -= 1
        if not self.count[field]:
            marks = self.flags.numpy()
            if marks[self.row, field] == self.token:
                marks[self.row, field] = 0


def _received(batch: Any, flags: torch.Tensor, row: int, token: int, marks: list) -> Any:
    """Unpickled in the receiving process: the plain batch; its pool marks cleared as its storages are freed."""
    held = _Held(flags, row, token)
    for leaf, field in marks:
        held.count[field] = held.count.get(field, 0) + 1
        weakref.finalize(leaf.untyped_storage(), held.drop, field).atexit = False
    return batch
