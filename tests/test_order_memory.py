"""What fastload's orders keep per sample of the dataset (docs/guide/memory.md), with the occurrence words
(``_draws.py``) they key repeated reads by unchanged: a padded epoch's words kept for its few repeats (they were a
dense uint64 array, 8 bytes a position), a user sampler's rank word added per batch (it was kept for every
position), a bucket order's bucket ids in one byte a sample (8) and a rank's batches not holding every rank's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastload._draws import occurrences
from fastload._front.sampling import SamplerOrder
from fastload.fast.order import Order
from fastload.fast.packing import BucketOrder


def padded_words(order: Order, world: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s words written out: the epoch's global sequence wrapped to a multiple of the world size,
    each position's earlier equal positions, rank ``rank`` taking every ``world``-th."""
    seq = order._global_sequence(0)
    total = -(-len(seq) // world) * world
    padded = seq[np.arange(total) % len(seq)]
    return occurrences(padded)[rank::world].astype(np.uint64)


@pytest.mark.parametrize("kind", ["random", "quasi", "sequential"])
def test_a_padded_epochs_words_are_kept_for_its_repeats_alone(kind):
    n, world, batch = 10_003, 8, 64
    for rank in range(world):
        order = Order(n, batch, kind=kind, seed=3, rank=rank, world_size=world, shard_sizes=[4000, 6003])
        want = padded_words(order, world, rank)
        for i in range(order.num_batches(0)):
            got = order.batch_rng(0, i).occurrences
            part = want[i * batch : (i + 1) * batch]
            if part.any():
                assert got is not None and got.tolist() == part.tolist(), (rank, i)
            else:
                assert got is None or not got.any(), (rank, i)
        dense = order.occurrences(0)
        assert (dense is None and not want.any()) or dense.tolist() == want.tolist()
        kept = order._occ[1]
        assert kept is None or kept.nbytes <= 64, f"rank {rank}: {kept.nbytes} bytes kept for {world - 1} repeats"
    assert want.any()  # the last rank read padding


def test_words_of_many_repeats_stay_dense():
    """An order whose every sample repeats (a mix over a small dataset, here a sequence written out) keeps a dense
    array, no larger than before; the words are the same."""

    class Twice(Order):
        def _global_sequence(self, e):
            return np.arange(self.num_samples, dtype=np.int64) // 2

    order = Twice(1000, 10, rank=0, world_size=1)
    want = occurrences(np.arange(1000) // 2).astype(np.uint64)
    assert order.occurrences(0).tolist() == want.tolist()
    assert order.batch_rng(0, 3).occurrences.tolist() == want[30:40].tolist()
    assert order._occ[1].nbytes == 8 * 1000


@pytest.mark.parametrize("rank", [0, 3])
def test_a_user_samplers_rank_word_is_added_per_batch(rank):
    batches = [[0, 1, 2], [3, 0, 4], [5, 6]]
    order = SamplerOrder(torch.utils.data.BatchSampler(batches, 1, False), 3, 7, seed=1, rank=rank)
    order._draw = lambda: [np.array(b) for b in batches]  # this rank's epoch, as its sampler gives it
    list(order.batches(0, 0))
    word = rank << 32
    want = [[word] * 3, [word, word + 1, word], [word] * 2]
    for i, w in enumerate(want):
        got = order.batch_rng(0, i).occurrences
        assert (got is None and not any(w)) or got.tolist() == w
    held = sum(k.nbytes for k in order._occ[1] if isinstance(k, np.ndarray))
    assert held == 8 * 3, f"{held} bytes of words kept for one batch of 3 with a repeat"


def test_a_bucket_orders_samples_cost_a_byte_and_a_ranks_batches_only_its_own():
    n, world = 20_000, 4
    ids = np.random.default_rng(0).integers(0, 5, n)
    order = BucketOrder(ids, 16, kind="random", seed=2, rank=1, world_size=world)
    assert order.bucket_ids.nbytes == n and order.bucket_ids.tolist() == ids.tolist()
    batches = list(order.batches(0))
    held = {id(b.base if b.base is not None else b): (b.base if b.base is not None else b).nbytes for b in batches}
    assert sum(held.values()) <= 8 * (n // world + 16 * world), f"{sum(held.values())} bytes held by rank 1's batches"
    # the same epoch as the whole dataset's order: every sample once over the ranks, bucket by bucket
    every = np.concatenate(
        [np.concatenate(list(BucketOrder(ids, 16, kind="random", seed=2, rank=r, world_size=world).batches(0)))
         for r in range(world)]
    )
    assert np.array_equal(np.unique(every), np.arange(n))
    assert order._config()["buckets"] == BucketOrder(ids.astype(np.int64), 16, seed=2)._config()["buckets"]


def packed_batches_before(stream, lengths, tokens_per_batch, batch_ids, base=0):
    """``packing.packed_batches`` as it was (three arrays of the stream's length held while it runs): the
    reference its pieces are checked against."""
    lens = lengths[stream]
    ends = np.cumsum(lens)
    begins = ends - lens
    total = int(ends[-1]) if len(ends) else 0
    for b in batch_ids:
        lo, hi = base + b * tokens_per_batch, base + (b + 1) * tokens_per_batch
        first = int(np.searchsorted(ends, lo, side="right"))
        last = int(np.searchsorted(begins, hi, side="left"))
        sel = np.arange(first, last)
        sel = sel[lens[sel] > 0]
        piece_lo = np.maximum(begins[sel], lo)
        piece_hi = np.minimum(ends[sel], hi)
        yield stream[sel], piece_lo - begins[sel], piece_hi - piece_lo, piece_lo - lo, int(min(hi, total) - lo)


@pytest.mark.parametrize("seed", range(4))
def test_packed_batches_cut_the_stream_as_before(seed):
    from fastload.fast.packing import packed_batches

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    lengths = rng.integers(0, 40, n) * (rng.random(n) < 0.8)  # a fifth of the samples empty
    stream = rng.permutation(n)
    tpb = int(rng.integers(1, 100))
    base = int(rng.integers(0, 50))
    count = -(-max(int(lengths.sum()) - base, 0) // tpb) + 2  # past the end too
    ids = list(range(count)) + [0, count // 2]
    got = list(packed_batches(stream, lengths, tpb, ids, base))
    want = list(packed_batches_before(stream, lengths, tpb, ids, base))
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        parts = (g.samples, g.starts, g.lengths, g.dst)
        assert all(np.array_equal(a, b) for a, b in zip(parts, w[:4])) and g.real == w[4], f"batch {ids[k]}"


def test_packed_batches_hold_one_array_of_the_streams_length():
    import tracemalloc

    from fastload.fast.packing import packed_batches

    n = 200_000
    lengths = np.random.default_rng(0).integers(1, 100, n)
    stream = np.random.default_rng(1).permutation(n)
    tracemalloc.start()
    try:
        jobs = packed_batches(stream, lengths, 4096, range(10))
        next(jobs)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held <= 8 * n + 65536, f"{held} bytes held by the epoch's batch generator ({held / n:.1f} a sample)"


def occurrences_before(seq):
    """``_draws.occurrences`` as it was (about 49 bytes a position at its peak): the reference."""
    seq = np.asarray(seq).reshape(-1)
    n = seq.size
    out = np.zeros(n, dtype=np.int64)
    if n < 2:
        return out
    order = np.argsort(seq, kind="stable")
    ranked = seq[order]
    pos = np.arange(n, dtype=np.int64)
    first = np.ones(n, dtype=bool)
    first[1:] = ranked[1:] != ranked[:-1]
    out[order] = pos - np.maximum.accumulate(np.where(first, pos, 0))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_occurrences_are_as_before(seed):
    rng = np.random.default_rng(seed)
    cases = [np.zeros(0, np.int64), np.array([5]), np.array([2, 2]), np.full(50, 7), np.arange(40)[::-1]]
    cases += [rng.integers(0, k, int(rng.integers(2, 2000))).astype(dt) for k, dt in [(3, np.int64), (50, np.int32),
                                                                                        (1000, np.uint16)]]
    for seq in cases:
        assert occurrences(seq).tolist() == occurrences_before(seq).tolist(), seq.tolist()[:20]


def test_occurrences_peak_at_about_25_bytes_a_position():
    """A mix's epoch counts the occurrences over its whole global sequence, once per epoch (49 bytes a position
    at the peak before: more than torch's RandomSampler holds, a Python list of ints of about 40)."""
    import tracemalloc

    n = 500_000
    seq = np.random.default_rng(0).integers(0, n // 3, n)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        occurrences(seq)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 26 * n, f"{peak / n:.1f} bytes a position at the peak"
