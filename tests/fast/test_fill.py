"""fastload/fast/fill.py: ``Fill`` takes a free host slot and has the batcher fill it with the pool it was
given; ``Reservations`` keep a filled slot from being handed out again until ``Collate`` (collate.py) has
made the batch of it."""

from __future__ import annotations

import torch

from fastload._batcher import Batcher
from fastload._ring import SlotRing
from fastload._stats import LoaderStats
from fastload.fast.collate import Collate
from fastload.fast.fill import Fill, Reservations
from fastload.fast.order import Jobs, Order
from fastload.fast.producer import FillPolicy


def test_a_filled_slot_is_not_handed_out_again_until_collated(records):
    batcher = Batcher(records, 16, 0)
    order = Order(len(records), 16, kind="sequential")
    reserved, stats = Reservations(), LoaderStats()
    fill = Fill(Jobs(order, 0, 0, needs_rng=False), batcher, batcher.pool, SlotRing(batcher.new_slot), reserved,
                FillPolicy().fills)
    a, b = next(fill), next(fill)  # two filled, neither collated yet: nothing views them
    assert a[0] is not b[0] and len(reserved.ids) == 2
    assert a[3] >= 0 and a[1] == 16

    class Handed:  # the producer stage's interface to Collate: an iterator and its queue depth
        ready = 0

        def __init__(self, items):
            self.items = iter(items)

        def __next__(self):
            return next(self.items)

    collate = Collate(Handed([a, b]), batcher.collator, reserved, stats, FillPolicy().steps)
    tokens, labels = next(collate)
    assert torch.equal(labels, torch.arange(16)) and len(reserved.ids) == 1
    assert stats.batches == 1 and stats.fill_s == a[3]
