"""The stages of fastload/fast/ one by one, each built from its upstream and collaborators (never a loader):
Jobs (order.py), ReadAhead (readahead.py), Fill (fill.py), Collate (collate.py); and chain.fast_iterator
wiring them to the same batches the loader gives."""

from __future__ import annotations

import itertools
import time

import numpy as np
import torch

import fastload
from fastload._batcher import Batcher
from fastload._ring import SlotRing
from fastload._stats import LoaderStats
from fastload.fast.chain import fast_iterator
from fastload.fast.collate import Collate
from fastload.fast.fill import Fill, Reservations
from fastload.fast.order import Jobs, Order
from fastload.fast.position import Progress
from fastload.fast.producer import FillPolicy, Produce
from fastload.fast.readahead import ReadAhead


def test_jobs_pair_each_batch_with_its_generator_and_reset_to_a_state():
    order = Order(100, 10, kind="random", seed=3)
    jobs = Jobs(order, epoch=2, start=0, needs_rng=True)
    first = [next(jobs) for _ in range(4)]
    assert jobs.state() == {"epoch": 2, "batch": 4}
    for b, (idx, rng) in enumerate(first):
        assert np.array_equal(idx, list(order.batches(2, 0))[b])
        assert rng.random() == order.batch_rng(2, b).random()
    jobs.reset({"batch": 1})
    idx, rng = next(jobs)
    assert np.array_equal(idx, first[1][0]) and rng.random() == order.batch_rng(2, 1).random()
    assert next(Jobs(order, 2, 0, needs_rng=False))[1] is None


def test_read_ahead_keeps_each_generator_with_its_batch():
    order = Order(100, 10, kind="random", seed=3)
    seen = []

    def reading(batches):  # a read plan looks several batches ahead before handing out the first
        ahead = list(itertools.islice(batches, 3))
        seen.append(len(ahead))
        yield from ahead
        yield from batches

    stage = ReadAhead(Jobs(order, 0, 0, needs_rng=True), reading)
    got = list(stage)
    assert seen == [3] and len(got) == 10
    for b, (idx, rng) in enumerate(got):
        assert np.array_equal(idx, list(order.batches(0, 0))[b])
        assert rng.random() == order.batch_rng(0, b).random()
    assert stage.state() == {"source": {"epoch": 0, "batch": 10}}  # an upstream's state nests
    stage.reset({"source": {"batch": 8}})
    rest = list(stage)
    assert seen == [3, 2] and len(rest) == 2 and rest[0][1].random() == order.batch_rng(0, 8).random()


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


def test_the_chain_gives_the_loaders_batches_without_a_loader(records):
    ref = [[t.clone() for t in b] for b in fastload.DataLoader(records, batch_size=300, shuffle=True, seed=9)]
    batcher = Batcher(records, 300, 0)
    order = Order(len(records), 300, kind="random", seed=9)
    progress = Progress(0, 2)
    it = fast_iterator(plan=order, epoch=0, start=2, batcher=batcher, slots=SlotRing(batcher.new_slot),
                       progress=progress, policy=FillPolicy(), stats=LoaderStats(), length=len(order),
                       num_workers=2, depth=2, timeout=0, persistent=False)
    got = [[t.clone() for t in b] for b in it]
    assert len(got) == len(ref) - 2 and progress.done == len(ref)
    assert all(torch.equal(x, y) for p, q in zip(ref[2:], got) for x, y in zip(p, q))


def test_a_producer_reset_mid_stream_drops_its_queue_and_starts_over(records):
    batcher = Batcher(records, 100, 0)
    order = Order(len(records), 100, kind="random", seed=2)
    reserved, stats, policy = Reservations(), LoaderStats(), FillPolicy()
    fill = Fill(Jobs(order, 0, 0, needs_rng=False), batcher, batcher.pool, SlotRing(batcher.new_slot), reserved,
                policy.fills)
    produce = Produce(fill, policy, stats, threads=True, always=True, depth=3, timeout=0, release=reserved.release)
    first = next(produce)  # handed on and not collated: its slot stays reserved
    deadline = time.monotonic() + 10
    while produce.producer.queue.qsize() < 3 and time.monotonic() < deadline:
        time.sleep(0.01)  # the producer thread has filled the batches it may keep ready (and one more in hand)
    produce.reset({"source": {"source": {"batch": 17}}})  # Produce <- Fill <- Jobs
    second = next(produce)
    assert np.array_equal(second[0].arrays["label"][:second[1]], list(order.batches(0, 0))[17])
    for item in produce._stop_producer():  # the new thread's queue, dropped here as reset drops one
        if isinstance(item, tuple):  # batches 18 and 19 may be queued, then the end of the epoch (a sentinel)
            reserved.release(item[0])
    # every batch the first thread had filled, queued or in hand, was let go: only the two handed on are held
    assert reserved.ids == {id(first[0]), id(second[0])}
