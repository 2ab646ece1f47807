"""Elastic resume of the orders (``fast/elastic.py``): a position saved by N ranks at batch size B goes on over M
ranks at B'. Checked here on the orders alone, against properties that do not use the code's own split:
every sample of the epoch is read, none twice except the padding the new split adds (fewer than M), the new
ranks get equal batch counts, and the next epoch is a fresh M-rank order's. Real processes: test_elastic_dist.py."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from fastload.fast.order import KINDS, Order
from fastload.fast.mixing import MixOrder, Mixing
from fastload.fast.packing import BucketOrder, PackedOrder


def make(kind, world, rank, batch, drop_last=False, n=103, seed=7):
    return Order(n, batch, kind=kind, seed=seed, rank=rank, world_size=world, drop_last=drop_last,
                 shard_sizes=[10] * 10 + [3], window=3)


def run(orders, k=None):
    """Every rank's batches of its current epoch (the first ``k`` of them), as lists of ints."""
    out = []
    for o in orders:
        e = o.begin_epoch()
        bs = [b.tolist() for b in o.batches(e)]
        out.append(bs if k is None else bs[:k])
    return out


def flat(per_rank):
    return [i for batches in per_rank for b in batches for i in b]


def saved_and_resumed(kind, drop_last, old, new, k, as_list, epoch=2):
    (w, b), (w2, b2) = old, new
    saved = [make(kind, w, r, b, drop_last) for r in range(w)]
    for o in saved:
        o.set_epoch(epoch)
    got = run(saved, k)
    states = [json.loads(json.dumps(o.state_dict(k))) for o in saved]  # states survive JSON (and DCP's pickling)
    resumed = [make(kind, w2, r, b2, drop_last, seed=99) for r in range(w2)]
    for r, o in enumerate(resumed):
        o.load_state_dict(states if as_list else states[r % w])
    return got, run(resumed), resumed


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("old, new", [((4, 5), (2, 5)), ((2, 4), (3, 4)), ((3, 4), (3, 6)), ((1, 8), (4, 3))])
@pytest.mark.parametrize("as_list", [False, True])
def test_the_rest_of_the_epoch_is_split_over_the_new_ranks_once(kind, drop_last, old, new, as_list):
    n = 103
    for k in (1, 3):
        before, after, resumed = saved_and_resumed(kind, drop_last, old, new, k, as_list)
        first, rest = flat(before), flat(after)
        assert len(set(first)) == len(first)  # the saved part: no padding yet
        assert not set(first) & set(rest), "a sample consumed before the checkpoint was read again"
        counts = Counter(rest)
        m = n - len(set(first))
        lens = {len(a) for a in after}
        assert len(lens) == 1, f"the new ranks got unequal batch counts {[len(a) for a in after]}"
        assert all(len(bt) == new[1] for a in after for bt in a[:-1])
        if drop_last:
            assert max(counts.values()) == 1
            assert m - len(rest) < new[0] * (new[1] + 1)  # only what does not fill whole batches is dropped
            assert all(len(bt) == new[1] for a in after for bt in a)
        else:
            assert set(first) | set(rest) == set(range(n)), "a sample of the epoch was never read"
            assert len(rest) - m < new[0]  # padding: fewer than one per rank
        # the next epoch is a fresh M-rank run's
        fresh = [make(kind, new[0], r, new[1], drop_last, seed=7) for r in range(new[0])]
        for o in fresh:
            o.set_epoch(3)
        assert run(resumed) == run(fresh)


@pytest.mark.parametrize("kind", ["random", "quasi"])
def test_a_resumed_epoch_resumes_elastically_again(kind):
    """4 ranks -> 3 -> 2 within one epoch: the second state carries what was consumed before its split."""
    a = [make(kind, 4, r, 5) for r in range(4)]
    first = flat(run(a, 2))
    s1 = a[0].state_dict(2)
    b = [make(kind, 3, r, 4) for r in range(3)]
    for o in b:
        o.load_state_dict(s1)
    second = flat(run(b, 3))
    s2 = json.loads(json.dumps(b[1].state_dict(3)))
    assert s2["consumed"]
    c = [make(kind, 2, r, 7) for r in range(2)]
    for o in c:
        o.load_state_dict(s2)
    third = flat(run(c))
    read = first + second + third
    assert set(read) == set(range(103)) and len(read) - 103 < 2
    assert len(set(first + second)) == len(first + second)
    assert not set(first + second) & set(third)


def test_same_settings_go_on_exactly_as_the_uninterrupted_run():
    whole = [make("random", 3, r, 4) for r in range(3)]
    ref = run(whole)
    for r in range(3):
        o = make("random", 3, r, 4)
        o.load_state_dict(make("random", 3, 0, 4).state_dict(5))
        assert run([o]) == [ref[r][5:]]


def test_states_of_ranks_at_different_batches_load_as_a_list():
    saved = [make("random", 2, r, 4) for r in range(2)]
    got = run(saved)
    states = [saved[0].state_dict(3), saved[1].state_dict(5)]
    first = got[0][:3] + got[1][:5]
    resumed = [make("random", 2, r, 4) for r in range(2)]
    for o in resumed:
        o.load_state_dict(states)
    rest = flat(run(resumed))
    assert set(flat([first])) | set(rest) == set(range(103))
    assert not set(flat([first])) & set(rest)


def test_incomplete_or_mixed_lists_and_shard_splits_are_refused():
    saved = [make("random", 3, r, 4) for r in range(3)]
    states = [o.state_dict(2) for o in saved]
    with pytest.raises(ValueError, match=r"states of ranks \[0, 1\].*world_size=3.*all ranks 0 \.\. 2"):
        make("random", 2, 0, 4).load_state_dict(states[:2])
    other = make("random", 3, 2, 4)
    other.set_epoch(5)
    with pytest.raises(ValueError, match="not saved by the ranks of one loader at one step: they differ in epoch"):
        make("random", 2, 0, 4).load_state_dict(states[:2] + [other.state_dict(2)])
    with pytest.raises(ValueError, match="order='random'.*this loader has order='quasi'"):
        make("quasi", 2, 0, 4).load_state_dict(states[0])
    a = Order(20, 2, kind="random", seed=1, world_size=2, rank=1, shard_sizes=[5] * 4, split="shards")
    b = Order(20, 2, kind="random", seed=1, world_size=4, rank=1, shard_sizes=[5] * 4, split="shards")
    with pytest.raises(ValueError, match=r"world_size=2 \(processes\).*With split='shards' each rank orders its own"):
        b.load_state_dict(a.state_dict(1))
    ranks = [Order(20, 2, kind="random", seed=1, world_size=2, rank=r, shard_sizes=[5] * 4, split="shards")
             for r in range(2)]
    with pytest.raises(ValueError, match=r"different numbers of batches \(\[1, 2\]\).*split='shards'"):
        a.load_state_dict([ranks[0].state_dict(1), ranks[1].state_dict(2)])


def test_a_version_1_state_still_loads():
    o = make("random", 2, 0, 4)
    state = {k: v for k, v in o.state_dict(3).items() if k not in ("rank", "consumed")} | {"version": 1}
    r = make("random", 2, 1, 4)
    assert r.load_state_dict(state) == 3
    assert make("random", 4, 1, 4).load_state_dict(state) == 0  # elastic too


@pytest.mark.parametrize("drop_last", [False, True])
def test_bucket_order_resumes_elastically(drop_last):
    ids = np.random.default_rng(0).integers(0, 3, 97)
    def mk(w, r, b):
        return BucketOrder(ids, b, kind="random", seed=3, rank=r, world_size=w, drop_last=drop_last)
    saved = [mk(4, r, 4) for r in range(4)]
    before = run(saved, 2)
    resumed = [mk(3, r, 5) for r in range(3)]
    for o in resumed:
        o.load_state_dict(saved[0].state_dict(2))
    after = run(resumed)
    first, rest = flat(before), flat(after)
    assert not set(first) & set(rest)
    assert len({len(a) for a in after}) == 1
    assert all(len({int(ids[i]) for i in bt}) == 1 for a in after for bt in a)  # a batch stays in its bucket
    if not drop_last:
        assert set(first) | set(rest) == set(range(97))
    else:
        assert max(Counter(rest).values()) == 1


@pytest.mark.parametrize("drop_last", [False, True])
def test_packed_order_resumes_elastically_from_the_next_token(drop_last):
    lengths = np.random.default_rng(1).integers(1, 30, 60)
    def mk(w, r, tpb):
        return PackedOrder(lengths, tpb, kind="random", seed=2, rank=r, world_size=w, drop_last=drop_last)
    def tokens(orders, k=None):
        got = Counter()
        for o in orders:
            e = o.begin_epoch()
            for j, job in enumerate(o.batches(e)):
                if k is not None and j == k:
                    break
                for s, st, ln in zip(job.samples, job.starts, job.lengths):
                    got.update((int(s), t) for t in range(int(st), int(st + ln)))
        return got
    saved = [mk(4, r, 32) for r in range(4)]
    before = tokens(saved, 3)
    resumed = [mk(3, r, 48) for r in range(3)]
    for o in resumed:
        o.load_state_dict(json.loads(json.dumps(saved[2].state_dict(3))))
    assert len({o.num_batches() for o in resumed}) == 1
    after = tokens(resumed)
    assert not set(before) & set(after)
    everything = {(s, t) for s in range(60) for t in range(int(lengths[s]))}
    assert max(before.values()) == 1
    if not drop_last:
        assert set(before) | set(after) == everything
    else:
        assert max(after.values()) == 1 and len(everything) - len(before) - len(after) < 3 * 48


def test_the_batch_draws_of_a_resumed_epoch_repeat_none_of_the_consumed_batches():
    """MixUp/CutMix draw from the batch's generator, keyed by the global batch index: after an elastic resume the
    new batches must not take the keys (and so the mixing draws) of the batches read before the checkpoint."""
    saved = [make("random", 2, r, 4) for r in range(2)]
    for o in saved:
        o.set_epoch(1)
    before = {o.batch_rng(1, b).random() for o in saved for b in range(3)}
    resumed = [make("random", 3, r, 5) for r in range(3)]
    for o in resumed:
        o.load_state_dict(saved[0].state_dict(3, epoch=1))
        o.begin_epoch()
    after = [o.batch_rng(1, b).random() for o in resumed for b in range(o.num_batches())]
    assert not before & set(after) and len(set(after)) == len(after)
    packed = PackedOrder(np.full(40, 8), 16, kind="random", seed=2, rank=0, world_size=2)
    first = {packed.batch_rng(0, b).random() for b in range(2)}
    other = PackedOrder(np.full(40, 8), 16, kind="random", seed=2, rank=0, world_size=3)
    other.load_state_dict(packed.state_dict(2))
    assert not first & {other.batch_rng(0, b).random() for b in range(other.num_batches())}


def test_a_state_of_an_order_of_another_kind_is_refused_both_ways_naming_it():
    """A Bucket's, PackSequences' or mix's state holds a setting a plain order has not: loaded into a plain order of
    the same size (the transform taken off, the mix made one dataset) it went on at its batch count of another
    order, reading samples twice and skipping others; the other way round it was refused."""
    ids = np.arange(20) % 3
    pairs = [
        (BucketOrder(ids, 2, kind="random", seed=1), Order(20, 2, kind="random", seed=1), "transforms.Bucket"),
        (PackedOrder(np.full(20, 4), 8, kind="random", seed=1), Order(20, 1, kind="random", seed=1),
         "transforms.PackSequences"),
        (MixOrder(Mixing(["a"], [20], [1.0], 20), 2, seed=1), Order(20, 2, kind="random", seed=1), "a mix of 'a'"),
    ]
    for other, plain, named in pairs:
        with pytest.raises(ValueError, match=rf"saved by a loader with {named}.*open the dataset it was saved on"):
            plain.load_state_dict(other.state_dict(1))
        with pytest.raises(ValueError, match=rf"this loader has {named}"):
            other.load_state_dict(plain.state_dict(1))


def test_a_refused_split_names_the_default_it_was_saved_with():
    saved = Order(20, 2, kind="random", seed=1, world_size=1, shard_sizes=[5] * 4)
    shards = Order(20, 2, kind="random", seed=1, world_size=2, shard_sizes=[5] * 4, split="shards")
    with pytest.raises(ValueError, match=r"saved by a loader with split='samples'.*build this DataLoader with "
                                         r"split='samples'"):
        shards.load_state_dict(saved.state_dict(1))
