"""The group fill stage: several cheap batches filled by one pass of the batcher into one slot.

A batch of tiny records (int32[64] tokens and a label, batch 1024: 270 KB) costs ~27 us to copy on a quiet
machine, and the chain's fixed Python per batch (a slot's acquire and use counts, ``locate``, the reader's
row sources and one native call per field, the fill's bookkeeping) cost about as much again: fastload ran at
36-48% of a one-thread gather (bench/results/raw_tiny_profile.md). ``GroupFill`` takes up to ``size`` jobs at
once, gathers their rows with one ``Batcher.fill`` (one ``locate``, one native call per field) into a *group
slot* of ``size`` batches, and hands the batches on one by one as *members*: light views of the group slot
made once with it (``Member``), collated like any slot (``fast/collate.py``). The fixed cost is paid once per
group.

What does not change: the batches (content, order; the last partial batch, ``drop_last``, a rank's share are
the jobs' own), resume (each batch held back carries the jobs' state after it, and the stage's ``state`` is that
of the last batch handed on, ``stage.py``'s prefetching rule; ``progress.done`` counts what the loop received), the
stats and the fill policy (each batch gets its share of the group's fill time), the loader's lock (the stages
below ``Count`` run under it, or in the one producer thread).

The slot protocol (``_ring.py``): a group slot is free when no view of any of its batches lives. Its members'
views are made with it and are in its baseline; the caller's batches are views of the members, so any batch
the caller holds keeps the whole group slot. Until the last member is collated the group stays reserved
(``fill.Reservations``): a member not handed out yet has no view the use counts could show.

Only where a fill is the native row gather alone (``group_size``): every field a fixed-size column, no random
transform (per-sample or batch draws), no image decoder, local shards, no device prefetcher (its host ring
bounds slots one batch each). Elsewhere the chain uses ``Fill``, one batch per slot.
"""

from __future__ import annotations

import collections
import math
import time
from typing import Any

import numpy as np

from ..fields._codec import FixedPart
from .fill import Reservations
from .stage import Stage, nested, upstream_state

GROUP_BYTES = 2 << 20  # a group slot holds up to this many bytes (a few batches that fit the L2/L3 caches)
MAX_GROUP = 8  # batches per group at most
GROUP_BELOW = 512 << 10  # bytes per batch from which one batch per fill is cheap enough (the copy dominates)


def batch_bytes(batcher: Any) -> int | None:
    """Bytes of one batch if every field is a fixed-size column the native row gather fills alone, else None."""
    parts = batcher.parts
    if batcher.packed is not None or not parts or any(type(p).fill is not FixedPart.fill for p in parts):
        return None
    # math.prod, not np.prod: this runs at every epoch's start, and np.prod of a shape costs ~10-25 us
    return batcher.batch_size * sum(math.prod(p.column.shape) * np.dtype(p.column.dtype).itemsize for p in parts)


def group_size(batcher: Any, *, remote: bool, device: bool) -> int:
    """How many batches one fill takes (1: the plain ``Fill``), from the module docstring's conditions."""
    if remote or device or batcher.needs_rng or batcher.images.device is not None:
        return 1
    if getattr(batcher.ds, "batch_mix", None) is not None:
        return 1
    size = batch_bytes(batcher)
    if size is None or size == 0 or size >= GROUP_BELOW:
        return 1
    return max(1, min(MAX_GROUP, GROUP_BYTES // size))


class Member:
    """One batch of a group slot: ``tensors`` are views of the group's rows ``[j * batch, (j + 1) * batch)``;
    ``last`` is set by each fill on the group's last member holding a batch (its collate ends the reservation)."""

    __slots__ = ("tensors", "group", "last", "batch_rng", "indices")

    def __init__(self, tensors: dict, group: Any):
        self.tensors, self.group, self.last, self.batch_rng = tensors, group, False, None
        self.indices: Any = None


def new_group(batcher: Any, size: int) -> Any:
    """A group slot of ``size`` batches and its members (``group.members``), the baseline taken after them."""
    from .._ring import use_count

    slot = batcher.new_slot(rows=size * batcher.batch_size)
    b = batcher.batch_size
    slot.members = [Member({k: t[j * b : (j + 1) * b] for k, t in slot.tensors.items()}, slot) for j in range(size)]
    slot.baseline = {k: use_count(t) for k, t in slot.tensors.items()}
    return slot


def group_ring(slots: Any, batcher: Any, size: int) -> Any:
    """The ring of ``size``-batch group slots kept with the loader's host ring ``slots`` (made on first use)."""
    from .._ring import SlotRing

    ring = slots.groups.get(size)
    if ring is None:
        ring = slots.groups[size] = SlotRing(lambda: new_group(batcher, size))
    return ring


class GroupFill(Stage):
    """jobs ``(indices, None)`` -> ``(member, n, objects, seconds)`` per batch, as ``Fill``'s items, ``size``
    batches filled at a time (module docstring)."""

    def __init__(self, source: Any, batcher: Any, pool: Any, ring: Any, reserved: Reservations, fills: Any, size: int):
        self.source, self.batcher, self.pool, self.ring = source, batcher, pool, ring
        self.reserved, self.fills, self.size = reserved, fills, size
        self.pending: collections.deque = collections.deque()  # (item, upstream state after its job)
        self._snapshot = upstream_state(source)
        self.objects = [None] * len(batcher.parts)  # what a fixed-size column's part hands the collate

    def __next__(self) -> tuple[Any, int, list, float]:
        pending = self.pending
        if not pending:
            self._fill()
        item, self._snapshot = pending.popleft()
        return item

    def _fill(self) -> None:
        jobs, after = [], []
        source = self.source
        for _ in range(self.size):
            try:
                jobs.append(next(source)[0])
            except StopIteration:
                break
            after.append(upstream_state(source))
        if not jobs:
            raise StopIteration
        b = self.batcher.batch_size
        for job in jobs:
            if len(job) > b:  # Fill's native call refuses it; here it would run into the next batch's rows
                raise ValueError(f"fastload: a batch of {len(job)} indices for slots of batch_size={b}")
        r = self.reserved
        with r.lock:
            group = self.ring.acquire(r.ids)
            r.ids.add(id(group))
        t = time.perf_counter()
        indices = jobs[0] if len(jobs) == 1 else np.concatenate(jobs)
        objects = self.batcher.fill(group, indices, None, self.pool)
        cost = (time.perf_counter() - t) / len(jobs)
        if any(o is not None for o in objects):  # group_size admits fixed-size columns only: they return None
            raise AssertionError(f"fastload: a grouped fill returned {objects!r} (a fixed-size column returns None)")
        members = group.members
        last = len(jobs) - 1
        append, fills = self.pending.append, self.fills
        for j, job in enumerate(jobs):
            m = members[j]
            m.last = j == last
            m.indices = job  # counted per dataset of a mix (``LoaderStats.took``), as Fill records them
            fills.append(cost)
            append(((m, len(job), self.objects, cost), after[j]))

    def state(self) -> dict:
        return nested(self._snapshot)  # filled and not handed on yet is not part of it

    def reset(self, state: dict | None = None) -> None:
        """Start over: the batches held back go, and with them their group's reservation."""
        if self.pending:
            self.reserved.release(self.pending[0][0][0])
            self.pending.clear()
        super().reset(state)
        self._snapshot = upstream_state(self.source)
