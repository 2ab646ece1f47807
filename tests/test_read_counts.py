"""The reads counted per sample under torch's DataLoader (``Dataset.__getitems__``, ``_front/getitems.py``): the
occurrence words of a batch are what a dense count per sample gives, in about one byte per sample of the dataset.
The count was a dense uint32 array per torch fetcher, in every worker: 400 MB per worker at 100M samples."""

from __future__ import annotations

import numpy as np
import pytest

import fastload
from fastload._draws import ReadCounts, occurrences
from fastload._front.getitems import _state

pytest.importorskip("fastload._C")


class Fetcher:
    """Stands for torch's ``_MapDatasetFetcher``: the counts are kept per fetcher object (weakly)."""


def dense_words(batches: list[np.ndarray], length: int, rank_word: int = 0) -> list[np.ndarray | None]:
    """The occurrence words as the dense count computed them: per batch, each position's earlier equal positions
    in the batch plus the sample's reads in the earlier batches, plus the rank word; None where all are 0."""
    counts = np.zeros(length, dtype=np.uint32)
    out = []
    for idx in batches:
        occ = occurrences(idx).astype(np.uint64) + counts[idx] + np.uint64(rank_word)
        np.add.at(counts, idx, 1)
        out.append(occ if occ.any() else None)
    return out


def heavy_repeats(rng: np.random.Generator, length: int) -> list[np.ndarray]:
    """Batches of random sizes drawn from a few hot samples and the rest: sample 3 is read over 600 times (past the
    one-byte count twice), several others past 255, and some in long runs within one batch."""
    batches = []
    for _ in range(300):
        size = int(rng.integers(1, 40))
        hot = rng.integers(0, 4, size)
        cold = rng.integers(0, length, size)
        batches.append(np.where(rng.random(size) < 0.6, hot, cold).astype(np.int64))
    batches.append(np.full(300, 3, dtype=np.int64))  # one batch of a single sample's 300 reads
    batches.append(np.array([length - 1, 3, length - 1, 0, 3], dtype=np.int64))
    return batches


@pytest.fixture(scope="module")
def labels(tmp_path_factory):
    """A packed dataset of 5,000 int labels (no image: counting does not depend on the fields)."""
    path = tmp_path_factory.mktemp("labels") / "ds"
    fastload.pack({"y": np.arange(5000)}, path, workers=0)
    return path


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_words_are_the_dense_counts(seed):
    rng = np.random.default_rng(seed)
    length = 50
    batches = heavy_repeats(rng, length)
    counts = ReadCounts(length)
    got = [counts.read(idx) for idx in batches]
    for k, (g, want) in enumerate(zip(got, dense_words(batches, length))):
        want = np.zeros(len(batches[k]), np.uint64) if want is None else want
        assert g.dtype == np.uint64 and g.tolist() == want.tolist(), f"batch {k}: {batches[k].tolist()}"
    total = np.bincount(np.concatenate(batches), minlength=length)
    assert total[3] > 510 and (total > 255).sum() >= 3  # the test reached the counts a byte cannot hold
    assert counts.large == {i: int(total[i]) for i in np.flatnonzero(total >= 255).tolist()}


def test_torch_getitems_words_are_the_dense_counts(labels, monkeypatch):
    """Through ``BatchItems.occurrences`` (what ``__getitems__`` keys a batch's draws with), under a rank word, with
    two fetchers taking turns: each fetcher's words are the dense count's of its own batches."""
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    ds = fastload.open(labels)
    state = _state(ds)
    rng = np.random.default_rng(5)
    a, b = Fetcher(), Fetcher()
    runs: dict[Fetcher, list] = {a: [], b: []}
    for idx in heavy_repeats(rng, len(ds)):
        fetcher = a if rng.random() < 0.7 else b
        runs[fetcher].append((idx, state.occurrences(fetcher, idx)))
    for fetcher, run in runs.items():
        want = dense_words([idx for idx, _ in run], len(ds), rank_word=2 << 32)
        for (idx, got), w in zip(run, want):
            assert got is not None and w is not None and got.tolist() == w.tolist(), idx.tolist()


def test_counts_hold_about_one_byte_per_sample(labels):
    """Each sample of the dataset read once, as a sequential epoch reads them: what is kept for the fetcher is at
    most one byte per sample plus a constant (it was four bytes per sample)."""
    ds = fastload.open(labels)
    state = _state(ds)
    fetcher = Fetcher()
    n = len(ds)
    for start in range(0, n, 64):
        assert state.occurrences(fetcher, np.arange(start, min(start + 64, n), dtype=np.int64)) is None
    kept, _rank = state.counted[fetcher]
    assert kept.nbytes <= n + 1024, f"{kept.nbytes} bytes kept for the reads of {n} samples"
    again = state.occurrences(fetcher, np.array([0, n - 1, 0], dtype=np.int64))  # second reads count on
    assert again is not None and again.tolist() == [1, 1, 2]
