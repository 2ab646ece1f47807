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
  epoch is the loader's (one per ``iter``, or ``set_epoch``) and rank the sampler's.
* ``state_dict()`` is a position: (epoch, batches done), the sampler's settings, and for
  ``RandomSampler`` the state of the generator it drew the epoch from. ``load_state_dict()`` replays
  the epoch's order and skips the batches already done, so the batches that follow are exactly those
  an uninterrupted run would have had. That holds for ``DistributedSampler``, ``RandomSampler`` and
  ``SequentialSampler`` (alone or in torch's ``BatchSampler``). Any other sampler still drives the
  fast path and its state saves; loading it at an epoch boundary starts the next epoch (the sampler
  draws it as it would), but a mid-epoch state for it is refused on load: its next batches are unknown.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DistributedSampler, RandomSampler, SequentialSampler

from ._order import _BATCH_STREAM, _key

STATE_VERSION = 1
REPLAYABLE = (SequentialSampler, RandomSampler, DistributedSampler)


def slot_batch_size(loader_batch_size: int | None, batch_sampler: Any) -> int | None:
    """How many samples a slot must hold: the loader's batch size, or a torch BatchSampler's. None when
    neither is known (a batch sampler of any other kind: batches of any length)."""
    if loader_batch_size is not None:
        return loader_batch_size
    if isinstance(batch_sampler, BatchSampler) and isinstance(batch_sampler.batch_size, int):
        return batch_sampler.batch_size
    return None


def _replayable(batch_sampler: Any) -> bool:
    return type(batch_sampler) is BatchSampler and type(batch_sampler.sampler) in REPLAYABLE


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

    @property
    def sampler(self) -> Any:
        return getattr(self.batch_sampler, "sampler", None)

    def __len__(self) -> int:
        return len(self.batch_sampler)

    # -- one epoch ---------------------------------------------------------------------------------
    def _generator(self) -> torch.Generator | None:
        """The generator the sampler draws its order from (None: torch's default generator)."""
        return getattr(self.sampler, "generator", None)

    def epoch_batches(self) -> list[np.ndarray]:
        """This epoch's index batches, drawn now (in the calling thread, like torch's iterator)."""
        s = self.sampler
        if type(s) is RandomSampler:
            gen = self._generator()
            if self._replay is not None:  # a resumed epoch: draw it again from the saved generator state
                saved, self._replay = self._replay, None
                if gen is None:
                    now = torch.get_rng_state()
                    torch.set_rng_state(saved)
                    try:
                        self._rng_state = saved
                        return self._draw()
                    finally:  # the caller's generator stays where the checkpoint left it
                        torch.set_rng_state(now)
                gen.set_state(saved)
            self._rng_state = (torch.get_rng_state() if gen is None else gen.get_state()).clone()
        return self._draw()

    def _draw(self) -> list[np.ndarray]:
        bs = self.batch_sampler
        if type(bs) is BatchSampler:
            idx = np.fromiter((operator.index(i) for i in bs.sampler), dtype=np.int64)
            b = bs.batch_size
            stop = len(idx) - len(idx) % b if bs.drop_last else len(idx)
            batches = [idx[i:i + b] for i in range(0, stop, b)]
        else:
            batches = [np.fromiter((operator.index(i) for i in batch), dtype=np.int64) for batch in bs]
            if batches:
                idx = np.concatenate(batches)
            else:
                idx = np.zeros(0, np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_samples):
            bad = int(idx[(idx < 0) | (idx >= self.num_samples)][0])
            raise IndexError(f"the sampler gave index {bad}, out of range for a dataset of {self.num_samples} "
                             f"samples; a sampler must yield indices 0 .. {self.num_samples - 1}")
        for batch in batches:
            if len(batch) > self.batch_size:
                raise ValueError(f"the batch_sampler gave a batch of {len(batch)} indices, but its batch_size is "
                                 f"{self.batch_size}: fastload's slots hold batch_size samples; give batches of at "
                                 f"most batch_size indices")
        return batches

    def batch_rng(self, epoch: int, batch_index: int) -> np.random.Generator:
        """Augmentation randomness of one batch, keyed by (seed, epoch, rank, batch) like ``Order.batch_rng``."""
        return np.random.default_rng(_key(_BATCH_STREAM, self.seed, epoch, self.rank, batch_index))

    # -- resume ------------------------------------------------------------------------------------
    def _config(self) -> dict:
        s = self.sampler
        cfg: dict = {"sampler": type(s).__name__ if s is not None else type(self.batch_sampler).__name__,
                     "batch_sampler": type(self.batch_sampler).__name__, "num_samples": self.num_samples,
                     "batch_size": self.batch_size, "num_batches": len(self),
                     "drop_last": bool(getattr(self.batch_sampler, "drop_last", False))}
        if isinstance(s, DistributedSampler):
            cfg.update(num_replicas=s.num_replicas, shuffle=bool(s.shuffle), sampler_seed=int(s.seed),
                       sampler_drop_last=bool(s.drop_last))
        return cfg

    def state_dict(self, epoch: int, batches_done: int) -> dict:
        """The position after ``batches_done`` batches of ``epoch`` (rank-free: load it on every rank)."""
        state = {"version": STATE_VERSION, "driver": "sampler", "epoch": epoch, "batches_done": batches_done,
                 "seed": self.seed, "replayable": self.replayable, **self._config()}
        s = self.sampler
        if isinstance(s, DistributedSampler):
            state["sampler_epoch"] = int(s.epoch)
        if type(s) is RandomSampler and batches_done and self._rng_state is not None:
            state["rng_state"] = self._rng_state
        return state

    def load_state_dict(self, state: dict) -> tuple[int, int]:
        """Check ``state`` against this sampler; returns (epoch, batches to skip) of the next iteration."""
        if not isinstance(state, dict) or state.get("driver") != "sampler" or state.get("version") != STATE_VERSION:
            what = state.get("driver", "fastload's own order") if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"not a state of a sampler-driven fastload.DataLoader (got {what!r}, version "
                             f"{state.get('version') if isinstance(state, dict) else None!r}); load the dict that "
                             f"state_dict() returned on a loader with the same kind of sampler")
        mine = self._config()
        diff = [f"{k}={state.get(k)!r} (this loader: {v!r})" for k, v in mine.items() if state.get(k) != v]
        if diff:
            raise ValueError("cannot resume from a state saved with a different sampler or batching: " + ", ".join(diff)
                             + "; build the loader and its sampler with the saved settings (rank may differ)")
        epoch, done = int(state["epoch"]), int(state["batches_done"])
        if done and not self.replayable:
            raise ValueError(f"cannot resume mid-epoch (batch {done} of {len(self)}): the loader's sampler "
                             f"{mine['sampler']} in {mine['batch_sampler']} cannot be replayed, so the batches after "
                             f"the checkpoint are unknown; resume from an end-of-epoch checkpoint, or use "
                             f"DistributedSampler, RandomSampler or SequentialSampler (alone or in torch's "
                             f"BatchSampler), or no sampler (fastload's own order)")
        self.seed = int(state["seed"])
        s = self.sampler
        if isinstance(s, DistributedSampler):
            s.set_epoch(int(state["sampler_epoch"]))
        self._replay = None
        if type(s) is RandomSampler and done:
            rng = state.get("rng_state")
            if not isinstance(rng, torch.Tensor):
                raise ValueError("the state has no 'rng_state' for its RandomSampler; pass the dict state_dict() "
                                 "returned, unchanged")
            self._replay = rng
        return epoch, done
