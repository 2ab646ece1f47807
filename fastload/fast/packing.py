"""Orders of variable-length batches, declared in ``_sequences.py`` (``Bucket``, ``PackSequences``), planned here.

``BucketOrder`` (``Bucket``) shuffles within buckets and then the batches, so a batch holds one bucket;
``PackedOrder`` (``PackSequences``) cuts the epoch's token stream into ``PackJob`` batches (``_sequences.py``) of
``batch_size * row_length`` tokens, global batch ``b`` going to rank ``b % world``. Both are ``Order``s:
the resume logic (``batches(epoch, start)``, ``state_dict``/``load_state_dict`` and the configuration
they check) is ``order.py``'s; each defines only its epoch's batches and what its configuration adds.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .._sequences import PackJob
from .order import SHUFFLE_STREAM, Order, as_int, digest, dist_info, seed_key


class BucketOrder(Order):
    """Batches that each hold samples of one length bucket (for ``transforms.Bucket``).

    Per epoch: each bucket's members are shuffled (``random``/``quasi``; kept in order for
    ``sequential``) and cut into batches (``drop_last`` drops each bucket's short tail); the batch list
    is shuffled, padded by wrapping (or cut with ``drop_last``) to a multiple of ``world_size``, and
    rank ``r`` takes batches ``r, r + world, ...``. Every rank gets the same number of batches; the
    sequence depends only on (seed, epoch, rank, world size) and the bucket of every sample.
    """

    def __init__(self, bucket_ids: np.ndarray, batch_size: int, **kw):
        ids = np.asarray(bucket_ids)
        if ids.ndim != 1 or (ids.size and (ids.dtype.kind not in "iu" or ids.min() < 0)):
            raise ValueError("bucket_ids should be a 1-d array of non-negative ints, one per sample")
        kw.pop("shard_sizes", None)
        super().__init__(len(ids), batch_size, **kw)
        self.bucket_ids = ids.astype(np.int64)
        sizes = np.bincount(self.bucket_ids) if ids.size else np.zeros(0, np.int64)
        b = self.batch_size
        per_bucket = sizes // b if self.drop_last else -(-sizes // b)
        total = int(per_bucket.sum())
        w = self.world_size
        self._num_batches = total // w if self.drop_last else -(-total // w)
        self._total_batches = total

    def _bucket_batches(self, e: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed_key(SHUFFLE_STREAM, self.seed, e))
        b = self.batch_size
        batches: list[np.ndarray] = []
        for bucket in np.unique(self.bucket_ids):
            members = np.flatnonzero(self.bucket_ids == bucket)
            if self.kind != "sequential":
                members = members[rng.permutation(len(members))]
            stop = len(members) - len(members) % b if self.drop_last else len(members)
            batches.extend(members[i : i + b] for i in range(0, stop, b))
        if self.kind != "sequential":
            batches = [batches[i] for i in rng.permutation(len(batches))]
        need = self._num_batches * self.world_size
        if batches and need > len(batches):
            batches = [batches[i % len(batches)] for i in range(need)]
        return batches[:need][self.rank :: self.world_size]

    def indices(self, epoch: int | None = None) -> np.ndarray:
        e = self._epoch if epoch is None else as_int("epoch", epoch, 0)
        parts = self._bucket_batches(e)
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def _epoch_batches(self, e: int, start: int) -> Iterator[np.ndarray]:
        return iter(self._bucket_batches(e)[start:])

    def _config(self) -> dict:
        return super()._config() | {"buckets": digest(self.bucket_ids)}


def packed_batches(stream: np.ndarray, lengths: np.ndarray, tokens_per_batch: int, batch_ids):
    """PackJobs for the given global batch numbers of the sample stream ``stream`` (one cumsum)."""
    lens = lengths[stream]
    ends = np.cumsum(lens)
    begins = ends - lens
    total = int(ends[-1]) if len(ends) else 0
    for b in batch_ids:
        lo, hi = b * tokens_per_batch, (b + 1) * tokens_per_batch
        first = int(np.searchsorted(ends, lo, side="right"))
        last = int(np.searchsorted(begins, hi, side="left"))  # exclusive
        sel = np.arange(first, last)
        sel = sel[lens[sel] > 0]
        piece_lo = np.maximum(begins[sel], lo)
        piece_hi = np.minimum(ends[sel], hi)
        yield PackJob(stream[sel], piece_lo - begins[sel], piece_hi - piece_lo, piece_lo - lo, int(min(hi, total) - lo))


class PackedOrder(Order):
    """Batches of packed token rows (``transforms.PackSequences``).

    The epoch's global sample sequence (``kind``, seed, epoch) forms one token stream, cut into
    global batches of ``tokens_per_batch``; rank ``r`` takes global batches ``r, r + world, ...``, so
    every rank has the same count in every epoch (the total token count never changes). Without
    ``drop_last`` the last global batch is partial and the count is padded to a multiple of
    ``world_size`` by wrapping around to the first batches.
    """

    def __init__(self, lengths: np.ndarray, tokens_per_batch: int, **kw):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        rank, world = dist_info(kw.pop("rank", None), kw.pop("world_size", None))
        kw.pop("shard_sizes", None)
        super().__init__(len(self.lengths), 1, rank=0, world_size=1, **kw)  # one global sample stream
        self.pack_rank, self.pack_world = rank, world
        self.tokens_per_batch = as_int("tokens_per_batch", tokens_per_batch, 1)
        total = int(self.lengths.sum())
        g = total // self.tokens_per_batch if self.drop_last else -(-total // self.tokens_per_batch)
        self._global = g
        self._num_batches = g // world if self.drop_last else -(-g // world)

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """The epoch's whole sample stream (ranks split its batches, not its samples)."""
        return self._global_sequence(self._epoch if epoch is None else as_int("epoch", epoch, 0))

    @property
    def batch_rank(self) -> int:
        return self.pack_rank

    @property
    def batch_world(self) -> int:
        return self.pack_world

    def _epoch_batches(self, e: int, start: int) -> Iterator[PackJob]:
        w, r = self.pack_world, self.pack_rank
        ids = [(b * w + r) % max(self._global, 1) for b in range(start, self._num_batches)]
        if self._cache is None or self._cache[0] != e:
            self._cache = (e, self._global_sequence(e))
        return packed_batches(self._cache[1], self.lengths, self.tokens_per_batch, ids)

    def _config(self) -> dict:
        return super()._config() | {
            "world_size": self.pack_world,
            "packed": f"{self.tokens_per_batch}:{digest(self.lengths)}",
        }
