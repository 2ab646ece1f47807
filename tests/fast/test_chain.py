"""fastload/fast/chain.py: ``fast_iterator`` wires the stages (each built from its upstream and collaborators,
never a loader; one file per stage beside this one) to the same batches the loader gives."""

from __future__ import annotations

import pytest
import torch

import fastload
from fastload._fill.batcher import Batcher
from fastload._ring import SlotRing
from fastload._front.stats import LoaderStats
from fastload.fast.chain import fast_iterator
from fastload.fast.order import Order
from fastload.fast.position import Progress
from fastload.fast.producer import FillPolicy


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


def _attrs(obj) -> dict:
    """``obj``'s attributes, each by identity (and by value for plain numbers and strings)."""
    names = vars(obj) if hasattr(obj, "__dict__") else {k: getattr(obj, k) for k in type(obj).__slots__}
    return {k: (id(v), v if isinstance(v, (bool, int, float, str, type(None))) else None) for k, v in names.items()}


def test_the_builder_changes_nothing_it_is_given(records):
    """``fast_iterator`` creates the stages and sets nothing on what it is handed (it used to bound the host ring,
    bind the decoders' device and fork the per-sample transform workers: the loader does that where it makes them)."""
    batcher = Batcher(records, 300, 0)
    order = Order(len(records), 300, kind="random", seed=9)
    slots, policy, stats, progress = SlotRing(batcher.new_slot), FillPolicy(), LoaderStats(), Progress(0, 0)
    batcher.begin_iteration(0)  # as the loader does before it asks for the chain (its pool exists from here)
    given = [batcher, batcher.images, order, slots, policy, stats, progress]
    before = [_attrs(o) for o in given]
    it = fast_iterator(plan=order, epoch=0, start=0, batcher=batcher, slots=slots, progress=progress, policy=policy,
                       stats=stats, length=len(order), num_workers=2, depth=2, timeout=0, persistent=False)
    assert [_attrs(o) for o in given] == before
    it.close()


def test_an_order_made_for_another_rank_keeps_its_split_and_shards():
    """accelerate retargets a loader built before the process group (``for_rank``): an explicit split='shards'
    was dropped (the new rank read strided samples from every shard, not its own shards)."""
    from fastload.fast.chain import for_rank

    built = Order(20, 2, kind="random", seed=1, shard_sizes=[5] * 4, split="shards")
    for rank in range(2):
        made = for_rank(built, rank, 2)
        want = Order(20, 2, kind="random", seed=1, rank=rank, world_size=2, shard_sizes=[5] * 4, split="shards")
        assert made.split == "shards" and list(made.shard_sizes) == [5] * 4
        assert list(made.indices(0)) == list(want.indices(0))
    plain = for_rank(Order(20, 2, kind="random", seed=1), 1, 2)
    assert plain.split == "samples"
    assert list(plain.indices(0)) == list(Order(20, 2, kind="random", seed=1, rank=1, world_size=2).indices(0))


def test_a_remote_dataset_s_default_split_follows_the_world_it_is_retargeted_to():
    """``remote_shards`` (a remote dataset whose split was not given): whole shards per rank on several ranks,
    strided samples on one, strided samples with a warning where there are fewer shards than ranks."""
    from fastload.fast.chain import for_rank

    built = Order(20, 2, kind="random", seed=1)  # made on one process: the default was 'samples'
    for rank in range(2):
        made = for_rank(built, rank, 2, remote_shards=[5] * 4)
        want = Order(20, 2, kind="random", seed=1, rank=rank, world_size=2, shard_sizes=[5] * 4, split="shards")
        assert made.split == "shards" and list(made.indices(0)) == list(want.indices(0))
        assert for_rank(made, 0, 1, remote_shards=[5] * 4).split == "samples"
    with pytest.warns(RuntimeWarning, match="cannot apply here"):
        assert for_rank(built, 0, 5, remote_shards=[5] * 4).split == "samples"
