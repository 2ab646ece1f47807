"""The fast path driven by a user's sampler: the sampler owns the order, fastload fills the batches.

Frameworks re-create the loader with a sampler of their own (Lightning injects a ``DistributedSampler``,
users pass ``RandomSampler(generator=g)``); the batches then come from ``loader.batch_sampler`` (torch's
``BatchSampler`` over the sampler, or the user's ``BatchSampler``), drawn in the calling thread when
the iteration starts, exactly as torch's iterator would draw them, and filled by the native batcher.

What that means for determinism and resume:

* the *order* is the sampler's: ``DistributedSampler`` is a pure function of its (seed, epoch, rank,
  num_replicas) -- call ``set_epoch`` (Lightning does) or every epoch repeats; ``RandomSampler``
  draws from its ``generator`` (or from torch's global generator when it has none) as in torch;
  ``SequentialSampler`` is ``0 .. n-1``. fastload's ``seed`` does not change it.
* the *augmentation* (random crops and flips) is fastload's: keyed by (seed, epoch, rank, batch), where
  epoch is the loader's (one per ``iter``, or ``set_epoch``; a change of a DistributedSampler's epoch, as
  Lightning makes each epoch, is the loader's too: see ``DataLoader._begin_epoch``) and rank the sampler's.
* ``state_dict()`` is a position: (epoch, batches done), the sampler's settings, and for
  ``RandomSampler`` the state of the generator it drew the epoch from. ``load_state_dict()`` replays
  the epoch's order and skips the batches already done, so the batches that follow are exactly those
  an uninterrupted run would have had. That holds for ``DistributedSampler``, ``RandomSampler`` and
  ``SequentialSampler`` (alone or in torch's ``BatchSampler``). Any other sampler still drives the
  fast path and its state saves; loading it at an epoch boundary starts the next epoch (the sampler
  draws it as it would), but a mid-epoch state for it is refused on load: its next batches are unknown.

The generic path (any other Dataset) resumes the same way (``IndexReplay``): the loader hands torch's
iterator, or its worker processes, the sampler's epoch replayed from the next batch. Only the order is
replayed there: randomness your Dataset draws in ``__getitem__`` (per-worker seeds) is not.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DistributedSampler, RandomSampler, SequentialSampler
from torch.utils.data.dataloader import _BaseDataLoaderIter

from .._draws import BatchDraws, occurrences
from ..fast.order import BATCH_STREAM, KINDS, seed_key

STATE_VERSION = 1


class EpochInput:
    """``set_epoch`` on the samplers fastload's loader makes when it is given none: Lightning calls
    ``loader.sampler.set_epoch(epoch)`` at the start of every epoch (it never calls the loader's), and this is
    how the loader learns Lightning's epoch, also in a process resumed from an end-of-epoch checkpoint, where
    it restores no loader state. The loader takes the value when its next iteration starts."""

    pending_epoch: int | None = None

    def set_epoch(self, epoch: int) -> None:
        self.pending_epoch = operator.index(epoch)


class EpochSequentialSampler(EpochInput, SequentialSampler):
    """torch's SequentialSampler, the same indices, plus ``EpochInput.set_epoch``."""

    state_name = "SequentialSampler"


class EpochRandomSampler(EpochInput, RandomSampler):
    """torch's RandomSampler, the same draws from the same generator, plus ``EpochInput.set_epoch``."""

    state_name = "RandomSampler"


RANDOM = (RandomSampler, EpochRandomSampler)
REPLAYABLE = (SequentialSampler, RandomSampler, DistributedSampler, EpochSequentialSampler, EpochRandomSampler)


def slot_batch_size(loader_batch_size: int | None, batch_sampler: Any) -> int | None:
    """How many samples a slot must hold: the loader's batch size, or a torch BatchSampler's. None when
    neither is known (a batch sampler of any other kind: batches of any length)."""
    if loader_batch_size is not None:
        return loader_batch_size
    size = getattr(batch_sampler, "batch_size", None)  # a BatchSampler subclass need not set it (accelerate's)
    if isinstance(batch_sampler, BatchSampler) and isinstance(size, int):
        return size
    return None


def _replayable(batch_sampler: Any) -> bool:
    return type(batch_sampler) is BatchSampler and type(batch_sampler.sampler) in REPLAYABLE


def _root(index_sampler: Any) -> Any:
    """The sampler under a torch BatchSampler (or the index sampler itself). A BatchSampler subclass need
    not have one (accelerate's BatchSamplerShard and SkipBatchSampler wrap a batch sampler instead): it is
    then its own root, iterated as it is, like torch does."""
    if isinstance(index_sampler, BatchSampler):
        return getattr(index_sampler, "sampler", index_sampler)
    return index_sampler


def _rng_state(sampler: Any) -> torch.Tensor:
    gen = getattr(sampler, "generator", None)
    return (torch.get_rng_state() if gen is None else gen.get_state()).clone()


def _replay(sampler: Any, saved: torch.Tensor, draw):
    """``draw()`` with ``sampler``'s generator (torch's default one when it has none) at ``saved``; torch's
    default generator is put back afterwards, where the caller's checkpoint left it."""
    gen = getattr(sampler, "generator", None)
    if gen is not None:
        gen.set_state(saved)
        return draw()
    now = torch.get_rng_state()
    torch.set_rng_state(saved)
    try:
        return draw()
    finally:
        torch.set_rng_state(now)


def _sampler_config(index_sampler: Any, num_samples: int | None) -> dict:
    s = _root(index_sampler)
    cfg: dict = {
        "sampler": getattr(s, "state_name", type(s).__name__),
        "batch_sampler": type(index_sampler).__name__,
        "num_samples": num_samples,
        "batch_size": getattr(index_sampler, "batch_size", None),
        "drop_last": bool(getattr(index_sampler, "drop_last", False)),
    }
    try:
        cfg["num_batches"] = len(index_sampler)
    except TypeError:  # an IterableDataset's sampler has no length
        cfg["num_batches"] = None
    if isinstance(s, DistributedSampler):
        cfg.update(
            num_replicas=s.num_replicas,
            shuffle=bool(s.shuffle),
            sampler_seed=int(s.seed),
            sampler_drop_last=bool(s.drop_last),
        )
    return cfg


def _check_state(state: Any, driver: str, mine: dict, done_ok: bool, position: str) -> tuple[int, int]:
    if not isinstance(state, dict) or state.get("driver") != driver or state.get("version") != STATE_VERSION:
        what = state.get("driver", "fastload's own order") if isinstance(state, dict) else type(state).__name__
        raise ValueError(
            f"not a state of this kind of fastload.DataLoader (got driver {what!r}, expected "
            f"{driver!r}); load the dict that state_dict() returned on a loader built the same way"
        )
    diff = [f"{k}={state.get(k)!r} (this loader: {v!r})" for k, v in mine.items() if state.get(k) != v]
    if diff:
        raise ValueError(
            "cannot resume from a state saved with a different sampler or batching: "
            + ", ".join(diff)
            + "; build the loader and its sampler with the saved settings (rank may differ)"
        )
    epoch, done = int(state["epoch"]), int(state["batches_done"])
    if done and not done_ok:
        raise ValueError(
            f"cannot resume mid-epoch (batch {done} of {mine['num_batches']}): {position} cannot be "
            f"replayed, so the batches after the checkpoint are unknown; resume from an end-of-epoch "
            f"checkpoint, or use DistributedSampler, RandomSampler or SequentialSampler (alone or in "
            f"torch's BatchSampler), or no sampler"
        )
    return epoch, done


def check_order_args(
    sampler: Any, batch_sampler: Any, order: str | None, shuffle: bool | None, rank: int | None, world_size: int | None
) -> None:
    """Refuse, by name, what fastload's order arguments ask for that a user's sampler would silently override."""
    if order is not None and order not in KINDS:
        raise ValueError(f"order={order!r} should be one of {', '.join(map(repr, KINDS))} (or None: from shuffle)")
    if order == "sequential" and shuffle:
        raise ValueError("shuffle=True and order='sequential' contradict each other: give one of them")
    given = sampler if sampler is not None else batch_sampler
    if given is None:
        return
    what = f"{'sampler' if sampler is not None else 'batch_sampler'}={type(given).__name__}"
    if order is not None:
        raise ValueError(
            f"order={order!r} cannot apply with {what}: the sampler picks every index and their order. "
            f"Drop order=, or drop the sampler (fastload then orders and splits the samples itself; "
            f"under Lightning, Trainer(use_distributed_sampler=False) keeps it from injecting one)"
        )
    if rank is None and world_size is None:
        return
    s = _root(given) if sampler is None else given
    if isinstance(s, DistributedSampler) and rank in (None, s.rank) and world_size in (None, s.num_replicas):
        return  # the sampler already splits the data as asked
    named = ", ".join(f"{k}={v}" for k, v in (("rank", rank), ("world_size", world_size)) if v is not None)
    raise ValueError(
        f"{named} cannot apply with {what}: the sampler picks every index, so fastload cannot split them "
        f"by rank. Use DistributedSampler(dataset, num_replicas=world_size, rank=rank), or drop the "
        f"sampler (fastload then splits the samples itself)"
    )


def agreed_seed(seed: int, world_size: int) -> int:
    """``seed`` (drawn by this process) in a single process; across ranks under torch.distributed, 0, the default
    seed of torch's ``DistributedSampler``: every rank (and every run) shuffles with the same permutation per
    epoch, so the ranks' shares are disjoint. Ranks cannot each keep a draw of their own (their shares would
    overlap), and agreeing on one by a collective (rank 0's draw broadcast, as before) hangs every loader that
    not all ranks build, or build in another order (a shuffled loader made on rank 0 only): no collective here.
    Without torch.distributed nothing says the processes run together: refused, naming the fix."""
    if world_size == 1:
        return seed
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            f"world_size={world_size} with shuffling and no seed=: each process would draw its own "
            f"permutation and the ranks' shares would overlap; pass the same seed= on every rank"
        )
    return 0


class SamplerOrder:
    """The epochs of a loader whose sampler drives the fast path; resumable as a position."""

    def __init__(self, batch_sampler: BatchSampler, batch_size: int, num_samples: int, seed: int, rank: int):
        self.batch_sampler = batch_sampler
        self.batch_size = batch_size
        self.num_samples = num_samples
        self.seed = seed
        self.rank = rank
        self.replayable = _replayable(batch_sampler)
        self._rng_state: torch.Tensor | None = None  # the generator the current epoch was drawn from
        self._replay: torch.Tensor | None = None  # set by load_state_dict for a mid-epoch RandomSampler resume
        self._occ: tuple[int, list] | None = None  # (epoch, each batch's repeats or length: _batch_occurrences)

    @property
    def sampler(self) -> Any:
        return getattr(self.batch_sampler, "sampler", None)

    def __len__(self) -> int:
        return len(self.batch_sampler)

    # -- one epoch ---------------------------------------------------------------------------------
    def epoch_batches(self) -> list[np.ndarray]:
        """This epoch's index batches, drawn now (in the calling thread, like torch's iterator)."""
        s = self.sampler
        if type(s) in RANDOM:
            if self._replay is not None:  # a resumed epoch: draw it again from the saved generator state
                self._rng_state, self._replay = self._replay, None
                return _replay(s, self._rng_state, self._draw)
            self._rng_state = _rng_state(s)
        return self._draw()

    def batches(self, epoch: int, start: int):
        """Batches ``start ..`` of this epoch (``Order``'s interface, for the chain's ``Jobs``): the epoch is
        drawn now, in the calling thread, like torch's iterator; ``epoch`` keys only the generators."""
        batches = self.epoch_batches()
        self._occ = (epoch, _batch_occurrences(batches))
        return iter(batches[start:])

    def drop_resume(self) -> None:
        """Another epoch was set: a loaded mid-epoch position (its generator state to replay) no longer applies."""
        self._replay = None

    def _draw(self) -> list[np.ndarray]:
        bs = self.batch_sampler
        if type(bs) is BatchSampler:
            idx = np.fromiter((operator.index(i) for i in bs.sampler), dtype=np.int64)
            b = bs.batch_size
            stop = len(idx) - len(idx) % b if bs.drop_last else len(idx)
            batches = [idx[i : i + b] for i in range(0, stop, b)]
        else:
            batches = [np.fromiter((operator.index(i) for i in batch), dtype=np.int64) for batch in bs]
            if batches:
                idx = np.concatenate(batches)
            else:
                idx = np.zeros(0, np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_samples):
            bad = int(idx[(idx < 0) | (idx >= self.num_samples)][0])
            raise IndexError(
                f"the sampler gave index {bad}, out of range for a dataset of {self.num_samples} "
                f"samples; a sampler must yield indices 0 .. {self.num_samples - 1}"
            )
        for batch in batches:
            if len(batch) > self.batch_size:
                raise ValueError(
                    f"the batch_sampler gave a batch of {len(batch)} indices, but its batch_size is "
                    f"{self.batch_size}: fastload's slots hold batch_size samples; give batches of at "
                    f"most batch_size indices"
                )
        return batches

    def batch_rng(self, epoch: int, batch_index: int) -> np.random.Generator:
        """Augmentation randomness of one batch, keyed by (seed, epoch, rank, batch) like ``Order.batch_rng``."""
        occ = None
        if self._occ is not None and self._occ[0] == epoch and batch_index < len(self._occ[1]):
            # occurrence + rank * 2**32: a repeated-augmentation sampler (timm's RepeatAugSampler) puts the copies
            # of a sample on different ranks, each read once there; rank 0's first reads keep (seed, epoch,
            # index)'s key alone, another rank's draws depend on the rank
            entry = self._occ[1][batch_index]  # the batch's words, or its length where no sample of it repeats
            if self.rank:
                words = np.zeros(entry, np.uint64) if isinstance(entry, int) else entry
                words = words + (np.uint64(self.rank) << np.uint64(32))
                occ = words if words.any() else None
            elif not isinstance(entry, int):
                occ = entry  # kept only where a sample repeats (_batch_occurrences): never all 0
        return BatchDraws(seed_key(BATCH_STREAM, self.seed, epoch, self.rank, batch_index), self.seed, epoch, occ)

    # -- resume ------------------------------------------------------------------------------------
    def _config(self) -> dict:
        return _sampler_config(self.batch_sampler, self.num_samples) | {"batch_size": self.batch_size}

    def state_dict(self, epoch: int, batches_done: int) -> dict:
        """The position after ``batches_done`` batches of ``epoch`` (rank-free: load it on every rank)."""
        state = {
            "version": STATE_VERSION,
            "driver": "sampler",
            "epoch": epoch,
            "batches_done": batches_done,
            "seed": self.seed,
            "replayable": self.replayable,
            **self._config(),
        }
        s = self.sampler
        if isinstance(s, DistributedSampler):
            state["sampler_epoch"] = int(s.epoch)
        # a loaded position not iterated yet draws its epoch from the state's generator state (``_replay``)
        rng = self._replay if self._replay is not None else self._rng_state
        if type(s) in RANDOM and batches_done and rng is not None:
            state["rng_state"] = rng
        return state

    def load_state_dict(self, state: dict) -> tuple[int, int]:
        """Check ``state`` against this sampler; returns (epoch, batches to skip) of the next iteration."""
        mine = self._config()
        epoch, done = _check_state(
            state,
            "sampler",
            mine,
            self.replayable,
            f"the loader's sampler {mine['sampler']} in {mine['batch_sampler']}",
        )
        self.seed = int(state["seed"])
        s = self.sampler
        if isinstance(s, DistributedSampler):
            s.set_epoch(int(state["sampler_epoch"]))
        self._replay = None
        if type(s) in RANDOM and done:
            rng = state.get("rng_state")
            if not isinstance(rng, torch.Tensor):
                raise ValueError(
                    "the state has no 'rng_state' for its RandomSampler; pass the dict state_dict() returned, unchanged"
                )
            self._replay = rng
        return epoch, done


class GenericPlan:
    """The generic path's resume state, shared by the loader and the index samplers it hands out (which
    must not hold the loader: a persistent iterator would then keep a temporary loader, and its worker
    processes, alive after the caller dropped both). ``pending``: (batches to skip, generator state) set
    by ``load_state_dict``, used by the next iteration; ``rng``: the generator state the current epoch's
    RandomSampler drew from; ``position``: (epoch, first batch) of the current iteration, for an Order."""

    __slots__ = ("pending", "rng", "position")

    def __init__(self):
        self.pending: tuple[int, torch.Tensor | None] | None = None
        self.rng: torch.Tensor | None = None
        self.position: tuple[int, int] = (0, 0)


class IndexReplay:
    """The generic path's index sampler as the loader hands it to torch's iterator or to the workers.

    Iterated normally it is the sampler itself, noting (for ``RandomSampler``) the generator's state at
    its first draw, which is when torch's sampler draws. Once after ``load_state_dict`` it is the saved
    epoch drawn again from that state, from the batch after the checkpoint."""

    def __init__(self, plan: GenericPlan, base: Any):
        self.plan, self.base = plan, base

    def __len__(self) -> int:
        return len(self.base)

    def __iter__(self):
        # A generator: nothing happens until the first index is drawn. torch's iterators (and the workers')
        # call iter() once more than they use, before and after drawing their base seed, as torch does.
        pending, self.plan.pending = self.plan.pending, None
        if pending is not None:
            yield from self._replayed(*pending)
            return
        s = _root(self.base)
        self.plan.rng = _rng_state(s) if type(s) in RANDOM else None
        yield from self.base

    def _replayed(self, done: int, rng: torch.Tensor | None):
        s = _root(self.base)
        draw = lambda: list(self.base)  # noqa: E731
        if type(s) in RANDOM:
            self.plan.rng = rng
            items = _replay(s, rng, draw)
        else:
            items = draw()
        yield from items[done:]


class OrderIndices:
    """The generic path's index sampler when fastload's ``Order`` picks the indices (``rank``/``world_size``,
    ``seed``, ``order``, or a fastload.Dataset off the fast path): this rank's batches of the iteration's
    epoch from its first batch, as lists of ints (single ints without automatic batching, where the
    order's batches hold one sample each), read from ``plan.position`` when the first index is drawn."""

    def __init__(self, order: Any, plan: GenericPlan, batched: bool):
        self.order, self.plan, self.batched = order, plan, batched

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self):
        epoch, start = self.plan.position
        self.order.set_epoch(epoch)
        for batch in self.order.batches(epoch, start):
            if self.batched:
                yield batch.tolist()
            else:
                yield from batch.tolist()


def _batch_occurrences(batches: list[np.ndarray]) -> list:
    """The occurrences (``_draws.py``) of a user sampler's epoch on this rank, one entry per batch: its uint64
    words where a sample of it was read before in the epoch, else the batch's length (all 0). fastload sees only
    this rank's sequence, so a read's occurrence is counted in it; ``batch_rng`` adds the rank. Kept for the
    repeats alone: a word per position held 8 bytes for every sample of the rank's epoch."""
    if not batches:
        return []
    occ = occurrences(np.concatenate(batches))
    out: list = []
    at = 0
    for b in batches:
        part = occ[at : at + len(b)]
        at += len(b)
        out.append(part.astype(np.uint64) if part.any() else len(b))
    return out


def generic_state(index_sampler: Any, num_samples: int | None, epoch: int, done: int, rng: torch.Tensor | None) -> dict:
    """The generic path's position (``state_dict``): rank-free, like the fast path's."""
    s = _root(index_sampler)
    replayable = (index_sampler is s or type(index_sampler) is BatchSampler) and type(s) in REPLAYABLE
    state = {
        "version": STATE_VERSION,
        "driver": "generic",
        "epoch": epoch,
        "batches_done": done,
        "replayable": replayable,
        **_sampler_config(index_sampler, num_samples),
    }
    if isinstance(s, DistributedSampler):
        state["sampler_epoch"] = int(s.epoch)
    if type(s) in RANDOM and done and rng is not None:
        state["rng_state"] = rng
    return state


def load_generic_state(index_sampler: Any, num_samples: int | None, state: dict) -> tuple[int, int, Any]:
    """Check ``state``; returns (epoch, batches to skip, pending replay for ``IndexReplay`` or None)."""
    mine = _sampler_config(index_sampler, num_samples)
    s = _root(index_sampler)
    replayable = (index_sampler is s or type(index_sampler) is BatchSampler) and type(s) in REPLAYABLE
    epoch, done = _check_state(state, "generic", mine, replayable, f"the loader's sampler {mine['sampler']}")
    if isinstance(s, DistributedSampler):
        s.set_epoch(int(state["sampler_epoch"]))
    if not done:
        return epoch, 0, None
    rng = state.get("rng_state")
    if type(s) in RANDOM and not isinstance(rng, torch.Tensor):
        raise ValueError(
            "the state has no 'rng_state' for its RandomSampler; pass the dict state_dict() returned, unchanged"
        )
    return epoch, done, (done, rng)


class Counted(_BaseDataLoaderIter):
    """The generic path's iterator, advancing ``progress`` (a ``fast.position.Progress``: the position
    ``state_dict`` saves) per batch handed to the loop; everything else is the wrapped iterator's (``inner``).
    ``begin`` runs before the first batch is asked of ``inner`` (the loader fixes the epoch then; ``inner``
    draws its first indices no earlier). A ``_BaseDataLoaderIter`` by type like torch's iterators (Lightning
    relies on it); its ``__init__`` does not run (the wrapped iterator did what torch's does)."""

    def __init__(self, inner: Any, progress: Any, begin: Any = None):
        self.inner, self.progress, self._begin = inner, progress, begin

    def __iter__(self):
        return self

    def __next__(self):
        try:
            if self._begin is not None:
                begin, self._begin = self._begin, None  # dropped: it holds the loader
                begin()
            try:
                batch = next(self.inner)
            except StopIteration:
                self.progress.end_epoch()
                raise
            self.progress.advance()
        except KeyboardInterrupt:  # fastload's worker processes stop now (a torch iterator keeps torch's behaviour)
            interrupted = getattr(self.inner, "interrupted", None)
            if interrupted is not None:
                interrupted()
            raise
        return batch

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
