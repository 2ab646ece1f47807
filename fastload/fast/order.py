"""The order stage: which sample indices go into which batch, for each epoch, on each rank.

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

Variable-length fields (``Bucket``, ``PackSequences``) plan their batches in ``packing.py``, on the same
resume logic (``Order.batches``, ``state_dict``); ``chain.order_for`` picks the order from the dataset's
transforms. ``Jobs`` is the stage the fast path's chain starts with: each batch's indices with its
augmentation generator.
"""

from __future__ import annotations

import hashlib
import math
import operator
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .._draws import BatchDraws, EpochWords, occurrences
from .elastic import gather, pack_mask, split_batches, split_positions, unpack_mask
from .stage import Stage

# Order.prepare's threshold: below this many samples the next epoch's shuffle is computed when asked, in place. A
# thread's start and join cost ~0.3-0.6 CPU-ms per epoch on 2 vCPUs (more than shuffling 65,536 samples: ~0.6 ms),
# ~40 CPU-us a batch of an epoch of 16 (bench/results/raw_ceiling_cpu2.md).
PREPARE_FROM = 1 << 16


KINDS = ("sequential", "random", "quasi")
DEFAULT_BLOCK = 4096  # samples per pseudo-shard for ``quasi`` without ``shard_sizes``
STATE_VERSION = 2  # 2: adds rank and consumed (elastic resume); a version-1 state still loads
# First word of every SeedSequence key: the shuffle and the augmentation streams never meet.
SHUFFLE_STREAM = 0x53485546  # "SHUF"
BATCH_STREAM = 0x42415443  # "BATC"


def as_int(name: str, value: object, minimum: int = 0) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} should be an integer >= {minimum}, not a bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}={value!r} should be an integer >= {minimum}") from None
    if v < minimum:
        raise ValueError(f"{name}={v} should be >= {minimum}")
    return v


def seed_key(stream: int, *parts: int) -> list[int]:
    """A fixed-length SeedSequence key: two 32-bit words per part (no length or zero-padding aliasing)."""
    words = [stream]
    for p in parts:
        words += [p & 0xFFFFFFFF, p >> 32]
    return words


def digest(values: np.ndarray) -> str:
    """A short, platform-independent digest of an int array (shard sizes, bucket ids, lengths) for ``_config``."""
    return hashlib.blake2b(np.asarray(values).astype("<i8").tobytes(), digest_size=8).hexdigest()


def dist_info(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)``: the given values, else ``torch.distributed``'s when initialised, else (0, 1)."""
    if rank is None or world_size is None:
        import torch.distributed as dist

        live = dist.is_available() and dist.is_initialized()
        if world_size is None:
            world_size = dist.get_world_size() if live else 1
        if rank is None:
            rank = dist.get_rank() if live else 0
    world_size = as_int("world_size", world_size, 1)
    rank = as_int("rank", rank, 0)
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


class Order:
    """Which sample indices go into which batch, per epoch and rank; resumable from ``(epoch, batches_done)``.

    ``set_epoch(e)`` works as in ``DistributedSampler``: the epoch is an input. ``begin_epoch()`` is for
    the loader: it returns the epoch to iterate and advances by one when nobody set the epoch since.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        *,
        kind: str = "sequential",
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        shard_sizes: Sequence[int] | None = None,
        window: int = 8,
        split: str = "samples",
    ):
        self.num_samples = as_int("num_samples", num_samples, 0)
        self.batch_size = as_int("batch_size", batch_size, 1)
        if kind not in KINDS:
            raise ValueError(f"order={kind!r} should be one of {KINDS}")  # the loader's argument is order=
        self.kind = kind
        self.seed = as_int("seed", seed, 0)
        if self.seed >= 2**64:
            raise ValueError(f"{seed=} should be < 2**64")
        self.rank, self.world_size = dist_info(rank, world_size)
        if not isinstance(drop_last, (bool, np.bool_)):
            raise ValueError(f"{drop_last=} should be a bool")
        self.drop_last = bool(drop_last)
        self.window = as_int("window", window, 1)
        if shard_sizes is None:
            full, rest = divmod(self.num_samples, DEFAULT_BLOCK)
            sizes = np.array([DEFAULT_BLOCK] * full + ([rest] if rest else []), dtype=np.int64)
        else:
            sizes = np.asarray(shard_sizes)
            if sizes.ndim != 1 or (sizes.size and (sizes.dtype.kind not in "iu" or sizes.min() < 0)):
                raise ValueError(f"shard_sizes should be a 1-d sequence of sample counts >= 0, got {shard_sizes!r}")
            sizes = sizes.astype(np.int64)
            if int(sizes.sum()) != self.num_samples:
                raise ValueError(
                    f"shard_sizes sum to {int(sizes.sum())} but {num_samples=}; give one count "
                    f"per shard, in dataset order"
                )
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
                raise ValueError(
                    f"split='shards' needs the dataset's shards and at least one per rank: "
                    f"{len(sizes)} shard(s) for world_size={w}; pack with a smaller shard_size, or "
                    f"use split='samples'"
                )
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
        self._occ: tuple[int, EpochWords | None] | None = None  # (epoch, occurrences of ``_cache``'s indices)
        # epochs' indices computed ahead (prepare), by epoch: the chain asks an epoch's indices at its first batch,
        # after the loader has already asked for the next epoch's, so one slot would drop the one about to be used
        self._ahead: dict[int, tuple[threading.Thread, list]] = {}
        # (epoch, positions of its global sequence consumed before this split): an elastically resumed epoch
        self._partial: tuple[int, Any] | None = None

    def __repr__(self) -> str:
        return (
            f"Order({self.num_samples}, batch_size={self.batch_size}, kind={self.kind!r}, seed={self.seed}, "
            f"rank={self.rank}, world_size={self.world_size}, drop_last={self.drop_last}, window={self.window})"
        )

    # -- epochs ------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        self._epoch = as_int("epoch", epoch, 0)
        self._fresh = True
        self._leave_partial()

    def begin_epoch(self) -> int:
        """The epoch the loader's next pass should iterate: the one set (or loaded), else the last one + 1."""
        if not self._fresh:
            self._epoch += 1
        self._fresh = False
        self._leave_partial()
        return self._epoch

    def _leave_partial(self) -> None:
        """Another epoch than an elastically resumed one: it is that of the current split, whole."""
        if self._partial is not None and self._partial[0] != self._epoch:
            self._partial, self._cache = None, None

    def _partial_of(self, e: int) -> Any:
        """What was consumed of epoch ``e`` before the current split (None: nothing, the epoch is whole)."""
        return self._partial[1] if self._partial is not None and self._partial[0] == e else None

    # -- indices -----------------------------------------------------------------------------
    def num_batches(self, epoch: int | None = None) -> int:
        """This rank's batches in ``epoch`` (default: the current one); fewer in an elastically resumed epoch."""
        mask = self._partial_of(self._epoch if epoch is None else epoch)
        if mask is None:
            return self._num_batches
        return split_batches(int((~mask).sum()), self.world_size, self.batch_size, self.drop_last)

    def __len__(self) -> int:
        """This rank's batches in a whole epoch, also while an elastically resumed one runs (``num_batches()`` is
        what is left of that one): torch's ``len(DataLoader)``, which a framework reads once for every epoch.
        Lightning counts a resumed epoch's batches from the saved ``batches_done`` up to it; the resumed epoch's
        own count would end that epoch early and every later one after as few batches."""
        return self._num_batches

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's sample indices for ``epoch`` (int64, read-only), after padding or dropping."""
        e = self._epoch if epoch is None else as_int("epoch", epoch, 0)
        if self._cache is not None and self._cache[0] == e:
            return self._cache[1]
        ahead, mine = self._ahead.pop(e, None), None
        if ahead is not None:  # prepared in the background (``prepare``)
            ahead[0].join()
            mine = ahead[1][0]  # None if it failed (computed again here, raising here) or ran in a parent process
        if mine is None:
            mine, occ = self._compute(e)
        else:
            mine, occ = mine
        self._cache, self._occ = (e, mine), (e, occ)
        return mine

    def occurrences(self, epoch: int) -> np.ndarray | None:
        """For each of this rank's positions of ``epoch`` (``indices``'s), how many earlier positions of the
        epoch's global sequence (after padding) hold the same sample: what keys a repeated read's draws apart
        (``_draws.py``). None: no sample repeats. Computed with the indices, once per epoch, and kept as the
        repeats alone where they are few (``EpochWords``: padding); an order of another kind (``packing.py``) has
        none."""
        words = self._words(as_int("epoch", epoch, 0))
        return None if words is None else words.dense()

    def _words(self, e: int) -> EpochWords | None:
        if type(self).indices is not Order.indices:
            return None
        if self._occ is None or self._occ[0] != e or self._cache is None or self._cache[0] != e:
            self.indices(e)
        return self._occ[1] if self._occ is not None else None

    def prepare(self, epoch: int) -> None:
        """Start computing ``indices(epoch)`` in a background thread; ``indices(epoch)`` then waits for it
        instead of computing. The loader prepares the next epoch's order while an epoch runs: a shuffle of
        262,144 samples costs ~2.5 ms on one core (as much as 10 batches of 1,024 tiny records to fill), and
        numpy's shuffle releases the GIL. Holds a second epoch's indices meanwhile (8 bytes a sample).
        Orders of fewer than ``PREPARE_FROM`` samples are computed in place when asked: starting the thread costs
        more than their shuffle."""
        if self.kind == "sequential" or type(self).indices is not Order.indices or self.num_samples < PREPARE_FROM:
            return  # nothing worth a thread, or an order of another kind (packing.py) with its own cache
        if (self._cache is not None and self._cache[0] == epoch) or epoch in self._ahead:
            return
        for old in [k for k in self._ahead if k < epoch - 1]:  # epochs skipped (set_epoch): never asked for
            del self._ahead[old]
        box: list = [None]

        def run() -> None:
            try:
                box[0] = self._compute(epoch)
            except BaseException:  # computed again, raising, when asked for
                pass

        thread = threading.Thread(target=run, name="fastload-order", daemon=True)
        self._ahead[epoch] = (thread, box)
        thread.start()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_ahead"] = {}  # a thread does not travel
        return state

    def _compute(self, e: int) -> tuple[np.ndarray, EpochWords | None]:
        """This rank's indices of epoch ``e`` and their occurrences (``occurrences``; None: all 0)."""
        n, w = self.num_samples, self.world_size
        total = self._per_rank * w
        mask = self._partial_of(e)
        occ: np.ndarray | None
        if mask is not None:  # the rest of an elastically resumed epoch, split as a fresh one would be
            rest = np.flatnonzero(~mask)
            pos = split_positions(len(rest), self.rank, w, self.batch_size, self.drop_last)
            seq = self._global_sequence(e)
            mine = seq[rest[pos]]
            # a position keeps the occurrence it had in the whole epoch; a padding copy (a wrap past the
            # rest) counts past every read of its sample in the epoch, as a fresh epoch's padding does
            wraps = np.arange(self.rank, self.rank + w * len(pos), w, dtype=np.int64) // max(len(rest), 1)
            occ = self._sequence_occurrences(seq, rest[pos], wraps)
        elif self.split == "shards":  # a rank's own shards: no sample is another rank's
            mine = self._own_sequence(e)
            mine = np.resize(mine, self._per_rank) if len(mine) < self._per_rank else mine[: self._per_rank]
            occ = occurrences(mine)
        elif self.kind == "sequential" and type(self)._global_sequence is Order._global_sequence:
            at = np.arange(self.rank, total, w, dtype=np.int64)
            mine = at % max(n, 1)  # 0 .. n-1 split, without the sequence
            occ = at // max(n, 1)
        elif total <= n and self._is_permutation():  # no padding: each sample once, a strided slice
            mine = np.ascontiguousarray(self._global_sequence(e)[self.rank : total : w])
            occ = None
        else:
            seq = self._global_sequence(e)
            at = np.arange(self.rank, total, w, dtype=np.int64)
            mine = np.ascontiguousarray(seq[at % max(n, 1)]) if n else np.zeros(0, np.int64)
            occ = self._sequence_occurrences(seq, at % max(n, 1), at // max(n, 1)) if n else None
        if self.drop_last:
            mine = mine[: self._num_batches * self.batch_size]
            occ = None if occ is None else occ[: len(mine)]
        mine.flags.writeable = False
        return mine, (EpochWords(occ) if occ is not None and occ.any() else None)

    def _sequence_occurrences(self, seq: np.ndarray, at: np.ndarray, wraps: np.ndarray) -> np.ndarray | None:
        """The occurrences of positions ``at`` of the global sequence ``seq``, read on wrap ``wraps`` (padding
        wraps around the sequence): earlier reads of the same sample in ``seq``, plus a whole ``seq``'s worth of
        them per wrap. A permutation's (the plain orders') are its wraps alone, without a pass over it."""
        if self._is_permutation():
            return wraps if wraps.any() else None  # a permutation (random, quasi): each sample once
        occ = occurrences(seq)
        if not wraps.any():
            return occ[at]
        counts = np.bincount(seq, minlength=self.num_samples)
        return occ[at] + wraps * counts[seq[at]]

    def _is_permutation(self) -> bool:
        """Whether the global sequence holds each sample once (the plain random and quasi orders)."""
        return self.kind != "sequential" and type(self)._global_sequence is Order._global_sequence

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
        rng = np.random.default_rng(seed_key(SHUFFLE_STREAM, self.seed, e, self.rank + 1))
        if self.kind == "random":
            return samples[rng.permutation(len(samples))]
        return samples[_quasi_sequence(rng, sizes, self.window)]

    def _global_sequence(self, e: int) -> np.ndarray:
        """The epoch's sample sequence before the rank split (the same on every rank): the one function an order
        of another kind (a mix of datasets) overrides to have its own sequence, with padding, the rank split and
        (elastic) resume inherited. Its length is ``num_samples``."""
        if self.kind == "sequential":
            return np.arange(self.num_samples, dtype=np.int64)
        rng = np.random.default_rng(seed_key(SHUFFLE_STREAM, self.seed, e))
        if self.kind == "random":
            return rng.permutation(self.num_samples).astype(np.int64, copy=False)
        return _quasi_sequence(rng, self.shard_sizes, self.window)

    def batches(self, epoch: int | None = None, start: int | None = None) -> Iterator[Any]:
        """This rank's batches of ``epoch`` from batch ``start``: read-only int64 index views (a ``PackJob``
        per batch for ``PackedOrder``). The one resume logic of every order: ``start=None`` means the resume
        point from ``load_state_dict`` when it is for this epoch, else 0; any call uses up a pending resume
        point."""
        e = self._epoch if epoch is None else as_int("epoch", epoch, 0)
        if start is None:
            start = self._resume[1] if self._resume is not None and self._resume[0] == e else 0
        start = as_int("start", start, 0)
        nb = self.num_batches(e)
        if start > nb:
            raise ValueError(f"{start=} should be <= num_batches={nb}")
        self._resume = None
        return self._epoch_batches(e, start)

    def _epoch_batches(self, e: int, start: int) -> Iterator[Any]:
        """Batches ``start ..`` of epoch ``e``: what an order of another kind (``packing.py``) defines."""
        b, idx = self.batch_size, self.indices(e)
        return (idx[i * b : (i + 1) * b] for i in range(start, self.num_batches(e)))

    def batch_rng(self, epoch: int, batch_index: int) -> np.random.Generator:
        """The batch transforms' generator of one batch (MixUp/CutMix), keyed by (seed, epoch, global batch index:
        ``batch_index * world + rank``); its per-sample draws (``_draws.py``), for every other transform, are keyed
        by (seed, epoch, sample index, occurrence: ``occurrences``). In an elastically resumed epoch the global
        batch index starts past the consumed samples' count (more than the batches that read them), so no batch
        repeats a consumed one's draws."""
        e = as_int("epoch", epoch, 0)
        i = as_int("batch_index", batch_index, 0)
        g = self._batch_base(e) + i * self.batch_world + self.batch_rank
        return BatchDraws(seed_key(BATCH_STREAM, self.seed, e, g), self.seed, e, self._batch_occurrences(e, i))

    def _batch_occurrences(self, e: int, i: int) -> np.ndarray | None:
        """The occurrences of batch ``i``'s samples (None: all 0): what an order of another kind overrides."""
        words = self._words(e)
        return None if words is None else words.slice(i * self.batch_size, (i + 1) * self.batch_size)

    def _batch_base(self, e: int) -> int:
        """The first global batch index of epoch ``e``'s current split: 0, or past what was consumed before it."""
        partial = self._partial_of(e)
        if partial is None:
            return 0
        return int(partial) if isinstance(partial, (int, np.integer)) else int(np.count_nonzero(partial))

    # -- resume ------------------------------------------------------------------------------
    @property
    def batch_rank(self) -> int:
        """The rank that keys the batch generators (``PackedOrder``'s ranks split batches, not samples)."""
        return self.rank

    @property
    def batch_world(self) -> int:
        """The number of ranks the batches of one step are spread over (``batch_rank``'s world)."""
        return self.world_size

    def _config(self) -> dict:
        """What a saved position must agree with to resume here; an order of another kind adds its own."""
        cfg = {
            "kind": self.kind,
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "drop_last": self.drop_last,
        }
        if self.split != "samples":
            cfg["split"] = self.split
        if self.kind == "quasi":
            cfg.update(window=self.window, shards=f"{len(self.shard_sizes)}:{digest(self.shard_sizes)}")
        return cfg

    def state_dict(self, batches_done: int, epoch: int | None = None) -> dict:
        """The position after ``batches_done`` batches of ``epoch`` (default: the current one).

        Every rank is at the same position (all step together), so any rank's state (say rank 0's) loads on all,
        also on another number of ranks or at another batch size (``elastic.py``); ``rank`` lets a list of all
        ranks' states be checked complete. ``consumed``: the epoch's positions read before the current split
        (empty unless this epoch was itself resumed elastically)."""
        e = self._epoch if epoch is None else as_int("epoch", epoch, 0)
        k = as_int("batches_done", batches_done, 0)
        nb = self.num_batches(e)
        if k > nb:
            raise ValueError(f"batches_done={k} should be <= num_batches={nb}")
        return {
            "version": STATE_VERSION,
            "epoch": e,
            "batches_done": k,
            "seed": self.seed,
            "rank": self.batch_rank,
            **self._config(),
            **self._partial_state(e),
        }

    def _partial_state(self, e: int) -> dict:
        """What a state says of an elastically resumed epoch ``e`` (what was consumed before its split)."""
        return {"consumed": pack_mask(self._partial_of(e))}

    def load_state_dict(self, state: dict | list) -> int:
        """Adopt the saved seed and epoch; the next ``batches()`` of that epoch starts where the saved one stopped.

        ``state``: one state (all ranks at the same batch, as under DDP), or the list of all ranks' states. Saved
        with this order's world size and batch size, the epoch goes on at the saved batch, as it would have;
        saved with others, what the saved ranks consumed is worked out and the rest of the epoch is split over
        this order's ranks (``elastic.py``). Returns the batch the epoch goes on at."""
        first, done = gather(state, _is_position, _not_a_position)
        mine = self._config()
        # every setting either side names: a state of an order of another kind (a mix's, Bucket's, PackSequences')
        # holds keys this one has not, and must not load as if they were not there
        saved = {k: first.get(k) for k in set(mine) | (set(first) - _POSITION_KEYS)}
        diff = sorted(k for k in saved if saved[k] != mine.get(k))
        fixed = [k for k in diff if k not in self.split_keys]
        if fixed:
            raise ValueError(_not_resumable(fixed, saved, mine))
        epoch = as_int("epoch", first["epoch"], 0)
        seed = as_int("seed", first["seed"], 0)
        k = as_int("batches_done", first["batches_done"], 0)
        before = self._saved_partial(first)
        lockstep = done is None or len(set(done.values())) == 1
        if done is not None:
            k = max(done.values())
        if not diff and lockstep:
            self._adopt(seed, epoch, before)
            nb = self.num_batches(epoch)
            if k > nb:
                raise ValueError(f"batches_done={k} should be <= num_batches={nb}")
            # A finished epoch resumes at the next one; an unfinished one resumes inside itself.
            self._fresh = k < nb
            self._resume = (epoch, k) if self._fresh else None
            return k
        why = self._not_elastic()
        if why:
            if diff:
                raise ValueError(_not_resumable(diff, saved, mine) + f". {why}")
            raise ValueError(
                f"cannot resume from these states: the ranks had received different numbers of batches "
                f"({sorted(set(done.values()))}), which only an elastic resume evens out. {why}"
            )
        ranks = done if done is not None else {r: k for r in range(as_int("world_size", first["world_size"], 1))}
        self._adopt(seed, epoch, before)
        consumed = self._consumed(epoch, before, first, ranks)
        # Nothing of it may be left for this split (drop_last): the epoch stays, empty, so that a loop that sets the
        # saved epoch (Lightning does) does not read it again whole; the next begin_epoch() goes on to the next one.
        self._adopt(seed, epoch, consumed)
        self._fresh, self._resume = True, None
        return 0

    # -- elastic resume: what an order of another kind redefines (``packing.py``) ---------------------------------
    split_keys: tuple[str, ...] = ("world_size", "batch_size", "drop_last")  # may differ at an (elastic) resume

    def _adopt(self, seed: int, epoch: int, partial: Any) -> None:
        self.seed, self._epoch, self._cache, self._ahead = seed, epoch, None, {}  # (the seed may differ)
        self._partial = None if partial is None else (epoch, partial)

    def _saved_partial(self, state: dict) -> Any:
        return unpack_mask(state.get("consumed"), self.num_samples)

    def _not_elastic(self) -> str | None:
        """Why this order cannot resume a position saved with another world size or batch size (None: it can)."""
        if self.split == "shards":
            return (
                "With split='shards' each rank orders its own shards, so a position goes on only with the same "
                "world_size and batch_size; resume elastically with split='samples'"
            )
        return None

    def _consumed(self, e: int, before: Any, saved: dict, done: dict[int, int]) -> Any:
        """The positions of epoch ``e``'s global sequence consumed once ranks ``done`` (rank: batches) of the
        saved split had their batches, on top of ``before`` (consumed before that split)."""
        n = self.num_samples
        mask = np.zeros(n, dtype=bool) if before is None else before.copy()
        rest = np.flatnonzero(~mask)
        w = as_int("world_size", saved["world_size"], 1)
        b = as_int("batch_size", saved["batch_size"], 1)
        drop = bool(saved["drop_last"])
        nb = split_batches(len(rest), w, b, drop)
        for r, k in done.items():
            if k > nb:
                raise ValueError(f"batches_done={k} of rank {r} should be <= num_batches={nb} of the saved loader")
            mask[rest[split_positions(len(rest), r, w, b, drop)[: k * b]]] = True
        return mask


# What a state says of the position, not of the order it counts in (``state_dict``, ``_partial_state``).
# what a state says of where it is, not of the order that made it ("stages": the running chain's state, the loader's)
_POSITION_KEYS = frozenset(("version", "epoch", "batches_done", "seed", "rank", "consumed", "tokens_before", "stages"))


def _is_position(state: Any) -> bool:
    return isinstance(state, dict) and state.get("version") in (1, STATE_VERSION) and "driver" not in state


def _not_a_position(state: Any) -> ValueError:
    got = state.get("version") if isinstance(state, dict) else type(state).__name__
    return ValueError(
        f"not a saved loader position (version {got!r}, expected {STATE_VERSION}): pass the dict "
        f"that loader.state_dict() returned (Order.state_dict() for an Order used alone), or the list of all "
        f"ranks' dicts"
    )


# An order setting (``Order._config``'s keys) as the DataLoader argument or the dataset it comes from, for resume
# messages; the keys of the dataset's own make "open the dataset it was saved on" the fix.
_TERMS = {
    "kind": lambda v: f"order={v!r}" + {"random": " (shuffle=True)", "sequential": " (shuffle=False)"}.get(v, ""),
    "num_samples": lambda v: f"a dataset of {v} samples",
    "shards": lambda v: f"a dataset of {str(v).split(':')[0]} shards (digest of their sizes {str(v).split(':')[-1]})",
    "world_size": lambda v: f"world_size={v} (processes)",
    "mix": lambda v: f"a mix of {v}",  # fast/mixing.py
    # packing.py: digests of what the dataset's transforms made of its samples
    "buckets": lambda v: f"transforms.Bucket's buckets of the samples (digest {v})",
    "packed": lambda v: f"transforms.PackSequences over samples of lengths with digest {v}",
    "tokens_per_batch": lambda v: f"transforms.PackSequences batches of {v} tokens",
}
_NONE = {"buckets": "no transforms.Bucket", "packed": "no transforms.PackSequences"}
_DATASET_KEYS = frozenset(("num_samples", "shards", "mix", "buckets", "packed", "tokens_per_batch"))
_DEFAULTS = {"split": "samples"}  # a setting a state leaves out when it has this value (``_config``)


def _user_terms(key: str, value: Any) -> str:
    if value is None and key in _DEFAULTS:
        value = _DEFAULTS[key]
    if value is None:
        return _NONE.get(key, f"no {key}")
    term = _TERMS.get(key)
    return term(value) if term is not None else f"{key}={value!r}"


def _not_resumable(diff: list[str], saved: dict, mine: dict) -> str:
    """Why a saved position cannot go on in this loader, in the terms the user built both loaders with."""
    was = ", ".join(_user_terms(k, saved[k]) for k in diff)
    now = ", ".join(_user_terms(k, mine.get(k)) for k in diff)
    same = [_user_terms(k, saved[k]) for k in diff if k not in _DATASET_KEYS]
    data = [k for k in diff if k in _DATASET_KEYS]
    build = " and ".join(
        filter(
            None,
            [
                ", ".join(same) and f"build this DataLoader with {', '.join(same)}",
                data
                and "open the dataset it was saved on"
                + (" with the same transforms" if {"buckets", "packed"} & set(data) else ""),
            ],
        )
    )
    return (
        f"cannot resume from this state: it was saved by a loader with {was}, and this loader has {now}. A saved "
        f"position counts batches of that loader's order over its dataset, so it goes on only in a loader built "
        f"the same way: to resume, {build} (the rank may differ); to start over with the new settings, leave "
        f"load_state_dict out (or load only the model's and optimizer's state)"
    )


def _assign_shards(sizes: np.ndarray, world: int) -> list[np.ndarray]:
    """Shards per rank, balanced by samples: largest first, each to the rank with the fewest so far."""
    owned: list[list[int]] = [[] for _ in range(world)]
    load = np.zeros(world, dtype=np.int64)
    for k in sorted(range(len(sizes)), key=lambda k: (-int(sizes[k]), k)):
        r = int(np.argmin(load))
        owned[r].append(k)
        load[r] += int(sizes[k])
    return [np.array(sorted(o), dtype=np.int64) for o in owned]


class Jobs(Stage):
    """The chain's first stage: ``(indices, generator)`` per batch of one epoch, from batch ``start`` on.

    ``plan`` is an ``Order`` or a ``_sampling.SamplerOrder`` (both have ``batches(epoch, start)`` and
    ``batch_rng(epoch, b)``); the generator keys the batch transforms by (seed, epoch, global batch), the samples'
    draws by (seed, epoch, sample index) (``_draws.py``), and
    is None when the dataset has no random transform (a Generator per batch costs more than a tiny batch)."""

    def __init__(self, plan: Any, epoch: int, start: int, needs_rng: bool):
        self.plan, self.epoch, self.needs_rng = plan, epoch, needs_rng
        self.reset({"batch": start})

    def __next__(self) -> tuple[Any, np.random.Generator | None]:
        if self._batches is None:  # asked for at the first next(): a sampler's order draws its indices then, once
            self._batches = iter(self.plan.batches(self.epoch, self.batch))
        indices = next(self._batches)
        b = self.batch
        self.batch = b + 1
        return indices, (self.plan.batch_rng(self.epoch, b) if self.needs_rng else None)

    def state(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch}

    def reset(self, state: dict | None = None) -> None:
        self.batch = 0 if state is None else state["batch"]
        self._batches: Iterator[Any] | None = None
