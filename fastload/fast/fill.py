"""The fill stage: each job's batch written into a free host slot by the batcher (one native call per field).

``Fill`` is given everything it uses: the batcher, the native thread pool it fills with, the slot ring it
takes slots from and the reservations it shares with ``Collate`` (a slot filled but not yet viewed by a
collated batch must not be handed out again: its use count does not show it yet). Each fill's time goes
into the fill policy's window (``producer.FillPolicy``) and, with the batch, to ``Collate``, which adds it
to the loader's stats in the caller's thread (one visit to the stats per batch, no lock).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .stage import Stage


class Reservations:
    """Slots filled and not yet collated (by ``id``), shared by ``Fill`` (adds) and ``Collate`` (discards)."""

    __slots__ = ("ids", "lock")

    def __init__(self):
        self.ids: set[int] = set()
        self.lock = threading.Lock()

    def release(self, slot: Any) -> None:
        with self.lock:
            self.ids.discard(id(slot))


class Fill(Stage):
    """jobs ``(indices, generator)`` -> ``(slot, n, objects, seconds)``: the slot filled, its batch size, the
    object fields, the fill's time."""

    def __init__(self, source: Any, batcher: Any, pool: Any, slots: Any, reserved: Reservations, fills: Any):
        self.source, self.batcher, self.pool, self.slots = source, batcher, pool, slots
        self.reserved, self.fills = reserved, fills

    def __next__(self) -> tuple[Any, int, list, float]:
        indices, rng = next(self.source)
        r = self.reserved
        with r.lock:
            slot = self.slots.acquire(r.ids)
            r.ids.add(id(slot))
        t = time.perf_counter()
        objects = self.batcher.fill(slot, indices, rng, self.pool)
        slot.batch_rng = rng  # the collate stage draws the batch transform's plan from it (MixUp/CutMix)
        cost = time.perf_counter() - t
        self.fills.append(cost)  # the policy's window (a deque; appended from the filling thread)
        return slot, len(indices), objects, cost
