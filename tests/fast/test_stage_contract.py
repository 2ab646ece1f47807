"""The resume contract per stage (torchdata's ``run_test_save_load_state``): each stage of the chain alone over its
upstream, saved at every position of a short epoch (before the first item, between any two, after the last),
restored into a fresh stage over a fresh upstream with ``reset(state)``: the rest of the stream is identical. The
prefetching stages (read-ahead, group fill, a producer thread, the device copies) hold items ahead of what they
handed out; their state must be that of the next item they hand out, not of what they read ahead (``stage.py``).
The whole chain (``fast_iterator``) runs the same harness; the loader's own: tests/test_resume_contract.py."""

from __future__ import annotations

import itertools
import json
import time

import numpy as np
import pytest
import torch

from fastload._fill.batcher import Batcher
from fastload._front.stats import LoaderStats
from fastload._ring import SlotRing
from fastload.fast.chain import fast_iterator
from fastload.fast.collate import Collate, Collator
from fastload.fast.device import DevicePrefetcher, DeviceRing
from fastload.fast.fill import Fill, Reservations
from fastload.fast.group import GroupFill, group_ring
from fastload.fast.order import Jobs, Order
from fastload.fast.position import Progress
from fastload.fast.producer import FillPolicy, Produce
from fastload.fast.readahead import ReadAhead
from sim_streams import SimGpu

B = 250  # 2,000 records: 8 batches an epoch


def plain(item) -> list:
    """An item of any stage as plain values, copied at once (a slot is refilled once let go)."""
    if isinstance(item, tuple) and len(item) == 2 and not isinstance(item[0], torch.Tensor):  # a job
        indices, rng = item
        return [np.asarray(indices).tolist(), None if rng is None else float(rng.random())]
    if isinstance(item, tuple):  # a filled slot: (slot, n, objects, seconds)
        slot, n = item[0], item[1]
        return [t[:n].tolist() for _, t in sorted(slot.tensors.items())]
    return [t.tolist() for t in item]  # a collated batch


def reading(batches):
    """A read plan that looks 3 batches ahead before handing out the first, as a remote dataset's does."""
    batches = iter(batches)
    while True:
        ahead = list(itertools.islice(batches, 3))
        if not ahead:
            return
        yield from ahead


class Chain:
    """Builds one stage over a fresh upstream, every collaborator new (nothing shared with another build)."""

    def __init__(self, records):
        self.records = records

    def jobs(self, rng=True):
        return Jobs(Order(len(self.records), B, kind="random", seed=4), 0, 0, needs_rng=rng)

    def fill(self):
        self.batcher = Batcher(self.records, B, 0)
        self.reserved, self.policy = Reservations(), FillPolicy()
        return Fill(self.jobs(False), self.batcher, self.batcher.pool, SlotRing(self.batcher.new_slot),
                    self.reserved, self.policy.fills)

    def group(self):
        self.batcher = b = Batcher(self.records, B, 0)
        self.reserved = Reservations()
        return GroupFill(self.jobs(False), b, b.pool, group_ring(SlotRing(b.new_slot), b, 3), self.reserved,
                         FillPolicy().fills, 3)

    def produce(self):
        fill = self.fill()
        return Produce(fill, self.policy, LoaderStats(), threads=True, always=True, depth=3, timeout=0,
                       release=self.reserved.release)

    def collate(self):
        produce = self.produce()
        return Collate(produce, Collator.for_batcher(self.batcher), self.reserved, LoaderStats(), self.policy.steps)

    def device(self):
        self.sim = SimGpu()
        return DevicePrefetcher(self.collate(), depth=2, ring=DeviceRing("cpu", streams=self.sim))

    def chain(self):
        batcher = Batcher(self.records, B, 0)
        order = Order(len(self.records), B, kind="random", seed=4)
        batcher.begin_iteration(0)
        return fast_iterator(plan=order, epoch=0, start=0, batcher=batcher, slots=SlotRing(batcher.new_slot),
                             progress=Progress(0, 0), policy=FillPolicy(), stats=LoaderStats(), length=len(order),
                             num_workers=2, depth=2, timeout=0, persistent=False)


STAGES = {
    "Jobs": lambda c: c.jobs(),
    "ReadAhead": lambda c: ReadAhead(c.jobs(), reading),
    "Fill": lambda c: c.fill(),
    "GroupFill": lambda c: c.group(),
    "Produce (producer thread)": lambda c: c.produce(),
    "Collate": lambda c: c.collate(),
    "DevicePrefetcher (simulated GPU)": lambda c: c.device(),
    "the whole chain": lambda c: c.chain(),
}


def take(stage, chain: Chain, k: int | None = None) -> list:
    """``k`` items of ``stage`` (all with None) as plain values; on the simulated GPU, after their copies ran."""
    out = []
    for item in itertools.islice(stage, k):
        if hasattr(chain, "sim"):
            chain.sim.run_all()
        out.append(plain(item))
    return out


@pytest.mark.parametrize("name", list(STAGES))
def test_each_stage_restored_at_every_position_gives_the_rest_of_its_stream(records, name):
    make = STAGES[name]
    c = Chain(records)
    whole = take(make(c), c)
    assert len(whole) == len(records) // B
    for p in range(len(whole) + 1):
        c = Chain(records)
        stage = make(c)
        assert take(stage, c, p) == whole[:p]
        state = json.loads(json.dumps(stage.state()))  # plain data
        stage.close()
        fresh = Chain(records)
        restored = make(fresh)
        restored.reset(state)
        assert take(restored, fresh) == whole[p:], f"{name}: restored at item {p}, the rest differs"
        restored.close()


PREFETCHING = ["ReadAhead", "GroupFill", "Produce (producer thread)", "DevicePrefetcher (simulated GPU)"]


@pytest.mark.parametrize("name", PREFETCHING)
def test_a_prefetching_stages_state_is_its_next_item_not_what_it_read_ahead(records, name):
    """After one item, the stage has read ahead (a read plan's look-ahead, a group's batches, a producer thread's
    queue, copies in flight): its first stage's position is still 1, the next item it hands out."""
    c = Chain(records)
    stage = STAGES[name](c)
    take(stage, c, 1)
    if name == "Produce (producer thread)":
        queue = stage.producer.queue
        for _ in range(200):  # the producer thread fills its queue
            if queue.qsize() >= 3:
                break
            time.sleep(0.01)
        assert queue.qsize() >= 2
    state = stage.state()
    while "source" in state:
        state = state["source"]
    assert state == {"epoch": 0, "batch": 1}
    stage.close()


def test_a_device_prefetcher_over_a_plain_iterable_cannot_reset():
    pf = DevicePrefetcher(iter([[torch.zeros(2)]]), depth=1, ring=DeviceRing("cpu", streams=SimGpu()))
    assert pf.state() == {}
    with pytest.raises(TypeError, match="cannot reset"):
        pf.reset({})
