"""fastload/fast/fill.py: ``Fill`` takes a free host slot and has the batcher fill it with the pool it was
given; ``Reservations`` keep a filled slot from being handed out again until ``Collate`` (collate.py) has
made the batch of it."""

from __future__ import annotations

import numpy as np
import torch

from fastload._fill.batcher import Batcher
from fastload._ring import SlotRing
from fastload._front.stats import LoaderStats
from fastload.fast.collate import Collate, Collator
from fastload.fast.fill import Fill, Reservations
from fastload.fast.order import Jobs, Order
from fastload.fast.producer import FillPolicy

from .stages_common import Handed


def test_a_filled_slot_is_not_handed_out_again_until_collated(records):
    batcher = Batcher(records, 16, 0)
    order = Order(len(records), 16, kind="sequential")
    reserved, stats = Reservations(), LoaderStats()
    fill = Fill(Jobs(order, 0, 0, needs_rng=False), batcher, batcher.pool, SlotRing(batcher.new_slot), reserved,
                FillPolicy().fills)
    a, b = next(fill), next(fill)  # two filled, neither collated yet: nothing views them
    assert a[0] is not b[0] and len(reserved.ids) == 2
    assert a[3] >= 0 and a[1] == 16

    collate = Collate(Handed([a, b]), Collator.for_batcher(batcher), reserved, stats, FillPolicy().steps)
    tokens, labels = next(collate)
    assert torch.equal(labels, torch.arange(16)) and len(reserved.ids) == 1
    assert stats.batches == 1 and stats.fill_s == a[3]


class _Pending:
    """Stands in for a device ring's CopyHolds: each wait lets go of one host batch (its copy completed)."""

    def __init__(self, reserved, batches):
        self.reserved, self.batches, self.waits, self.locked = reserved, batches, 0, []

    def __len__(self):
        return len(self.batches)

    def wait_oldest(self, stop=None):
        self.locked.append(self.reserved.lock.locked())  # the training thread's Collate takes this lock
        self.waits += 1
        self.batches.pop(0)
        return True


def test_at_its_limit_a_producer_fill_waits_for_a_pending_copy_outside_the_reservations_lock(records):
    """The host ring at its limit, every slot's batch still read by a pending copy: a fill in a producer thread
    waits for the oldest copy (not growing the ring), outside the reservations' lock, which the training
    thread's Collate takes; a fill in the calling thread grows up to INLINE_FACTOR times the limit first.
    Fails with the wait under the lock, and with the ring growing past its limit."""
    import threading

    from fastload.fast import fill as fill_stage

    batcher = Batcher(records, 16, 0)
    order = Order(len(records), 16, kind="sequential")
    reserved = Reservations()
    ring = SlotRing(batcher.new_slot)
    held: list = []  # the host batches the "copies" read

    def run(in_producer: bool, n: int) -> None:
        fill = Fill(Jobs(order, 0, 0, needs_rng=False), batcher, batcher.pool, ring, reserved, FillPolicy().fills)

        def body():
            if in_producer:
                fill_stage.mark_producer()
            for _ in range(n):
                slot, *_ = next(fill)
                reserved.release(slot)  # collated: now only the pending copy holds it
                held.append([t[:] for t in slot.tensors.values()])

        t = threading.Thread(target=body)
        t.start()
        t.join()

    ring.limit = 2
    ring.pending = pending = _Pending(reserved, held)
    run(True, 5)
    assert len(ring) == 2 and pending.waits == 3 and pending.locked == [False] * 3
    held.clear()
    ring.slots.clear()
    pending.waits = 0
    run(False, 8)  # the calling thread (not marked): grows to 3 x the limit before it waits
    assert len(ring) == 2 * fill_stage.INLINE_FACTOR and pending.waits == 2


def test_a_batch_is_counted_by_its_own_indices_even_when_its_slot_is_refilled_at_once(records):
    """The mix statistics count the indices of the batch handed out, even where the producer refills its slot the
    moment the reservation ends (a batch that does not view its slot, e.g. CPU ToDtype/Normalize's new tensors,
    leaves it free then): the double below does the producer's refill at exactly that point, as Fill does."""
    batcher = Batcher(records, 16, 0)
    order = Order(len(records), 16, kind="sequential")

    class RefilledOnRelease(set):
        """The reservation set; discarding a slot refills it at once (Fill's write of the next batch's indices)."""

        def discard(self, key):
            super().discard(key)
            for slot in filled:
                if id(slot) == key:
                    slot.indices = np.arange(100, 116)

    class Counted(LoaderStats):
        def took(self, started, samples, ready=0, fill_s=0.0, indices=None):
            seen.append(None if indices is None else np.array(indices))
            super().took(started, samples, ready, fill_s, indices)

    reserved, stats, seen = Reservations(), Counted(), []
    reserved.ids = RefilledOnRelease()
    fill = Fill(Jobs(order, 0, 0, needs_rng=False), batcher, batcher.pool, SlotRing(batcher.new_slot), reserved,
                FillPolicy().fills)
    a = next(fill)
    filled = [a[0]]

    next(Collate(Handed([a]), Collator.for_batcher(batcher), reserved, stats, FillPolicy().steps))
    assert a[0].indices.tolist() == list(range(100, 116))  # the double did refill it
    assert len(seen) == 1 and seen[0].tolist() == list(range(16)), seen
