"""fastload/fast/group.py: cheap batches filled several at a time into one group slot hand out the same batches
(content, order, the last partial one, drop_last, a rank's share, resume) as one batch per fill, and a group
slot is refilled only when no batch of it is viewed and its last batch was collated."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch

import fastload
from fastload._fill.batcher import Batcher
from fastload._ring import SlotRing
from fastload._front.stats import LoaderStats
from fastload.fast import group as group_mod
from fastload.fast import order as order_mod
from fastload.fast.collate import Collate, Collator
from fastload.fast.fill import Fill, Reservations
from fastload.fast.group import GroupFill, group_ring, group_size
from fastload.fast.order import Jobs, Order
from fastload.fast.producer import FillPolicy

from .stages_common import Handed


def _batches(loader, hold: bool = True) -> list:
    """Every batch as numpy copies; ``hold``: keep the loader's own tensors alive until the end (a group slot
    refilled under a live view would change a batch kept earlier)."""
    kept, copies = [], []
    for tokens, labels in loader:
        copies.append((tokens.numpy().copy(), labels.numpy().copy()))
        if hold:
            kept.append((tokens, labels))
    if hold:
        for (t, lab), (ct, cl) in zip(kept, copies):
            assert np.array_equal(t.numpy(), ct) and np.array_equal(lab.numpy(), cl)
    return copies


def _same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for (ta, la), (tb, lb) in zip(a, b):
        assert np.array_equal(ta, tb) and np.array_equal(la, lb)


@pytest.fixture
def ungrouped(monkeypatch):
    """A context in which the chain fills one batch per slot (the reference)."""

    def run(fn):
        with monkeypatch.context() as m:
            m.setattr(group_mod, "MAX_GROUP", 1)
            return fn()

    return run


@pytest.mark.parametrize("batch", [7, 16, 333, 2000, 2500])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_grouped_batches_are_the_ungrouped_ones(records, ungrouped, batch, drop_last, workers):
    def make():
        return fastload.DataLoader(records, batch_size=batch, shuffle=True, num_workers=workers,
                                   drop_last=drop_last, seed=3)

    want = ungrouped(lambda: [_batches(make()) for _ in range(1)][0])
    loader = make()
    assert group_size(loader._batcher, remote=False, device=False) > 1
    got = _batches(loader)
    _same(got, want)
    if got:
        assert loader._ring.groups, "the group fill did not engage"
    # and epoch after epoch with the batches let go at once (the group slots are reused)
    want2 = ungrouped(lambda: (lambda ld: (_batches(ld, hold=False), _batches(ld, hold=False)))(make()))
    ld = make()
    _same(_batches(ld, hold=False), want2[0])
    _same(_batches(ld, hold=False), want2[1])
    assert len(ld._ring) <= 3, "group slots were not reused once nothing viewed them"


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_grouped_ranks_get_their_ungrouped_share(records, ungrouped, rank):
    def make():
        return fastload.DataLoader(records, batch_size=50, shuffle=True, rank=rank, world_size=3, seed=5)

    _same(_batches(make()), ungrouped(lambda: _batches(make())))


@pytest.mark.parametrize("k", [1, 5, 8, 13])
def test_resume_mid_group_gives_the_rest(records, ungrouped, k):
    """A state taken after ``k`` batches (inside a group: 8 batches of 16 per fill) resumes at batch ``k``."""

    def make():
        return fastload.DataLoader(records, batch_size=16, shuffle=True, seed=9)

    want = ungrouped(lambda: _batches(make()))
    loader = make()
    it = iter(loader)
    for _ in range(k):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    fresh = make()
    fresh.load_state_dict(state)
    _same(_batches(fresh), want[k:])


def _stage(records, batch=16):
    batcher = Batcher(records, batch, 0)
    order = Order(len(records), batch, kind="random", seed=1)
    reserved = Reservations()
    size = group_size(batcher, remote=False, device=False)
    ring = group_ring(SlotRing(batcher.new_slot), batcher, size)
    fill = GroupFill(Jobs(order, 0, 0, needs_rng=False), batcher, batcher.pool, ring, reserved, FillPolicy().fills,
                     size)
    return batcher, order, reserved, ring, fill, size


def test_group_state_counts_the_batches_held_back_and_reset_resumes_there(records):
    batcher, order, reserved, ring, fill, size = _stage(records)
    assert size == 8
    plain = Fill(Jobs(order, 0, 0, needs_rng=False), batcher, batcher.pool, SlotRing(batcher.new_slot),
                 Reservations(), FillPolicy().fills)
    for _ in range(3):
        next(fill), next(plain)
    assert fill.state() == plain.state() == {"source": {"epoch": 0, "batch": 3}}
    state = fill.state()
    next(fill)
    fill.reset(state)
    assert not reserved.ids, "a reset kept the dropped group reserved"
    m, n, _, _ = next(fill)
    rows = m.tensors["label"][:n].clone()
    assert torch.equal(rows, torch.from_numpy(np.array(next(iter(order.batches(0, 3))))))


def test_a_group_stays_reserved_until_its_last_batch_is_collated(records):
    batcher, order, reserved, ring, fill, size = _stage(records)
    items = [next(fill) for _ in range(size)]
    (g,) = {id(m.group) for m, *_ in items}
    assert reserved.ids == {g} and len(ring) == 1

    stats = LoaderStats()
    collate = Collate(Handed(items), Collator.for_batcher(batcher), reserved, stats, FillPolicy().steps)
    for _ in range(size - 1):
        next(collate)  # dropped at once: nothing views the group, yet its later batches are not collated
        assert reserved.ids == {g}
        assert ring.acquire(reserved.ids) is not items[0][0].group  # not handed out again
    last = next(collate)
    assert not reserved.ids
    assert items[0][0].group.held()  # the caller's last batch views it
    del last
    assert not items[0][0].group.held()
    assert stats.batches == size


def test_an_epoch_prepared_in_the_background_is_the_epoch_computed_in_place(monkeypatch):
    import pickle

    monkeypatch.setattr(order_mod, "PREPARE_FROM", 0)  # a thread even for this small order

    def make():
        return Order(10_000, 64, kind="random", seed=4, rank=1, world_size=3)

    a = make()
    a.prepare(2)
    b = pickle.loads(pickle.dumps(a))  # the thread does not travel; the copy computes in place
    assert b._ahead == {}
    want = make().indices(2)
    assert np.array_equal(a.indices(2), want) and a._ahead == {}  # taken from the background thread
    assert np.array_equal(b.indices(2), want)
    a.prepare(3)
    a.set_epoch(5)  # the epoch set is not the one prepared: computed in place
    assert np.array_equal(a.indices(), make().indices(5))


def test_the_loader_prepares_the_next_epoch_and_its_batches_stay_the_same(records, ungrouped, monkeypatch):
    monkeypatch.setattr(order_mod, "PREPARE_FROM", 0)  # a thread even for this small order

    def make():
        return fastload.DataLoader(records, batch_size=100, shuffle=True, seed=8)

    want = ungrouped(lambda: (lambda ld: [_batches(ld) for _ in range(3)])(make()))
    loader = make()
    got = []
    for e in range(3):
        got.append(_batches(loader))
        assert e + 1 in loader._order._ahead
    for a, b in zip(got, want):
        _same(a, b)


def test_the_loader_uses_each_epoch_it_prepared_instead_of_computing_it_again(records, monkeypatch):
    """Every epoch after the first is shuffled in the background thread only: the chain asks an epoch's indices at
    its first batch, after the loader prepared the next epoch, and that second prepare replaced the first, so every
    epoch was computed twice, once in the loop's thread (tiny records fell from 0.93 to 0.66 of the gather
    ceiling)."""
    import threading

    monkeypatch.setattr(order_mod, "PREPARE_FROM", 0)  # a thread even for this small order
    in_loop = []
    compute = Order._compute

    def counted(self, e):
        if threading.current_thread() is threading.main_thread():
            in_loop.append(e)
        return compute(self, e)

    monkeypatch.setattr(Order, "_compute", counted)
    loader = fastload.DataLoader(records, batch_size=100, shuffle=True, seed=8)
    for _ in range(4):
        _batches(loader)
    assert in_loop == [0]


def test_a_small_order_is_not_prepared_in_a_thread_and_its_epochs_stay_the_same(records, monkeypatch):
    # starting a thread costs more than shuffling a small order: computed in place when asked
    def make():
        return Order(order_mod.PREPARE_FROM - 1, 64, kind="random", seed=4, rank=1, world_size=3)

    started = []
    real_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: (started.append(self.name), real_start(self))[1])
    a = make()
    a.prepare(2)
    assert a._ahead == {} and "fastload-order" not in started
    assert np.array_equal(a.indices(2), make().indices(2))
    big = Order(order_mod.PREPARE_FROM, 64, kind="random", seed=4)
    big.prepare(1)  # from the threshold on, in the background
    assert 1 in big._ahead and "fastload-order" in started
    assert np.array_equal(big.indices(1), Order(order_mod.PREPARE_FROM, 64, kind="random", seed=4).indices(1))
    loader = fastload.DataLoader(records, batch_size=100, shuffle=True, seed=8)
    _batches(loader)
    assert loader._order._ahead == {}  # the loader asked (records is small): nothing started


def test_a_batch_larger_than_the_slots_is_refused_not_written_into_the_next(records):
    batcher = Batcher(records, 16, 0)
    ring = group_ring(SlotRing(batcher.new_slot), batcher, 4)
    jobs = Jobs(Order(len(records), 17, kind="sequential"), 0, 0, needs_rng=False)
    fill = GroupFill(jobs, batcher, batcher.pool, ring, Reservations(), FillPolicy().fills, 4)
    with pytest.raises(ValueError, match="17 indices for slots of batch_size=16"):
        next(fill)
