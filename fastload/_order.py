"""Order: which sample indices go into which batch, for each epoch, on each rank.

An order is a pure function of (seed, epoch, rank, world size) and its configuration (dataset size,
shard sizes, batch size, drop_last, kind): never of thread or worker counts. Resume is therefore a
position, ``(epoch, batches_done)``, and the state is a handful of plain ints and strings.

Each epoch builds one *global* index sequence, identical on every rank, then splits it like torch's
``DistributedSampler``: without ``drop_last`` the sequence is padded by wrapping around to its start
until its length divides by ``world_size``; with ``drop_last`` its tail is cut so that it does. Rank
``r`` takes positions ``r, r + world, r + 2 * world, ...`` (strided, so all ranks walk through the
epoch together) and batches them like ``BatchSampler`` (``drop_last`` drops a short last batch).

Kinds of global sequence:

* ``sequential`` -- ``0 .. n-1``.
* ``random`` -- a uniform permutation of all samples, from ``default_rng`` keyed by (seed, epoch).
* ``quasi`` -- for datasets larger than RAM. Shards (``shard_sizes``, consecutive sample counts; by
  default blocks of ``DEFAULT_BLOCK`` samples) are put in a random order, cut into *phases* of
  ``window`` consecutive shards of that order (the last phase may hold fewer), and the samples of each
  phase are shuffled uniformly among themselves. Phases follow one another.

Memory bound of ``quasi`` (what is touched, in bytes, is the bytes of the shards named here):

* every phase reads exactly the samples of its ``<= window`` shards, and every shard belongs to one
  phase, so between the first and the last read of a shard there are only reads of its own phase:
  at any point of the epoch at most ``window`` shards are *open* (started and not yet finished);
* this holds on every rank, because ranks take strided positions of the same global sequence: all
  ranks are in the same phase (to within one batch), so ranks sharing a node also share the
  ``window`` hot shards instead of touching ``window * world_size``;
* a batch that straddles a phase boundary reads the tail of one phase and the head of the next, so a
  run of batches whose positions overlap ``p`` phases touches at most ``p * window`` shards (one batch
  touches at most ``2 * window`` when ``batch_size * world_size`` is no more than a phase's samples);
* the one exception is wrap padding (no ``drop_last``, ``n % world_size != 0``): fewer than
  ``world_size`` samples, at most one per rank, taken again from the start of the epoch (phase 0) at
  the very end.

A page cache that holds the ``window`` largest shards therefore reads each shard from disk once per
epoch (plus the padding samples); ``2 * window`` also covers the boundary batch.

``split="shards"`` (the default for remote datasets with ``world_size > 1``) splits by whole shards
instead, so that each rank reads (downloads) only its own ~1/world of the data: shards go to ranks once
and for all (largest first, each to the rank holding the fewest samples so far; the same on every
rank and in every epoch), and each rank orders its own samples by ``kind`` (``quasi``: phases of
``window`` of its shards), with a stream keyed by (seed, epoch, rank). Every rank gets the same
number of batches: ranks holding fewer samples than the largest share wrap around their own sequence
(with ``drop_last``, every rank is cut to the smallest share). A rank's samples stay its own across
epochs; the global batch still mixes all ranks' every step.

Variable-length fields plan their batches here too (``order_for`` picks the order from the dataset's
transforms): ``BucketOrder`` (``Bucket``) shuffles within buckets and then the batches, so a batch
holds one bucket; ``PackedOrder`` (``PackSequences``) cuts the epoch's token stream into ``PackJob``
batches of ``batch_size * row_length`` tokens, global batch ``b`` going to rank ``b % world``.
"""

from __future__ import annotations

import warnings

import hashlib
import math
import operator
from collections.abc import Iterator, Sequence

import numpy as np

from ._sequences import Bucket, PackSequences

KINDS = ("sequential", "random", "quasi")
DEFAULT_BLOCK = 4096  # samples per pseudo-shard for ``quasi`` without ``shard_sizes``
STATE_VERSION = 1
# First word of every SeedSequence key: the shuffle and the augmentation streams never meet.
_SHUFFLE_STREAM = 0x53485546  # "SHUF"
_BATCH_STREAM = 0x42415443  # "BATC"


def _as_int(name: str, value: object, minimum: int = 0) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} should be an integer >= {minimum}, not a bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}={value!r} should be an integer >= {minimum}") from None
    if v < minimum:
        raise ValueError(f"{name}={v} should be >= {minimum}")
    return v


def _key(stream: int, *parts: int) -> list[int]:
    """A fixed-length SeedSequence key: two 32-bit words per part (no length or zero-padding aliasing)."""
    words = [stream]
    for p in parts:
        words += [p & 0xFFFFFFFF, p >> 32]
    return words


def dist_info(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)``: the given values, else ``torch.distributed``'s when initialised, else (0, 1)."""
    if rank is None or world_size is None:
        import torch.distributed as dist

        live = dist.is_available() and dist.is_initialized()
        if world_size is None:
            world_size = dist.get_world_size() if live else 1
        if rank is None:
            rank = dist.get_rank() if live else 0
    world_size = _as_int("world_size", world_size, 1)
    rank = _as_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"{rank=} should be < {world_size=} (ranks are 0 .. world_size - 1)")
    return rank, world_size


def default_seed(generator=None) -> int:
    """A non-negative 63-bit seed drawn from torch's default generator (or ``generator``), like RandomSampler."""
    import torch

    return int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64, generator=generator).item())


def _quasi_sequence(rng: np.random.Generator, sizes: np.ndarray, window: int) -> np.ndarray:
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    perm = rng.permutation(len(sizes))
    psizes, pstarts = sizes[perm], starts[perm]
    out_starts = np.concatenate([[0], np.cumsum(psizes)[:-1]]).astype(np.int64)
    seq = np.repeat(pstarts - out_starts, psizes) + np.arange(int(sizes.sum()), dtype=np.int64)
    bounds = np.concatenate([out_starts[::window], [len(seq)]])
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        rng.shuffle(seq[lo:hi])  # in place on the view: one phase shuffled among itself
    return seq


class Progress:
    """Where one iteration stands, the position ``state_dict`` saves: its epoch and how many of its batches
    the loop has received. The loader makes one per iteration (or on ``load_state_dict``) and hands it to
    the object that hands batches to the loop, which alone advances it."""

    __slots__ = ("epoch", "done")

    def __init__(self, epoch: int = 0, done: int = 0):
        self.epoch, self.done = epoch, done

    def advance(self) -> None:
        self.done += 1

    def end_epoch(self) -> None:
        """The epoch ran out: the next one starts afresh."""
        self.epoch, self.done = self.epoch + 1, 0


class Order:
    """Which sample indices go into which batch, per epoch and rank; resumable from ``(epoch, batches_done)``.

    ``set_epoch(e)`` works as in ``DistributedSampler``: the epoch is an input. ``begin_epoch()`` is for
    the loader: it returns the epoch to iterate and advances by one when nobody set the epoch since.
    """

    def __init__(self, num_samples: int, batch_size: int, *, kind: str = "sequential", seed: int = 0,
                 rank: int = 0, world_size: int = 1, drop_last: bool = False,
                 shard_sizes: Sequence[int] | None = None, window: int = 8, split: str = "samples"):
        self.num_samples = _as_int("num_samples", num_samples, 0)
        self.batch_size = _as_int("batch_size", batch_size, 1)
        if kind not in KINDS:
            raise ValueError(f"order={kind!r} should be one of {KINDS}")  # the loader's argument is order=
        self.kind = kind
        self.seed = _as_int("seed", seed, 0)
        if self.seed >= 2**64:
            raise ValueError(f"{seed=} should be < 2**64")
        self.rank, self.world_size = dist_info(rank, world_size)
        if not isinstance(drop_last, (bool, np.bool_)):
            raise ValueError(f"{drop_last=} should be a bool")
        self.drop_last = bool(drop_last)
        self.window = _as_int("window", window, 1)
        if shard_sizes is None:
            full, rest = divmod(self.num_samples, DEFAULT_BLOCK)
            sizes = np.array([DEFAULT_BLOCK] * full + ([rest] if rest else []), dtype=np.int64)
        else:
            sizes = np.asarray(shard_sizes)
            if sizes.ndim != 1 or (sizes.size and (sizes.dtype.kind not in "iu" or sizes.min() < 0)):
                raise ValueError(f"shard_sizes should be a 1-d sequence of sample counts >= 0, got {shard_sizes!r}")
            sizes = sizes.astype(np.int64)
            if int(sizes.sum()) != self.num_samples:
                raise ValueError(f"shard_sizes sum to {int(sizes.sum())} but {num_samples=}; give one count "
                                 f"per shard, in dataset order")
        self.shard_sizes = sizes
        w, n = self.world_size, self.num_samples
        if split not in ("samples", "shards"):
            raise ValueError(f"{split=} should be 'samples' (strided, like DistributedSampler) or 'shards'")
        self.split = split
        # DistributedSampler's counts: drop the tail to a multiple of world, or pad up to one.
        self._per_rank = n // w if self.drop_last else math.ceil(n / w)
        if split == "shards":
            self._owned = _assign_shards(sizes, w)
            if shard_sizes is None or any(len(k) == 0 for k in self._owned):
                raise ValueError(f"split='shards' needs the dataset's shards and at least one per rank: "
                                 f"{len(sizes)} shard(s) for world_size={w}; pack with a smaller shard_size, or "
                                 f"use split='samples'")
            shares = [int(sizes[k].sum()) for k in self._owned]
            self._per_rank = min(shares) if self.drop_last else max(shares)
        if self.drop_last:
            self._num_batches = self._per_rank // self.batch_size
        else:
            self._num_batches = math.ceil(self._per_rank / self.batch_size)
        self._epoch = 0
        self._fresh = True  # the current epoch has not been handed out by begin_epoch() yet
        self._resume: tuple[int, int] | None = None  # (epoch, batch) from load_state_dict, used once
        self._cache: tuple[int, np.ndarray] | None = None

    def __repr__(self) -> str:
        return (f"Order({self.num_samples}, batch_size={self.batch_size}, kind={self.kind!r}, seed={self.seed}, "
                f"rank={self.rank}, world_size={self.world_size}, drop_last={self.drop_last}, window={self.window})")

    # -- epochs ------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        self._epoch = _as_int("epoch", epoch, 0)
        self._fresh = True

    def begin_epoch(self) -> int:
        """The epoch the loader's next pass should iterate: the one set (or loaded), else the last one + 1."""
        if not self._fresh:
            self._epoch += 1
        self._fresh = False
        return self._epoch

    # -- indices -----------------------------------------------------------------------------
    def num_batches(self) -> int:
        return self._num_batches

    def __len__(self) -> int:
        return self._num_batches

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's sample indices for ``epoch`` (int64, read-only), after padding or dropping."""
        e = self._epoch if epoch is None else _as_int("epoch", epoch, 0)
        if self._cache is not None and self._cache[0] == e:
            return self._cache[1]
        n, w = self.num_samples, self.world_size
        total = self._per_rank * w
        if self.split == "shards":
            mine = self._own_sequence(e)
            mine = np.resize(mine, self._per_rank) if len(mine) < self._per_rank else mine[: self._per_rank]
        elif self.kind == "sequential":
            mine = np.arange(self.rank, total, w, dtype=np.int64) % max(n, 1)
        else:
            seq = self._global_sequence(e)
            seq = np.resize(seq, total) if total > n else seq[:total]  # resize wraps around, like the sampler
            mine = np.ascontiguousarray(seq[self.rank::w])
        if self.drop_last:
            mine = mine[: self._num_batches * self.batch_size]
        mine.flags.writeable = False
        self._cache = (e, mine)
        return mine

    def _own_sequence(self, e: int) -> np.ndarray:
        """``split='shards'``: this rank's samples (its own shards) ordered by ``kind`` for epoch ``e``."""
        owned = self._owned[self.rank]
        starts = np.concatenate([[0], np.cumsum(self.shard_sizes)[:-1]]).astype(np.int64)
        sizes = self.shard_sizes[owned]
        base = np.repeat(starts[owned], sizes)
        local = np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        samples = base + local  # this rank's samples, shard by shard
        if self.kind == "sequential":
            return samples
        rng = np.random.default_rng(_key(_SHUFFLE_STREAM, self.seed, e, self.rank + 1))
        if self.kind == "random":
            return samples[rng.permutation(len(samples))]
        return samples[_quasi_sequence(rng, sizes, self.window)]

    def _global_sequence(self, e: int) -> np.ndarray:
        """The epoch's sample sequence before the rank split (the same on every rank)."""
        if self.kind == "sequential":
            return np.arange(self.num_samples, dtype=np.int64)
        rng = np.random.default_rng(_key(_SHUFFLE_STREAM, self.seed, e))
        if self.kind == "random":
            return rng.permutation(self.num_samples).astype(np.int64, copy=False)
        return _quasi_sequence(rng, self.shard_sizes, self.window)

    def batches(self, epoch: int | None = None, start: int | None = None) -> Iterator[np.ndarray]:
        """This rank's batches of ``epoch`` from batch ``start`` (read-only int64 views).

        ``start=None`` means: the resume point from ``load_state_dict`` when it is for this epoch, else 0.
        Any call uses up a pending resume point.
        """
        e = self._epoch if epoch is None else _as_int("epoch", epoch, 0)
        if start is None:
            start = self._resume[1] if self._resume is not None and self._resume[0] == e else 0
        start = _as_int("start", start, 0)
        if start > self._num_batches:
            raise ValueError(f"{start=} should be <= num_batches={self._num_batches}")
        self._resume = None
        return self._iter(self.indices(e), start)

    def _iter(self, idx: np.ndarray, start: int) -> Iterator[np.ndarray]:
        b = self.batch_size
        for i in range(start, self._num_batches):
            yield idx[i * b:(i + 1) * b]

    def batch_rng(self, epoch: int, batch_index: int) -> np.random.Generator:
        """A generator for augmentation of one batch, keyed by (seed, epoch, rank, batch_index)."""
        e = _as_int("epoch", epoch, 0)
        i = _as_int("batch_index", batch_index, 0)
        return np.random.default_rng(_key(_BATCH_STREAM, self.seed, e, getattr(self, "pack_rank", self.rank), i))

    # -- resume ------------------------------------------------------------------------------
    def _config(self) -> dict:
        cfg = {"kind": self.kind, "num_samples": self.num_samples, "batch_size": self.batch_size,
               "world_size": self.world_size, "drop_last": self.drop_last}
        if self.split != "samples":
            cfg["split"] = self.split
        if self.kind == "quasi":
            digest = hashlib.blake2b(self.shard_sizes.astype("<i8").tobytes(), digest_size=8).hexdigest()
            cfg.update(window=self.window, shards=f"{len(self.shard_sizes)}:{digest}")
        return cfg

    def state_dict(self, batches_done: int, epoch: int | None = None) -> dict:
        """The position after ``batches_done`` batches of ``epoch`` (default: the current one).

        Rank-free: every rank is at the same position, so any rank's state (say rank 0's) loads on all.
        """
        e = self._epoch if epoch is None else _as_int("epoch", epoch, 0)
        k = _as_int("batches_done", batches_done, 0)
        if k > self._num_batches:
            raise ValueError(f"batches_done={k} should be <= num_batches={self._num_batches}")
        return {"version": STATE_VERSION, "epoch": e, "batches_done": k, "seed": self.seed,
                **self._config()}

    def load_state_dict(self, state: dict) -> int:
        """Adopt the saved seed and epoch; the next ``batches()`` of that epoch starts at the saved batch."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            got = state.get("version") if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"not an Order state (version {got!r}, expected {STATE_VERSION}); pass the dict "
                             f"that Order.state_dict() returned")
        mine = self._config()
        saved = {k: state.get(k) for k in set(mine) | ({"window", "shards", "split"} & set(state))}
        diff = [f"{k}={saved[k]!r} (this order: {mine.get(k)!r})" for k in sorted(saved) if saved[k] != mine.get(k)]
        if diff:
            raise ValueError("cannot resume from a state saved by a different order: " + ", ".join(diff)
                             + "; build the Order with the saved settings (rank may differ)")
        self.seed = _as_int("seed", state["seed"], 0)
        epoch = _as_int("epoch", state["epoch"], 0)
        k = _as_int("batches_done", state["batches_done"], 0)
        if k > self._num_batches:
            raise ValueError(f"batches_done={k} should be <= num_batches={self._num_batches}")
        self._cache = None
        self._epoch = epoch
        # A finished epoch resumes at the next one; an unfinished one resumes inside itself.
        self._fresh = k < self._num_batches
        self._resume = (epoch, k) if self._fresh else None
        return k


def _assign_shards(sizes: np.ndarray, world: int) -> list[np.ndarray]:
    """Shards per rank, balanced by samples: largest first, each to the rank with the fewest so far."""
    owned: list[list[int]] = [[] for _ in range(world)]
    load = np.zeros(world, dtype=np.int64)
    for k in sorted(range(len(sizes)), key=lambda k: (-int(sizes[k]), k)):
        r = int(np.argmin(load))
        owned[r].append(k)
        load[r] += int(sizes[k])
    return [np.array(sorted(o), dtype=np.int64) for o in owned]


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

    def _epoch_batches(self, e: int) -> list[np.ndarray]:
        rng = np.random.default_rng(_key(_SHUFFLE_STREAM, self.seed, e))
        b = self.batch_size
        batches = []
        for bucket in np.unique(self.bucket_ids):
            members = np.flatnonzero(self.bucket_ids == bucket)
            if self.kind != "sequential":
                members = members[rng.permutation(len(members))]
            stop = len(members) - len(members) % b if self.drop_last else len(members)
            batches.extend(members[i:i + b] for i in range(0, stop, b))
        if self.kind != "sequential":
            batches = [batches[i] for i in rng.permutation(len(batches))]
        need = self._num_batches * self.world_size
        if batches and need > len(batches):
            batches = [batches[i % len(batches)] for i in range(need)]
        return batches[:need][self.rank::self.world_size]

    def indices(self, epoch: int | None = None) -> np.ndarray:
        e = self._epoch if epoch is None else _as_int("epoch", epoch, 0)
        parts = self._epoch_batches(e)
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def batches(self, epoch: int | None = None, start: int | None = None) -> Iterator[np.ndarray]:
        e = self._epoch if epoch is None else _as_int("epoch", epoch, 0)
        if start is None:
            start = self._resume[1] if self._resume is not None and self._resume[0] == e else 0
        start = _as_int("start", start, 0)
        self._resume = None
        return iter(self._epoch_batches(e)[start:])

    def _config(self) -> dict:
        cfg = super()._config()
        digest = hashlib.blake2b(self.bucket_ids.astype("<i8").tobytes(), digest_size=8).hexdigest()
        cfg.update(buckets=digest)
        return cfg


# -- variable-length batches: planned here, declared in _sequences.py (Bucket, PackSequences) ----------

class PackJob:
    """One packed batch (``PackedOrder``): the pieces of samples that fill its token range, in stream order;
    the batcher copies the pieces (``_C.gather_pieces``) and writes ``cu_seqlens``."""

    __slots__ = ("samples", "starts", "lengths", "dst", "real")

    def __init__(self, samples, starts, lengths, dst, real):
        self.samples = samples    # int64 dataset index of each piece
        self.starts = starts      # int64 first token of the piece within its sample
        self.lengths = lengths    # int64 tokens in the piece
        self.dst = dst            # int64 position of the piece in the flattened batch
        self.real = real          # tokens of real data in the batch (the rest is padding)

    def __len__(self) -> int:
        return len(self.samples)


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
        yield PackJob(stream[sel], piece_lo - begins[sel], piece_hi - piece_lo, piece_lo - lo,
                      int(min(hi, total) - lo))


def cu_seqlens(job: PackJob, row_length: int) -> np.ndarray:
    """Segment boundaries in the flattened batch: piece starts and row starts, up to the real tokens."""
    cuts = np.concatenate([job.dst, np.arange(0, job.real, row_length), [job.real]])
    return np.unique(cuts).astype(np.int32)


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
        self.tokens_per_batch = _as_int("tokens_per_batch", tokens_per_batch, 1)
        total = int(self.lengths.sum())
        g = total // self.tokens_per_batch if self.drop_last else -(-total // self.tokens_per_batch)
        self._global = g
        self._num_batches = g // world if self.drop_last else -(-g // world)

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """The epoch's whole sample stream (ranks split its batches, not its samples)."""
        return self._global_sequence(self._epoch if epoch is None else _as_int("epoch", epoch, 0))

    def batches(self, epoch: int | None = None, start: int | None = None):
        e = self._epoch if epoch is None else _as_int("epoch", epoch, 0)
        if start is None:
            start = self._resume[1] if self._resume is not None and self._resume[0] == e else 0
        start = _as_int("start", start, 0)
        self._resume = None
        w, r = self.pack_world, self.pack_rank
        ids = [(b * w + r) % max(self._global, 1) for b in range(start, self._num_batches)]
        if self._cache is None or self._cache[0] != e:
            self._cache = (e, self._global_sequence(e))
        return packed_batches(self._cache[1], self.lengths, self.tokens_per_batch, ids)

    def _config(self) -> dict:
        cfg = super()._config()
        digest = hashlib.blake2b(self.lengths.astype("<i8").tobytes(), digest_size=8).hexdigest()
        cfg.update(world_size=self.pack_world, packed=f"{self.tokens_per_batch}:{digest}")
        return cfg


def order_for(dataset, batch_size: int, kind: str, seed: int, r: int, w: int, *, drop_last: bool, window: int,
              split: str | None):
    """The Order for a fastload.Dataset: ``PackedOrder`` (PackSequences), ``BucketOrder`` (Bucket) or ``Order``;
    ``split`` None picks whole shards per rank for a remote dataset with world size > 1 (else samples)."""
    explicit = split is not None
    if split is None:
        split = "shards" if getattr(dataset, "remote", False) and w > 1 else "samples"
    shard_sizes = dataset.reader.sizes if kind == "quasi" or split == "shards" else None
    common = dict(kind=kind, seed=seed, rank=r, world_size=w, drop_last=drop_last, window=window)
    bucketed = [(n, t) for n, t in dataset.sequences.items() if isinstance(t, Bucket)]
    packed = [(n, t) for n, t in dataset.sequences.items() if isinstance(t, PackSequences)]
    if (packed or bucketed) and split == "shards":
        if explicit:
            raise ValueError("split='shards' needs plain batches: Bucket and PackSequences form their own")
        split = _strided("Bucket and PackSequences form their own batches")
    if packed:
        name, spec = packed[0]
        return PackedOrder(dataset.reader.first_dims(name), batch_size * spec.row_length, **common)
    if bucketed:
        name, spec = bucketed[0]
        lengths = dataset.reader.first_dims(name)
        spec.check_all(lengths, name)  # a local dataset checked them at open; a remote one only has them now
        return BucketOrder(spec.bucket_ids(lengths), batch_size, **common)
    try:
        return Order(len(dataset), batch_size, shard_sizes=shard_sizes, split=split, **common)
    except ValueError as e:
        if explicit or split != "shards":
            raise
        return Order(len(dataset), batch_size, shard_sizes=shard_sizes, split=_strided(str(e)), **common)


def _strided(why: str) -> str:
    warnings.warn(f"fastload: a remote dataset with world_size > 1 reads whole shards per rank by default "
                  f"(split='shards'), which cannot apply here ({why}): every rank reads every shard it needs "
                  f"(split='samples')", RuntimeWarning, stacklevel=5)  # the line that made the loader
    return "samples"
