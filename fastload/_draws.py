"""Randomness keyed per sample: a sample's draws depend only on (seed, epoch, sample index, occurrence).

The loader's order hands each batch a :class:`BatchDraws`: a numpy ``Generator`` keyed by (seed, epoch, global
batch index), which batch-level transforms (MixUp/CutMix) draw from, that also knows the seed and the epoch. The
batcher turns it into :class:`SampleDraws` for the batch's sample indices, and the crop plan draws from that: every
call draws one row per sample from a counter-based hash of (sample key, call number, column), so a sample's crop,
flip, resize and per-sample seeds do not depend on which batch it lands in, the batch size, the rank, the world
size or the number of workers. Only the call sequence matters, and a pipeline makes the same calls for every
sample (a fixed number of draws per sample and step, ``transforms.py``).

The hash is SplitMix64's finaliser (a bijection of 64-bit words), vectorised over the batch: a batch costs a few
numpy operations per draw, not a generator per sample. Uniform floats take its top 53 bits, as numpy's do;
integers in ``[low, high)`` are ``floor(u * (high - low))`` (a bias under ``(high - low) / 2**53``, none for the
ranges of crop positions and sizes). Augmentations drawing for a subset of a batch (``RandomApply``, a policy's
chosen operation) draw from :meth:`SampleDraws.at` of that subset: each sample counts its own calls, so the
draws of one sample never depend on the others'.

Occurrence. A sample read several times in one epoch (repeated augmentation, a mix's quota over a small
dataset, padding) gets independent draws per read, as under torch's DataLoader: the key also holds the read's
occurrence, a 64-bit word that is 0 for a sample's first read in the epoch (the key is then exactly
(seed, epoch, index)'s, so a sample read once keeps its pixels) and mixed into the key otherwise. fastload's own
orders count it over the epoch's global sequence (``Order.occurrences``: independent of rank, world size, batch
size and workers, and kept by a resume); a user's sampler counts it over this rank's epoch and adds the rank
(``_front/sampling.py``), torch's DataLoader per worker (``_front/getitems.py``).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

SAMPLE_STREAM = 0x53414D50  # "SAMP": never meets SHUFFLE_STREAM or BATCH_STREAM (fast/order.py)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S11, _S27, _S30, _S31 = np.uint64(11), np.uint64(27), np.uint64(30), np.uint64(31)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser over a uint64 array (wrapping arithmetic).

    It runs a dozen times per batch's crop plan, so it works in place on one fresh array: numpy's array
    arithmetic wraps without a check (no ``errstate`` needed: entering one costs as much as an operation on 64
    values); only numpy *scalars* check for overflow, so a 0-d input takes the scalar path under ``errstate``."""
    x = np.asarray(x, dtype=np.uint64)
    if x.ndim == 0:
        with np.errstate(over="ignore"):
            x = x + _GOLDEN
            x = (x ^ (x >> np.uint64(30))) * _M1
            x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))
    x = x + _GOLDEN  # the caller's array is left alone
    x ^= x >> _S30
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
    return x


def _key_words(stream: int, *parts: int) -> list[int]:
    words = [stream]
    for p in parts:
        words += [p & 0xFFFFFFFF, p >> 32]
    return words


@functools.lru_cache(maxsize=64)
def epoch_key(seed: int, epoch: int) -> int:
    """One 64-bit word for (seed, epoch), from numpy's SeedSequence (well mixed, platform-independent). Kept for
    the epochs asked last: every batch of an epoch asks for it, and a SeedSequence costs tens of microseconds."""
    return int(np.random.SeedSequence(_key_words(SAMPLE_STREAM, seed, epoch)).generate_state(1, np.uint64)[0])


_OCCURRENCE = np.uint64(0x4F434355)  # "OCCU": a repeat's word never equals a first read's (0)


def sample_keys(seed: int, epoch: int, indices: np.ndarray, occurrences: Any = None) -> np.ndarray:
    """The keys of samples ``indices`` (int64) of one epoch: ``occurrences`` (uint64 words, one per sample, or
    None: all 0) tells repeated reads apart; a 0 word leaves a sample's key as (seed, epoch, index)'s alone."""
    keys = mix64(np.uint64(epoch_key(seed, epoch)) ^ mix64(indices.astype(np.uint64)))
    if occurrences is None:
        return keys
    occ = np.asarray(occurrences, dtype=np.uint64).reshape(-1)
    if occ.size != keys.size:
        raise ValueError(f"{occ.size} occurrences for {keys.size} samples: one per sample")
    again = occ != 0
    if again.any():
        keys = keys.copy()
        keys[again] = mix64(keys[again] ^ mix64(occ[again] ^ _OCCURRENCE))
    return keys


def occurrences(seq: np.ndarray) -> np.ndarray:
    """For each position of ``seq``, how many earlier positions hold the same value (int64; a stable argsort,
    one vectorised pass). About 25 bytes a position at its peak besides ``seq`` (a mix's epoch runs it over its
    whole global sequence): the sort order and its result, 8 bytes each, one run array reused in place."""
    seq = np.asarray(seq).reshape(-1)
    n = seq.size
    if n < 2:
        return np.zeros(n, dtype=np.int64)
    order = np.argsort(seq, kind="stable")
    ranked = seq[order]
    first = np.empty(n, dtype=bool)  # where a run of equal values starts, in sorted order
    first[0] = True
    np.not_equal(ranked[1:], ranked[:-1], out=first[1:])
    del ranked
    run = np.arange(n, dtype=np.int64)
    run *= first
    np.maximum.accumulate(run, out=run)  # each sorted position's run start
    np.subtract(np.arange(n, dtype=np.int64), run, out=run)  # its rank within the run: earlier equal positions
    out = np.empty(n, dtype=np.int64)
    out[order] = run
    return out


class EpochWords:
    """The occurrence words of one rank's positions in an epoch (``fast/order.py``), kept as the positions whose
    word is not 0 and those words (16 bytes each) while they are fewer than half the positions, else as one dense
    array (8 bytes a position). An order pads the last ranks' sequences with a few second reads (``n % world``
    positions in all): their words in a dense array held 8 bytes for every position of the rank, nearly all 0."""

    def __init__(self, words: np.ndarray):
        words = np.asarray(words, dtype=np.uint64).reshape(-1)
        self.size = words.size
        at = np.flatnonzero(words)
        self.at: np.ndarray | None = at if 2 * at.size < words.size else None
        self.words = words[at] if self.at is not None else words
        self.words.flags.writeable = False  # handed out as views (``slice``)

    @property
    def nbytes(self) -> int:
        return self.words.nbytes + (0 if self.at is None else self.at.nbytes)

    def slice(self, lo: int, hi: int) -> np.ndarray | None:
        """The words of positions ``lo .. hi - 1`` (uint64), or None when all are 0."""
        hi = min(hi, self.size)
        if self.at is None:
            part = self.words[lo:hi]
            return part if part.any() else None
        a, b = np.searchsorted(self.at, [lo, hi])
        if a == b:
            return None
        out = np.zeros(max(hi - lo, 0), dtype=np.uint64)
        out[self.at[a:b] - lo] = self.words[a:b]
        return out

    def dense(self) -> np.ndarray:
        if self.at is None:
            return self.words
        out = np.zeros(self.size, dtype=np.uint64)
        out[self.at] = self.words
        return out


class ReadCounts:
    """How often each sample was read so far (one epoch of one torch iterator in one process, ``_front/getitems.py``),
    in about one byte per sample of the dataset: a uint8 count per sample, 255 meaning "255 or more", the exact count
    of those kept in a dict (a sample read 255 times in one epoch is rare). The array is the dataset's length from
    the start, zeroed lazily by the OS (``np.zeros`` maps zero pages): only the pages of the indices read cost
    memory, and a sequential sampler never copies it to grow it."""

    _SATURATED = 255

    def __init__(self, length: int):
        self.small = np.zeros(int(length), dtype=np.uint8)
        self.large: dict[int, int] = {}  # sample -> its count, for counts of 255 and more

    @property
    def nbytes(self) -> int:
        """The bytes this holds: the array, and the dict's entries at most 100 bytes each (a small int key and
        value, and the dict's slot)."""
        return self.small.nbytes + 100 * len(self.large)

    def _counts(self, idx: np.ndarray) -> np.ndarray:
        counts = self.small[idx].astype(np.uint64)
        over = np.flatnonzero(counts == self._SATURATED)
        for k in over.tolist():
            counts[k] = self.large[int(idx[k])]
        return counts

    def read(self, idx: np.ndarray) -> np.ndarray:
        """Counts the reads of batch ``idx`` (int64 sample indices, repeats allowed) and returns, per position,
        how often that sample was read before it: in earlier batches and at earlier positions of this one
        (uint64)."""
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        before = self._counts(idx) + occurrences(idx).astype(np.uint64)
        uniq, times = np.unique(idx, return_counts=True)
        after = self._counts(uniq) + times.astype(np.uint64)
        self.small[uniq] = np.minimum(after, self._SATURATED).astype(np.uint8)
        for k in np.flatnonzero(after >= self._SATURATED).tolist():
            self.large[int(uniq[k])] = int(after[k])
        return before


class SampleDraws:
    """Draws for the samples ``indices`` of one epoch: each call returns one row per sample (leading axis: the
    samples this object covers), the row a function of (seed, epoch, index, how many calls covered that sample
    before) alone. Speaks the part of numpy's ``Generator`` the plans use (``random``, ``integers``, ``uniform``,
    ``normal``). :meth:`at` covers a subset of the batch (an augmentation applied to some samples only): the other
    samples' counts do not move, so what one sample draws never depends on what the others drew."""

    def __init__(self, seed: int, epoch: int, indices: Any, occurrences: Any = None):
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        self.seed, self.epoch, self.indices = int(seed), int(epoch), idx
        self.keys = sample_keys(self.seed, self.epoch, idx, occurrences)
        self.counts = np.zeros(idx.size, dtype=np.uint64)  # calls that covered each sample (shared by views)
        self.rows = np.arange(idx.size)  # the batch positions this object draws for

    @property
    def n(self) -> int:
        return int(self.rows.size)

    def at(self, rows: Any) -> SampleDraws:
        """The draws of batch positions ``rows`` (a subset of this object's), sharing the counts."""
        view = object.__new__(SampleDraws)
        view.__dict__.update(self.__dict__)
        view.rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        return view

    def _words(self, size: Any) -> np.ndarray:
        shape = (self.n,) if size is None else ((size,) if np.ndim(size) == 0 else tuple(size))
        if not shape or shape[0] != self.n:
            raise ValueError(
                f"per-sample draws come one row per sample: size {shape} should start with the {self.n} samples "
                f"drawn for (an augmentation drawing for a subset of them draws from draws.at(subset))"
            )
        cols = math.prod(int(d) for d in shape[1:])
        rows = self.rows
        self.counts[rows] += np.uint64(1)
        # arrays: wrapping, unchecked (mix64's docstring)
        counter = mix64(self.counts[rows][:, None] * _GOLDEN + np.arange(cols, dtype=np.uint64)[None, :])
        counter ^= self.keys[rows][:, None]
        return mix64(counter).reshape(shape)

    def random(self, size: Any = None) -> np.ndarray:
        """Uniform float64 in [0, 1), 53 bits, like ``Generator.random``."""
        return (self._words(size) >> _S11).astype(np.float64) * (1.0 / 9007199254740992.0)

    def _size(self, size: Any, *params: Any) -> Any:
        if size is None:
            size = np.broadcast_shapes(*(np.shape(p) for p in params))
            if size == ():
                size = (self.n,)
        return size

    def uniform(self, low: Any = 0.0, high: Any = 1.0, size: Any = None) -> np.ndarray:
        """Uniform float64 in [low, high), like ``Generator.uniform``."""
        u = self.random(self._size(size, low, high))
        return np.asarray(low, dtype=np.float64) + (np.asarray(high, dtype=np.float64) - low) * u

    def normal(self, loc: Any = 0.0, scale: Any = 1.0, size: Any = None) -> np.ndarray:
        """Normal float64 (Box-Muller over two uniforms per value)."""
        shape = self._size(size, loc, scale)
        shape = (shape,) if np.ndim(shape) == 0 else tuple(shape)
        z = box_muller(self.random((*shape, 2)))
        return np.asarray(loc, dtype=np.float64) + np.asarray(scale, dtype=np.float64) * z

    def integers(self, low: Any, high: Any = None, size: Any = None, dtype: Any = np.int64) -> np.ndarray:
        """Uniform integers in ``[low, high)`` (``[0, low)`` without ``high``), broadcast to one per sample."""
        if high is None:
            low, high = 0, low
        size = self._size(size, low, high)
        words = self._words(size)
        if np.ndim(low) == 0 and np.ndim(high) == 0 and int(high) - int(low) > 2**53:
            span = int(high) - int(low)  # the per-sample seeds' full range: a power of two, exact from the low bits
            if span & (span - 1):
                raise ValueError(f"integers: a span over 2**53 must be a power of two, got {span}")
            return (words % np.uint64(span) + np.uint64(int(low))).astype(dtype)
        lo, hi = np.asarray(low, dtype=np.int64), np.asarray(high, dtype=np.int64)
        spans = hi - lo
        if np.any(spans <= 0):
            raise ValueError(f"integers: high should be > low (low={low}, high={high})")
        u = (words >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)
        pick = np.minimum(np.floor(u * spans).astype(np.int64), spans - 1)
        return (lo + pick).astype(dtype)


def box_muller(u: np.ndarray) -> np.ndarray:
    """Standard normal values from uniforms ``u`` in [0, 1) of shape (..., 2): what :meth:`SampleDraws.normal` draws
    from its one call's two columns (a caller holding those columns computes the same values)."""
    return np.sqrt(-2.0 * np.log1p(-u[..., 0])) * np.cos(2.0 * np.pi * u[..., 1])


class BatchDraws(np.random.Generator):
    """A batch's generator (``key``: its SeedSequence words, from the order) that also hands out per-sample draws
    keyed by (seed, epoch, index, occurrence): MixUp/CutMix draw from the generator, the crop plan from the
    samples'. ``occurrences``: the occurrence words of the batch's samples, in batch order (None: all 0)."""

    def __init__(self, key: list[int], seed: int, epoch: int, occurrences: Any = None):
        super().__init__(np.random.PCG64(np.random.SeedSequence(key)))
        self.seed, self.epoch, self.occurrences = int(seed), int(epoch), occurrences

    def samples(self, indices: Any) -> SampleDraws:
        return SampleDraws(self.seed, self.epoch, indices, self.occurrences)


def at(rng: Any, rows: np.ndarray) -> Any:
    """What an augmentation drawing for batch positions ``rows`` only draws from: ``rng.at(rows)`` for per-sample
    draws, a plain generator as it is."""
    return rng.at(rows) if isinstance(rng, SampleDraws) else rng


def for_samples(rng: Any, indices: Any) -> Any:
    """What a batch of samples ``indices`` plans from: per-sample draws when ``rng`` is a loader's
    :class:`BatchDraws`, else ``rng`` itself (a plain generator: ``ds[i]``, tests, benchmarks)."""
    return rng.samples(indices) if isinstance(rng, BatchDraws) else rng
