"""fast/packing.py: BucketOrder and PackedOrder on Order's one resume logic."""

from __future__ import annotations

import numpy as np
import pytest

from fastload._transforms.sequences import PackJob, cu_seqlens
from fastload.fast.packing import BucketOrder, PackedOrder, packed_batches

from .conftest import all_batches

LENGTHS = np.random.default_rng(0).integers(0, 40, 301)


def bucket(seed=0, rank=0, world=1, drop_last=False, kind="random"):
    return BucketOrder(LENGTHS // 10, 8, kind=kind, seed=seed, rank=rank, world_size=world, drop_last=drop_last)


def packed(seed=0, rank=0, world=1, drop_last=False, kind="random"):
    return PackedOrder(LENGTHS, 4 * 16, kind=kind, seed=seed, rank=rank, world_size=world, drop_last=drop_last)


@pytest.mark.parametrize("make", [bucket, packed])
@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_yields_exactly_the_remaining_batches(make, drop_last, check_save_load):
    for world in (1, 3):
        for rank in range(world):
            def one(seed, rank=rank, world=world):
                return make(seed=seed, rank=rank, world=world, drop_last=drop_last)
            n = len(one(0))
            for k in sorted({0, 1, n // 2, n - 1, n}):
                check_save_load(one, epoch=2, k=k)


@pytest.mark.parametrize("make", [bucket, packed])
def test_a_start_past_the_epoch_is_refused(make):
    order = make()
    with pytest.raises(ValueError, match="should be <= num_batches"):
        order.batches(0, len(order) + 1)


@pytest.mark.parametrize("make, what", [(bucket, "transforms.Bucket"), (packed, "transforms.PackSequences")])
def test_a_state_of_other_lengths_is_refused(make, what):
    state = make().state_dict(1, 0)
    other = BucketOrder(LENGTHS // 5, 8, kind="random") if make is bucket else \
        PackedOrder(LENGTHS + 1, 4 * 16, kind="random")
    with pytest.raises(ValueError, match=what):
        other.load_state_dict(state)


def test_a_bucket_batch_holds_one_bucket_and_ranks_split_batches():
    ids = LENGTHS // 10
    ranks = [all_batches(bucket(rank=r, world=3), 0) for r in range(3)]
    assert len({len(r) for r in ranks}) == 1
    for batches in ranks:
        assert all(len(set(ids[list(b)])) == 1 for b in batches)


def test_packed_batches_cover_the_token_stream_once():
    order = packed()
    jobs = list(order.batches(0, 0))
    assert all(isinstance(j, PackJob) for j in jobs)
    assert sum(int(j.lengths.sum()) for j in jobs) == int(LENGTHS.sum())
    ranks = [list(packed(rank=r, world=2).batches(0, 0)) for r in range(2)]
    assert [j.real for j in jobs[0::2]] == [j.real for j in ranks[0]]  # global batch b goes to rank b % world


def test_cu_seqlens_cut_at_pieces_and_rows():
    job = next(packed_batches(np.array([0, 1]), np.array([5, 7]), 8, [0]))
    assert cu_seqlens(job, 4).tolist() == [0, 4, 5, 8]
