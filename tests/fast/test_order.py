"""Order: permutations, DistributedSampler-compatible rank split, resume, quasi-random bounds, batch RNGs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DistributedSampler

from fastload.fast.order import DEFAULT_BLOCK, KINDS, Jobs, Order, default_seed, dist_info


def all_batches(order: Order, epoch: int) -> list[np.ndarray]:
    return [b.copy() for b in order.batches(epoch)]


def shard_ids(indices: np.ndarray, shard_sizes) -> np.ndarray:
    return np.searchsorted(np.cumsum(shard_sizes), indices, side="right")


# -- kinds -------------------------------------------------------------------------------------
def test_sequential_is_arange():
    o = Order(1000, 32)
    assert np.array_equal(o.indices(0), np.arange(1000))
    assert np.array_equal(o.indices(5), np.arange(1000))
    assert o.indices(0).dtype == np.int64
    assert [len(b) for b in o.batches()] == [32] * 31 + [8]


def test_random_is_a_permutation_keyed_by_seed_and_epoch():
    o = Order(5000, 64, kind="random", seed=7)
    a, b = o.indices(0), o.indices(1)
    assert a.dtype == np.int64
    assert np.array_equal(np.sort(a), np.arange(5000)) and np.array_equal(np.sort(b), np.arange(5000))
    assert not np.array_equal(a, b)
    assert not np.array_equal(a, Order(5000, 64, kind="random", seed=8).indices(0))
    assert np.array_equal(a, Order(5000, 64, kind="random", seed=7).indices(0))  # a fresh object agrees
    assert np.array_equal(b, Order(5000, 64, kind="random", seed=7).indices(1))
    # batch size and drop_last only cut the same sequence
    assert np.array_equal(Order(5000, 7, kind="random", seed=7).indices(1), b)


def test_indices_are_read_only():
    idx = Order(100, 10, kind="random").indices(0)
    with pytest.raises(ValueError):
        idx[0] = 1


# -- distributed -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n", [0, 1, 5, 37, 103, 1000])
def test_ranks_equal_disjoint_complete_like_distributed_sampler(kind, drop_last, n):
    for world in range(1, 9):
        for batch_size in (1, 4, 10):
            orders = [Order(n, batch_size, kind=kind, seed=3, rank=r, world_size=world, drop_last=drop_last,
                            shard_sizes=[n // 2, n - n // 2], window=1) for r in range(world)]
            nb = {len(o) for o in orders}
            assert len(nb) == 1  # every rank the same number of batches
            per_rank = [np.concatenate(all_batches(o, 2) or [np.zeros(0, np.int64)]) for o in orders]
            for r, o in enumerate(orders):
                ref = DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=False, drop_last=drop_last)
                ref_batches = list(BatchSampler(ref, batch_size, drop_last))
                assert len(o) == len(ref_batches)
                assert len(per_rank[r]) == sum(len(b) for b in ref_batches)
                if kind == "sequential":
                    assert [b.tolist() for b in all_batches(o, 2)] == ref_batches
            union = np.concatenate(per_rank)
            uniq = np.unique(union)
            if drop_last:
                assert len(uniq) == len(union)  # disjoint, nothing padded
                assert len(union) >= n - world * batch_size  # only the tails are dropped
            else:
                assert np.array_equal(uniq, np.arange(n))  # complete
                assert len(union) - n == (-n) % world  # the only repeats are the wrap padding


def test_padding_wraps_to_the_start_of_the_epoch():
    n, world = 10, 4
    glob = Order(n, 1, kind="random", seed=1).indices(0)
    mine = [Order(n, 100, kind="random", seed=1, rank=r, world_size=world).indices(0) for r in range(world)]
    assert [m.tolist() for m in mine] == [np.resize(glob, 12)[r::world].tolist() for r in range(world)]


def test_dist_info(monkeypatch):
    assert dist_info() == (0, 1)
    assert dist_info(2, 4) == (2, 4)
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 3)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 8)
    assert dist_info() == (3, 8)
    assert dist_info(rank=1) == (1, 8)
    with pytest.raises(ValueError, match="rank=4 should be < world_size=4"):
        dist_info(4, 4)
    with pytest.raises(ValueError, match="world_size=0"):
        dist_info(0, 0)


def test_default_seed():
    a = default_seed(torch.Generator().manual_seed(1))
    assert a == default_seed(torch.Generator().manual_seed(1)) and 0 <= a < 2**63
    assert a != default_seed(torch.Generator().manual_seed(2))
    torch.manual_seed(5)
    b = default_seed()
    torch.manual_seed(5)
    assert b == default_seed()


# -- resume ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_yields_exactly_the_remaining_batches(kind, drop_last, check_save_load):
    pick = np.random.default_rng(0)
    for world in (1, 3):
        for rank in range(world):
            def make(seed, rank=rank, world=world):
                return Order(1003, 16, kind=kind, seed=seed, rank=rank, world_size=world, drop_last=drop_last,
                             shard_sizes=[100] * 10 + [3], window=3)
            n = len(make(0))
            for k in [0, n] + pick.integers(1, n, size=4).tolist():
                check_save_load(make, int(pick.integers(0, 5)), int(k))


def test_state_from_other_rank_loads():
    a = Order(100, 8, kind="random", seed=4, rank=0, world_size=2)
    a.set_epoch(3)
    b = Order(100, 8, kind="random", seed=5, rank=1, world_size=2)
    b.load_state_dict(a.state_dict(2))
    ref = Order(100, 8, kind="random", seed=4, rank=1, world_size=2)
    assert b.begin_epoch() == 3
    assert [x.tolist() for x in b.batches()] == [x.tolist() for x in all_batches(ref, 3)[2:]]


@pytest.mark.parametrize("other, field", [
    (dict(kind="sequential"), r"order='quasi'.*this loader has order='sequential'"),
    (dict(num_samples=101), r"a dataset of 100 samples.*this loader has a dataset of 101 samples.*open the dataset it "
                            r"was saved on"),
    (dict(window=2), r"window=3.*window=2"),
    (dict(shard_sizes=[50, 50]), r"a dataset of 4 shards.*a dataset of 2 shards"),
])
def test_state_from_a_different_order_is_refused(other, field):
    base = dict(num_samples=100, batch_size=8, kind="quasi", world_size=2, shard_sizes=[25] * 4, window=3)
    state = Order(**base).state_dict(3)
    cfg = {**base, **other}
    if cfg["num_samples"] != 100:
        cfg["shard_sizes"] = None
    with pytest.raises(ValueError, match=f"cannot resume from this state: it was saved by a loader with .*{field}"):
        Order(**cfg).load_state_dict(state)
    with pytest.raises(ValueError, match=r"not a saved loader position .*loader.state_dict\(\) returned"):
        Order(**base).load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match="batches_done=99 should be <= num_batches"):
        Order(**base).state_dict(99)


def test_begin_epoch_advances_unless_set():
    o = Order(10, 2, kind="random")
    assert [o.begin_epoch() for _ in range(3)] == [0, 1, 2]
    o.set_epoch(7)
    assert o.begin_epoch() == 7 and o.epoch == 7
    o.set_epoch(7)
    assert o.begin_epoch() == 7  # set explicitly every time: stays, like DistributedSampler
    assert o.begin_epoch() == 8


# -- quasi-random ------------------------------------------------------------------------------
def test_quasi_is_a_permutation():
    for sizes in ([DEFAULT_BLOCK] * 2 + [1808], [0, 5, 0, 300, 1, 0, 9694], [10_000]):
        o = Order(10_000, 100, kind="quasi", seed=2, shard_sizes=sizes if sizes[0] != DEFAULT_BLOCK else None)
        a, b = o.indices(0), o.indices(1)
        assert np.array_equal(np.sort(a), np.arange(10_000)) and not np.array_equal(a, b)
    assert np.array_equal(Order(0, 4, kind="quasi").indices(0), np.zeros(0))


@pytest.mark.parametrize("world", [1, 2, 5])
@pytest.mark.parametrize("window", [1, 3, 8])
def test_quasi_memory_bound(world, window):
    """At most ``window`` shards open at any point on any rank; phases in order; runs of batches bounded."""
    sizes = np.random.default_rng(window).integers(40, 200, size=50)
    n, batch = int(sizes.sum()), 8
    for rank in range(world):
        o = Order(n, batch, kind="quasi", seed=9, rank=rank, world_size=world, shard_sizes=sizes, window=window)
        for epoch in range(2):
            idx = o.indices(epoch)[: n // world]  # leave out the (at most one) wrap-padding sample
            sh = shard_ids(idx, sizes)
            first = {s: i for i, s in reversed(list(enumerate(sh)))}
            last = {s: i for i, s in enumerate(sh)}
            opened = np.zeros(len(sh) + 1, np.int64)
            for s in first:
                opened[first[s]] += 1
                opened[last[s] + 1] -= 1
            assert np.cumsum(opened).max() <= window
            # phases: shards by first appearance, in groups of `window`; the phase never goes back
            phase_of = {s: j // window for j, s in enumerate(sorted(first, key=first.get))}
            phase = np.array([phase_of[s] for s in sh])
            assert np.all(np.diff(phase) >= 0)
            for span in (1, 2, 5):  # any run of consecutive batches: <= window * phases it overlaps
                for b in range(len(sh) // batch - span + 1):
                    run = slice(b * batch, (b + span) * batch)
                    overlap = phase[run].max() - phase[run].min() + 1
                    assert len(np.unique(sh[run])) <= window * overlap
                    if span == 1 and batch * world <= 40:
                        assert overlap <= 2


def class_chi2(batches: list[np.ndarray], labels: np.ndarray, k: int) -> float:
    """Mean over batches of sum((count - expected)^2 / expected) of the per-batch class histogram."""
    stats = []
    for b in batches:
        counts = np.bincount(labels[b], minlength=k)
        exp = len(b) / k
        stats.append(((counts - exp) ** 2 / exp).sum())
    return float(np.mean(stats))


def test_shuffle_quality_on_class_sorted_data():
    # 10 classes of 2,000 samples stored sorted by class, 40 shards of 500 (4 per class), batches of 100.
    # Measure: mean chi-square of the per-batch class histogram against the uniform one.
    # A true permutation gives (k - 1) (n - B) / (n - 1) = 8.96 on average; sequential gives B (k - 1) = 900.
    k, per, batch = 10, 2000, 100
    n = k * per
    labels = np.repeat(np.arange(k), per)
    sizes = [500] * 40
    stat = {}
    for kind in KINDS:
        o = Order(n, batch, kind=kind, seed=1, shard_sizes=sizes, window=8)
        stat[kind] = np.mean([class_chi2(all_batches(o, e), labels, k) for e in range(3)])
    true = np.mean([class_chi2(np.split(np.random.default_rng(s).permutation(n), n // batch), labels, k)
                    for s in range(3)])
    assert stat["sequential"] == pytest.approx(900)
    assert abs(stat["random"] - 8.96) < 1.5 and abs(true - 8.96) < 1.5
    # quasi (window 8 of 40 shards: ~6 classes per phase) mixes far better than sequential, worse than random
    assert stat["quasi"] < stat["sequential"] / 5
    assert stat["quasi"] > stat["random"]


# -- batch RNG ---------------------------------------------------------------------------------
def test_batch_rng_is_deterministic_and_distinct():
    def draw(seed=0, rank=0, epoch=0, batch=0):
        o = Order(100, 10, kind="random", seed=seed, rank=rank, world_size=4)
        return o.batch_rng(epoch, batch).integers(0, 2**62, size=4).tolist()

    assert draw() == draw()
    seen = {tuple(draw(**kw)) for kw in
            [{}, {"seed": 1}, {"rank": 1}, {"epoch": 1}, {"batch": 1}, {"seed": 2**32}, {"epoch": 2**32},
             {"batch": 1, "epoch": 1}]}
    assert len(seen) == 8
    o = Order(100, 10, kind="random")
    assert not np.array_equal(o.batch_rng(0, 0).permutation(100), o.indices(0))  # another stream


def test_batch_rng_is_keyed_by_the_global_batch_index():
    """MixUp/CutMix draw from the batch's generator, keyed by (seed, epoch, batch * world + rank): rank 1's batch 0
    of 2 ranks is global batch 1, as a single rank's batch 1; the samples' draws (``_draws.py``) do not use it."""
    def draw(rank, world, batch):
        return Order(100, 10, kind="random", seed=3, rank=rank, world_size=world).batch_rng(0, batch).random(3).tolist()

    assert draw(1, 2, 0) == draw(0, 1, 1) == draw(1, 4, 0)
    assert draw(1, 2, 1) == draw(0, 1, 3) == draw(3, 4, 0)
    assert draw(0, 2, 1) != draw(1, 2, 0)


# -- arguments ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    (dict(batch_size=0), "batch_size=0 should be >= 1"),
    (dict(batch_size=True), "batch_size=True should be an integer"),
    (dict(batch_size=2.5), "batch_size=2.5 should be an integer"),
    (dict(num_samples=-1), "num_samples=-1 should be >= 0"),
    (dict(kind="shuffle"), "order='shuffle' should be one of"),
    (dict(seed=-3), "seed=-3 should be >= 0"),
    (dict(rank=2, world_size=2), "rank=2 should be < world_size=2"),
    (dict(window=0), "window=0 should be >= 1"),
    (dict(drop_last="yes"), "drop_last='yes' should be a bool"),
    (dict(shard_sizes=[5, 5]), "shard_sizes sum to 10 but num_samples=20"),
    (dict(shard_sizes=[25, -5]), "shard_sizes should be a 1-d sequence"),
])
def test_bad_arguments(kwargs, message):
    args = {"num_samples": 20, "batch_size": 4, **kwargs}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        Order(**args)


def test_bad_positions():
    o = Order(20, 4)
    with pytest.raises(ValueError, match="epoch=-1 should be >= 0"):
        o.set_epoch(-1)
    with pytest.raises(ValueError, match="start=6 should be <= num_batches=5"):
        o.batches(0, start=6)
    with pytest.raises(ValueError, match="batch_index=-2 should be >= 0"):
        o.batch_rng(0, -2)


def test_state_dict_of_an_explicit_epoch():
    a = Order(50, 4, kind="random", seed=2)
    rest = all_batches(a, 6)[3:]
    b = Order(50, 4, kind="random", seed=0)
    b.load_state_dict(a.state_dict(3, epoch=6))
    assert b.epoch == 6 and [x.tolist() for x in b.batches()] == [x.tolist() for x in rest]


@pytest.mark.parametrize("kind", ["sequential", "random", "quasi"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_shard_split_gives_each_rank_its_own_shards(kind, drop_last):
    sizes = [7, 7, 7, 7, 7, 3, 9, 1]
    n = sum(sizes)
    shard_of = np.repeat(np.arange(len(sizes)), sizes)
    for world in range(1, 6):
        orders = [Order(n, 4, kind=kind, seed=5, rank=r, world_size=world, drop_last=drop_last, shard_sizes=sizes,
                        window=2, split="shards") for r in range(world)]
        assert len({len(o) for o in orders}) == 1  # the same number of batches on every rank
        for epoch in range(2):
            mine = [o.indices(epoch) for o in orders]
            owners = [set(shard_of[m].tolist()) for m in mine]
            assert all(not (a & b) for i, a in enumerate(owners) for b in owners[i + 1:])  # disjoint shards
            union = np.concatenate(mine)
            if not drop_last:
                assert set(union.tolist()) == set(range(n))  # nothing dropped; only wrap padding repeats
            assert all(len(b) == 4 for o in orders for b in o.batches(epoch)) if drop_last else True
            for o, m in zip(orders, mine):  # within a rank each own sample appears, then wrap padding
                own = np.flatnonzero(np.isin(shard_of, sorted(set(shard_of[m].tolist()))))
                assert set(m.tolist()) <= set(own.tolist())
                if not drop_last:
                    assert len(set(m.tolist())) == len(own)
        if kind != "sequential" and world > 1:
            assert not np.array_equal(orders[0].indices(0), orders[0].indices(1))  # reshuffled each epoch


def test_shard_split_needs_a_shard_per_rank_and_resumes_only_as_itself():
    with pytest.raises(ValueError, match="at least one per rank"):
        Order(10, 2, world_size=4, rank=0, shard_sizes=[5, 5], split="shards")
    with pytest.raises(ValueError, match="split="):
        Order(10, 2, split="rows")
    a = Order(20, 2, kind="random", seed=1, world_size=2, rank=1, shard_sizes=[5, 5, 5, 5], split="shards")
    b = Order(20, 2, kind="random", seed=1, world_size=2, rank=1, shard_sizes=[5, 5, 5, 5])
    state = a.state_dict(3)
    with pytest.raises(ValueError, match="split"):
        b.load_state_dict(state)
    c = Order(20, 2, kind="random", seed=9, world_size=2, rank=0, shard_sizes=[5, 5, 5, 5], split="shards")
    assert c.load_state_dict(state) == 3


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
