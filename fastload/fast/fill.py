"""The fill stage: each job's batch written into a free host slot by the batcher (one native call per field).

``Fill`` is given everything it uses: the batcher, the native thread pool it fills with, the slot ring it
takes slots from and the reservations it shares with ``Collate`` (a slot filled but not yet viewed by a
collated batch must not be handed out again: its use count does not show it yet). Each fill's time goes
into the fill policy's window (``producer.FillPolicy``) and, with the batch, to ``Collate``, which adds it
to the loader's stats in the caller's thread (one visit to the stats per batch, no lock).

Bounded host memory under a lagging GPU: a device prefetcher keeps each host batch referenced until its copy
ran (``_ring.CopyHolds``), so with the consumer stream far behind, every batch would need a new pinned slot.
When the ring has its ``limit`` of slots (given by the loader that makes it, when a device prefetcher
follows) and copies are
still pending, a fill in a producer thread waits for the oldest copy's event (a host wait off the training
thread) and takes the slot it frees. A fill in the *calling* thread (``num_workers=0``, or the fill policy
filling inline) must not wait for the GPU: it grows the ring up to ``INLINE_FACTOR`` times the limit first,
and only then waits. A loop that runs that many batches ahead of its GPU is throttled anyway (CUDA's launch
queue is bounded too); unbounded pinned memory would be worse (it is page-locked: the OS cannot page it).

The producer's wait gives up when its thread is told to stop (``Stopped``): an iteration abandoned mid-epoch
(``break``, a dropped iterator, a new ``iter(loader)``) joins the producer in the training thread, which would
otherwise wait there until the lagging GPU ran that copy. Giving up happens before a slot is taken, so no slot
is handed out or refilled under a copy; the job drawn for it is dropped with the iteration (a ``reset`` starts
the sequence over).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .stage import Stage

INLINE_FACTOR = 3  # a fill in the calling thread grows the host ring up to this many times its limit

_PRODUCER = threading.local()  # ``active`` in a producer thread (producer.py): there a fill may wait for the GPU


def host_limit(depth: int) -> int:
    """The host ring's bound with a device prefetcher of ``depth``: the producer's queue (``depth``), the batch
    it fills and the one it is handing on, the prefetcher's batches in flight (``depth``), and one whose copy
    completed but which the training thread has not let go of yet. A GPU that keeps up never reaches it."""
    return 2 * depth + 3


class Stopped(Exception):
    """A producer thread's fill gave up waiting for a pending copy: the thread was told to stop."""


def in_producer() -> bool:
    return getattr(_PRODUCER, "active", False)


def mark_producer(stop: threading.Event | None = None) -> None:
    """Called by a producer thread when it starts: fills in this thread may wait for pending copies, and give up
    (``Stopped``) once ``stop`` is set."""
    _PRODUCER.active = True
    _PRODUCER.stop = stop


class Reservations:
    """Slots filled and not yet collated (by ``id``), shared by ``Fill`` (adds) and ``Collate`` (discards).

    A batch of a group slot (``group.Member``, ``fast/group.py``) reserves its group: ``Collate`` ends the
    reservation at the group's last batch, ``release`` (a batch dropped, not collated) at once."""

    __slots__ = ("ids", "lock")

    def __init__(self):
        self.ids: set[int] = set()
        self.lock = threading.Lock()

    def release(self, slot: Any) -> None:
        """``slot``'s batch is dropped (a reset, a stopped producer): nothing will view it."""
        with self.lock:
            self.ids.discard(id(getattr(slot, "group", slot)))


class Fill(Stage):
    """jobs ``(indices, generator)`` -> ``(slot, n, objects, seconds)``: the slot filled, its batch size, the
    object fields, the fill's time."""

    def __init__(self, source: Any, batcher: Any, pool: Any, slots: Any, reserved: Reservations, fills: Any):
        self.source, self.batcher, self.pool, self.slots = source, batcher, pool, slots
        self.reserved, self.fills = reserved, fills

    def __next__(self) -> tuple[Any, int, list, float]:
        indices, rng = next(self.source)
        slot = self._acquire()
        t = time.perf_counter()
        objects = self.batcher.fill(slot, indices, rng, self.pool)
        slot.batch_rng = rng  # the collate stage draws the batch transform's plan from it (MixUp/CutMix)
        slot.indices = indices  # and counts them (a mix's samples per dataset, ``LoaderStats.took``)
        cost = time.perf_counter() - t
        self.fills.append(cost)  # the policy's window (a deque; appended from the filling thread)
        return slot, len(indices), objects, cost

    def _acquire(self) -> Any:
        """A free slot, reserved; at the ring's bound, after waiting for the oldest pending copy (module
        docstring). The wait is outside the reservations' lock: ``Collate`` takes it in the training thread.
        Raises ``Stopped``, holding no slot, when the producer thread is told to stop while it waits."""
        r, ring = self.reserved, self.slots
        limit = getattr(ring, "limit", None)
        bound = None if limit is None else limit if in_producer() else limit * INLINE_FACTOR
        stop = getattr(_PRODUCER, "stop", None)  # None in the calling thread: nobody joins it
        while True:
            with r.lock:
                slot = ring.acquire(r.ids, bound=bound) if bound is not None else ring.acquire(r.ids)
                if slot is not None:
                    r.ids.add(id(slot))
                    return slot
            # False when the copies completed meanwhile: the next acquire grows
            ring.pending.wait_oldest(None if stop is None else stop.is_set)
            if stop is not None and stop.is_set():
                raise Stopped
