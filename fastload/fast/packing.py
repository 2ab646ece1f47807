"""Orders of variable-length batches, declared in ``_transforms/sequences.py`` (``Bucket``,
``PackSequences``), planned here.

``BucketOrder`` (``Bucket``) shuffles within buckets and then the batches, so a batch holds one bucket;
``PackedOrder`` (``PackSequences``) cuts the epoch's token stream into ``PackJob`` batches
(``_transforms/sequences.py``) of ``batch_size * row_length`` tokens, global batch ``b`` going to rank
``b % world``. Both are ``Order``s:
the resume logic (``batches(epoch, start)``, ``state_dict``/``load_state_dict`` and the configuration
they check) is ``order.py``'s; each defines only its epoch's batches and what its configuration adds.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .._transforms.sequences import PackJob
from .order import SHUFFLE_STREAM, Order, as_int, digest, dist_info, seed_key


class BucketOrder(Order):
    """Batches that each hold samples of one length bucket (for ``transforms.Bucket``).

    Per epoch: each bucket's members are shuffled (``random``/``quasi``; kept in order for
    ``sequential``) and cut into batches (``drop_last`` drops each bucket's short tail); the batch list
    is shuffled, padded by wrapping (or cut with ``drop_last``) to a multiple of ``world_size``, and
    rank ``r`` takes batches ``r, r + world, ...``. Every rank gets the same number of batches; the
    sequence depends only on (seed, epoch, rank, world size) and the bucket of every sample.

    Elastic resume: the samples the saved ranks consumed are worked out from their batches; each bucket's
    members not consumed, in the epoch's shuffled order, are cut into batches of the new batch size, the batch
    list shuffled (the epoch's generator, drawn on) and split over the new ranks as above.
    """

    def __init__(self, bucket_ids: np.ndarray, batch_size: int, **kw):
        ids = np.asarray(bucket_ids)
        if ids.ndim != 1 or (ids.size and (ids.dtype.kind not in "iu" or ids.min() < 0)):
            raise ValueError("bucket_ids should be a 1-d array of non-negative ints, one per sample")
        kw.pop("shard_sizes", None)
        super().__init__(len(ids), batch_size, **kw)
        # one byte a sample up to 256 buckets (what a sample's bucket costs for the loader's lifetime; its digest,
        # _config, is of the int64 values)
        small = np.min_scalar_type(int(ids.max())) if ids.size else np.dtype(np.uint8)
        self.bucket_ids = ids.astype(small if small.itemsize <= 4 else np.int64)
        sizes = np.bincount(self.bucket_ids) if ids.size else np.zeros(0, np.int64)
        b = self.batch_size
        per_bucket = sizes // b if self.drop_last else -(-sizes // b)
        total = int(per_bucket.sum())
        w = self.world_size
        self._num_batches = total // w if self.drop_last else -(-total // w)
        self._total_batches = total

    def _global_batches(self, e: int, consumed, batch: int, world: int, drop_last: bool) -> list[np.ndarray]:
        """Epoch ``e``'s batches of ``batch`` samples not in ``consumed`` (None: all), shuffled, padded by wrapping
        (or cut, ``drop_last``) to a multiple of ``world``: rank ``r`` takes ``[r::world]``."""
        rng = np.random.default_rng(seed_key(SHUFFLE_STREAM, self.seed, e))
        batches: list[np.ndarray] = []
        for bucket in np.unique(self.bucket_ids):
            members = np.flatnonzero(self.bucket_ids == bucket)
            if self.kind != "sequential":
                members = members[rng.permutation(len(members))]
            if consumed is not None:
                members = members[~consumed[members]]
            stop = len(members) - len(members) % batch if drop_last else len(members)
            batches.extend(members[i : i + batch] for i in range(0, stop, batch))
        if self.kind != "sequential":
            batches = [batches[i] for i in rng.permutation(len(batches))]
        total = len(batches)
        need = (total // world if drop_last else -(-total // world)) * world
        if batches and need > len(batches):
            batches = [batches[i % len(batches)] for i in range(need)]
        return batches[:need]

    def _bucket_batches(self, e: int) -> list[np.ndarray]:
        w = self.world_size
        batches = self._global_batches(e, self._partial_of(e), self.batch_size, w, self.drop_last)[self.rank :: w]
        return [b.copy() for b in batches]  # a view would keep its whole bucket's members, every rank's, alive

    def _batch_occurrences(self, e: int, i: int) -> np.ndarray | None:
        """A padding batch (the batch list wrapped to a multiple of the world size) is a second read of its
        samples: occurrence 1 (2, ... past another wrap); every other read is a sample's only one in the epoch."""
        # (epoch, seed, the partial it was made under, wraps, sizes): a loaded state of another seed at the same
        # epoch shuffles other batches, whose sizes the padding's words must match
        cached = getattr(self, "_wraps", None)
        if cached is None or cached[:2] != (e, self.seed) or cached[2] is not self._partial:
            w = self.world_size
            batches = self._global_batches(e, self._partial_of(e), self.batch_size, w, self.drop_last)
            seen: dict[int, int] = {}
            wraps = []
            for b in batches:  # the same batch object again: a wrap (``_global_batches`` pads with its batches)
                wraps.append(seen.get(id(b), -1) + 1)
                seen[id(b)] = wraps[-1]
            sizes = [len(b) for b in batches[self.rank :: w]]
            self._wraps = (e, self.seed, self._partial, wraps[self.rank :: w], sizes)
        _, _, _, wraps, sizes = self._wraps
        if i >= len(wraps) or not wraps[i]:
            return None
        return np.full(sizes[i], wraps[i], dtype=np.uint64)

    def num_batches(self, epoch: int | None = None) -> int:
        e = self._epoch if epoch is None else epoch
        return self._num_batches if self._partial_of(e) is None else len(self._bucket_batches(e))

    def indices(self, epoch: int | None = None) -> np.ndarray:
        e = self._epoch if epoch is None else as_int("epoch", epoch, 0)
        parts = self._bucket_batches(e)
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def _epoch_batches(self, e: int, start: int) -> Iterator[np.ndarray]:
        return iter(self._bucket_batches(e)[start:])

    def _config(self) -> dict:
        return super()._config() | {"buckets": digest(self.bucket_ids)}

    def _consumed(self, e: int, before, saved: dict, done: dict[int, int]):
        w, b = as_int("world_size", saved["world_size"], 1), as_int("batch_size", saved["batch_size"], 1)
        batches = self._global_batches(e, before, b, w, bool(saved["drop_last"]))
        mask = np.zeros(self.num_samples, dtype=bool) if before is None else before.copy()
        nb = len(batches) // w
        for r, k in done.items():
            if k > nb:
                raise ValueError(f"batches_done={k} of rank {r} should be <= num_batches={nb} of the saved loader")
            for batch in batches[r::w][:k]:
                mask[batch] = True
        return mask


def packed_batches(stream: np.ndarray, lengths: np.ndarray, tokens_per_batch: int, batch_ids, base: int = 0):
    """PackJobs for the given global batch numbers of the sample stream ``stream`` (one cumsum); batch ``b`` holds
    the stream's tokens ``base + b * tokens_per_batch ..`` (``base``: tokens consumed before, elastic resume).

    Holds the stream's token ends (8 bytes a sample of the dataset) while the epoch's batches are made: a sample's
    length and begin are read from them per batch (they were two more arrays of the stream's length, held all epoch
    by this generator)."""
    ends = np.cumsum(lengths[stream])
    total = int(ends[-1]) if len(ends) else 0
    for b in batch_ids:
        lo, hi = base + b * tokens_per_batch, base + (b + 1) * tokens_per_batch
        first = int(np.searchsorted(ends, lo, side="right"))
        # exclusive: the samples that begin before hi (the first begins at 0, sample j at ends[j - 1])
        last = min(1 + int(np.searchsorted(ends[:-1], hi, side="left")), len(ends)) if hi > 0 else 0
        sel = np.arange(first, last)
        begins = ends[sel] - lengths[stream[sel]]
        keep = ends[sel] > begins
        sel, begins = sel[keep], begins[keep]
        piece_lo = np.maximum(begins, lo)
        piece_hi = np.minimum(ends[sel], hi)
        yield PackJob(stream[sel], piece_lo - begins, piece_hi - piece_lo, piece_lo - lo, int(min(hi, total) - lo))


class PackedOrder(Order):
    """Batches of packed token rows (``transforms.PackSequences``).

    The epoch's global sample sequence (``kind``, seed, epoch) forms one token stream, cut into
    global batches of ``tokens_per_batch``; rank ``r`` takes global batches ``r, r + world, ...``, so
    every rank has the same count in every epoch (the total token count never changes). Without
    ``drop_last`` the last global batch is partial and the count is padded to a multiple of
    ``world_size`` by wrapping around to the first batches.

    Elastic resume: all ranks at batch ``k`` have consumed the stream's first ``k * world * tokens_per_batch``
    tokens (``tokens_before`` more when the epoch was resumed already); the rest of the stream, from that token
    (mid-sample too), is cut and split as above with the new ``tokens_per_batch`` and world size.
    """

    split_keys = ("world_size", "tokens_per_batch", "drop_last")

    def __init__(self, lengths: np.ndarray, tokens_per_batch: int, **kw):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        rank, world = dist_info(kw.pop("rank", None), kw.pop("world_size", None))
        kw.pop("shard_sizes", None)
        super().__init__(len(self.lengths), 1, rank=0, world_size=1, **kw)  # one global sample stream
        self.pack_rank, self.pack_world = rank, world
        self.tokens_per_batch = as_int("tokens_per_batch", tokens_per_batch, 1)
        self._total = int(self.lengths.sum())
        self._global = self._global_count(0)
        self._num_batches = self._global // world if self.drop_last else -(-self._global // world)

    def _global_count(self, base: int) -> int:
        left = max(self._total - base, 0)
        return left // self.tokens_per_batch if self.drop_last else -(-left // self.tokens_per_batch)

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """The epoch's whole sample stream (ranks split its batches, not its samples)."""
        return self._global_sequence(self._epoch if epoch is None else as_int("epoch", epoch, 0))

    @property
    def batch_rank(self) -> int:
        return self.pack_rank

    @property
    def batch_world(self) -> int:
        return self.pack_world

    def num_batches(self, epoch: int | None = None) -> int:
        base = self._partial_of(self._epoch if epoch is None else epoch)
        if base is None:
            return self._num_batches
        g = self._global_count(base)
        return g // self.pack_world if self.drop_last else -(-g // self.pack_world)

    def _epoch_batches(self, e: int, start: int) -> Iterator[PackJob]:
        w, r = self.pack_world, self.pack_rank
        base = self._partial_of(e) or 0
        g = self._global_count(base)
        ids = [(b * w + r) % max(g, 1) for b in range(start, self.num_batches(e))]
        if self._cache is None or self._cache[0] != e:
            self._cache = (e, self._global_sequence(e))
        return packed_batches(self._cache[1], self.lengths, self.tokens_per_batch, ids, base)

    def _config(self) -> dict:
        return super()._config() | {
            "world_size": self.pack_world,
            "packed": digest(self.lengths),
            "tokens_per_batch": self.tokens_per_batch,
        }

    def _partial_state(self, e: int) -> dict:
        return {"tokens_before": self._partial_of(e) or 0}

    def _saved_partial(self, state: dict):
        return as_int("tokens_before", state.get("tokens_before", 0), 0) or None

    def load_state_dict(self, state) -> int:
        many = isinstance(state, (list, tuple))
        group = [_settings_of_version_2(s) for s in (state if many else [state])]
        return super().load_state_dict(group if many else group[0])

    def _consumed(self, e: int, before, saved: dict, done: dict[int, int]):
        counts = set(done.values())
        if len(counts) != 1:
            raise ValueError(
                "PackSequences resumes elastically only from ranks that had all received the same number of "
                f"batches (these had {sorted(counts)}): its ranks take turns along one token stream; load the "
                "states all ranks saved at one step"
            )
        (k,) = counts
        w, tpb = as_int("world_size", saved["world_size"], 1), as_int("tokens_per_batch", saved["tokens_per_batch"], 1)
        base = before or 0
        left = max(self._total - base, 0)
        g = left // tpb if saved["drop_last"] else -(-left // tpb)
        nb = g // w if saved["drop_last"] else -(-g // w)
        if k > nb:
            raise ValueError(f"batches_done={k} should be <= num_batches={nb} of the saved loader")
        return min(base + k * w * tpb, self._total)


def _settings_of_version_2(state):
    """A version-1 state of a PackedOrder (``packed``: "tokens_per_batch:digest") in version 2's keys, as a copy."""
    if not (isinstance(state, dict) and state.get("version") == 1 and ":" in str(state.get("packed"))):
        return state
    tpb, lengths = str(state["packed"]).split(":", 1)
    return {**state, "packed": lengths, "tokens_per_batch": int(tpb)}
