"""The order of a mix (``fastload.mix``): several datasets' samples drawn by weight, per epoch, on each rank.

A mix's index space is the concatenation of its datasets' (dataset ``d``'s sample ``i`` is ``offsets[d] + i``),
and its epoch is a sequence of ``num_samples`` such indices (default: the datasets' total size), the same on every
rank. ``Mixing.sequence(kind, seed, epoch)`` is that *global sequence*, a pure function of its arguments; a
``MixOrder`` is an ``Order`` whose global sequence it is, so padding, the split over ranks, batching and resume
are the plain order's (``order.py``).

How the sequence is drawn:

* **quotas** -- dataset ``d`` gives ``q_d`` samples to every epoch: ``num_samples * weight_d / sum(weights)``
  rounded by largest remainder (ties to the earlier dataset), so the quotas sum to ``num_samples`` and each is
  within one sample of its exact share, in every epoch (not a binomial draw around it).
* **streams** -- each dataset is read as an endless stream of passes; every pass is a permutation of all its
  samples (``kind='random'``: keyed by (seed, dataset number, pass number); ``'sequential'``: ``0 .. n_d - 1``).
  Epoch ``e`` takes positions ``e * q_d .. (e + 1) * q_d - 1`` of dataset ``d``'s stream. So no sample of a
  dataset comes back before every other sample of it has come once (sampling without replacement, pass after
  pass); a small dataset with a large weight runs through several passes in one epoch, each a new permutation;
  a large one with a small weight is read on across epochs where the last epoch stopped.
* **interleave** -- which dataset each position of the epoch takes: ``'random'``: a uniform arrangement of the
  quotas keyed by (seed, epoch); ``'sequential'``: evenly spread and fixed (dataset ``d``'s ``k``-th sample at
  ``(k + 1/2) / q_d`` of the epoch), no randomness at all. Each dataset's samples keep their stream order.

Per-sample random transforms are keyed by (seed, epoch, global index), as for one dataset (``_draws.py``): a
sample drawn twice in one epoch (a dataset whose quota exceeds its size) gets the same crop and flip both times in
that epoch, and new ones the next epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .order import Order, as_int, seed_key

MIX_STREAM = 0x4D495843  # "MIXC": never meets the order's, batch or sample streams


def quotas(num_samples: int, weights: np.ndarray) -> np.ndarray:
    """``num_samples`` shared by ``weights`` (>= 0, sum > 0) by largest remainder, ties to the earlier entry."""
    exact = num_samples * (weights / weights.sum())
    q = np.floor(exact).astype(np.int64)
    rest = num_samples - int(q.sum())
    order = sorted(range(len(weights)), key=lambda d: (-(exact[d] - q[d]), d))
    for d in order[:rest]:
        q[d] += 1
    return q


def check_kind(kind: str) -> None:
    if kind not in ("random", "sequential"):
        raise ValueError(
            f"order={kind!r} for a mix: a mix takes order='random' (shuffle=True) or 'sequential' (each "
            f"dataset read in its own order, interleaved evenly); 'quasi' reads a few shards at a time of one "
            f"dataset and cannot draw across datasets by weight"
        )


class Mixing:
    """The datasets of a mix by size, their weights and epoch length: the global sequence of each epoch."""

    def __init__(
        self,
        names: Sequence[str],
        sizes: Sequence[int],
        weights: Sequence[float],
        num_samples: int,
        seed: int | None = None,
    ):
        self.names = list(names)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.weights = np.asarray(weights, dtype=np.float64)
        self.num_samples = as_int("num_samples", num_samples, 1)
        self.seed = None if seed is None else as_int("seed", seed, 0)
        self.quotas = quotas(self.num_samples, self.weights)

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}: {q}/{s}" for n, q, s in zip(self.names, self.quotas, self.sizes))
        return f"Mixing({parts} per epoch of {self.num_samples})"

    def describe(self) -> str:
        """What a saved position must agree with (``MixOrder._config``), in words: each dataset's name, size and
        quota (which the epoch's sequence depends on, not the weights that gave them), and the mix's seed."""
        parts = [f"'{n}': {s} samples, {q} an epoch" for n, s, q in zip(self.names, self.sizes, self.quotas)]
        seed = "the loader's" if self.seed is None else str(self.seed)
        return "; ".join(parts) + f"; seed={seed}"

    def dataset_of(self, indices: Any) -> np.ndarray:
        """The dataset number of each global index."""
        return np.searchsorted(self.offsets, np.asarray(indices, dtype=np.int64), side="right") - 1

    def counts(self, indices: Any) -> np.ndarray:
        """Samples per dataset among ``indices``."""
        return np.bincount(self.dataset_of(indices), minlength=len(self.names))

    def _stream(self, kind: str, seed: int, d: int, first: int, count: int) -> np.ndarray:
        """Positions ``first .. first + count - 1`` of dataset ``d``'s stream: local indices, pass after pass."""
        n = int(self.sizes[d])
        out = np.empty(count, dtype=np.int64)
        at = 0
        while at < count:
            p, lo = divmod(first + at, n)
            take = min(n - lo, count - at)
            if kind == "sequential":
                out[at : at + take] = np.arange(lo, lo + take, dtype=np.int64)
            else:
                perm = np.random.default_rng(seed_key(MIX_STREAM, seed, d + 1, p)).permutation(n)
                out[at : at + take] = perm[lo : lo + take]
            at += take
        return out

    def _labels(self, kind: str, seed: int, epoch: int) -> np.ndarray:
        """The dataset number of each position of the epoch."""
        q = self.quotas
        small = np.uint8 if len(q) <= 256 else np.uint16 if len(q) <= 65536 else np.int64  # shuffled and radix-sorted
        labels = np.repeat(np.arange(len(q), dtype=small), q)
        if kind == "sequential":
            where = np.concatenate([(np.arange(k) + 0.5) / k for k in q if k])
            return labels[np.lexsort((labels, where))]
        np.random.default_rng(seed_key(MIX_STREAM, seed, 0, epoch)).shuffle(labels)
        return labels

    def sequence(self, kind: str, seed: int, epoch: int) -> np.ndarray:
        """The epoch's global sequence of sample indices (int64, ``num_samples`` long), the same on every rank."""
        check_kind(kind)
        positions = np.argsort(self._labels(kind, seed, epoch), kind="stable")  # dataset d's, in order, in turn
        out = np.empty(self.num_samples, dtype=np.int64)
        at = 0
        for d, q in enumerate(self.quotas.tolist()):
            out[positions[at : at + q]] = self.offsets[d] + self._stream(kind, seed, d, epoch * q, q)
            at += q
        return out


class MixOrder(Order):
    """An ``Order`` over a mix: its global sequence is ``Mixing.sequence`` (keyed by the mix's seed when it has
    one, else the loader's); everything else (padding, ranks, batches, resume) is ``Order``'s."""

    def __init__(
        self,
        mixing: Mixing,
        batch_size: int,
        *,
        kind: str = "random",
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        window: int = 8,
        split: str = "samples",
    ):
        check_kind(kind)
        if split != "samples":
            raise ValueError(
                f"split={split!r}: a mix draws its samples from several datasets by weight, so ranks take strided "
                f"samples of its sequence (split='samples')"
            )
        self.mixing = mixing
        super().__init__(
            mixing.num_samples,
            batch_size,
            kind=kind,
            seed=seed,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            window=window,
        )

    def __repr__(self) -> str:
        return "Mix" + super().__repr__() + f" of {self.mixing!r}"

    @property
    def mix_seed(self) -> int:
        return self.seed if self.mixing.seed is None else self.mixing.seed

    def _global_sequence(self, e: int) -> np.ndarray:
        return self.mixing.sequence(self.kind, self.mix_seed, e)

    def _config(self) -> dict:
        return super()._config() | {"mix": self.mixing.describe()}
