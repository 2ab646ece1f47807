"""The loader's epochs and resume: ``set_epoch``, the epoch each iteration runs, ``state_dict`` and
``load_state_dict`` (``EpochsAndResume``, a base of ``DataLoader``, whose state it reads and sets; split from
``loader.py``, which makes that state).

The epoch is an input, as ``DistributedSampler``'s (``_begin_epoch`` says whose). The state is the position
fastload's order (or the user's sampler, ``sampling.py``) saves; mid-epoch on the fast path, with the running
chain's nested state under ``stages`` (``fast/stage.py``): the order's position is its first stage's, and a loader
that loads it hands it to its next chain, which resets each stage from its part.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

from ..fast.chain import RELOADED
from ..fast.order import as_int
from ..fast.position import Progress
from ..fast.stage import innermost
from .sampling import EpochInput, _root, generic_state, load_generic_state


class EpochsAndResume:
    """``DataLoader``'s epochs and resume (the module docstring). What it uses of the loader, made there:"""

    _guard: Any
    _batcher: Any
    _order: Any
    _sampled: Any
    _plan: Any
    _progress: Progress
    _live: Any
    _chain_state: dict | None
    _copied_stages: dict | None
    _next_epoch: int
    _resume_at: int
    _user_sampler: bool
    _sampler_epoch_seen: int
    _epoch_set: bool  # set_epoch was called after the latest iteration started (``_state_dict``)
    _seed_given: int | None  # the seed= the caller gave (a state's seed replacing it is said)
    _seed_loaded: bool  # the order's seed is a loaded state's (kept when the order is made for another rank)
    _loaded: Any  # a state loaded whose position no iteration has started from yet (``loader.retarget`` loads it again)
    seed: int | None
    _running_here: Callable[[str], Any]
    _torch_index_sampler: Callable[[], Any]
    _num_samples: Callable[[], int | None]
    __len__: Callable[[], int]

    def set_epoch(self, epoch: int) -> None:
        """Like ``DistributedSampler.set_epoch``: the next iteration runs this epoch's order (from the position a
        loaded state holds, when it is that state's epoch). Under the loader's lock: an iteration starting in
        another thread reads all of it or none (``_begin_epoch``)."""
        with self._guard:
            self._adopt_epoch(as_int("epoch", epoch, 0))
            self._epoch_set = True  # until the next iteration starts, state_dict() is where that one will start
            driver = self._driver()
            if self._user_sampler and hasattr(driver, "set_epoch"):
                driver.set_epoch(epoch)
                self._sampler_epoch_seen = getattr(driver, "epoch", 0)

    def _driver(self):
        """The sampler that picks the indices (under a batch sampler, its sampler)."""
        return _root(self._torch_index_sampler())

    def _adopt_epoch(self, epoch: int) -> None:
        if epoch != self._next_epoch:  # another epoch: a loaded mid-epoch position no longer applies
            self._next_epoch, self._resume_at, self._chain_state, self._loaded = epoch, 0, None, None
            self._plan.pending = None
            if self._sampled is not None:
                self._sampled.drop_resume()

    def _begin_epoch(self) -> tuple[int, int]:
        """(epoch, first batch) of the iteration starting now; the next one defaults to the epoch after.

        The epoch is an input, as for DistributedSampler: the one set last -- by ``set_epoch`` on the loader,
        on the sampler the loader made (Lightning's call at each epoch's start, ``EpochInput``), or on a user's
        sampler that has an epoch (a change to DistributedSampler's since the last iteration) -- else the
        last iteration's plus one. So a run resumed by Lightning from an end-of-epoch checkpoint, where no
        loader state is loaded, runs the same epochs as the uninterrupted run; a mid-epoch one loads its state."""
        driver = self._driver()
        if isinstance(driver, EpochInput) and driver.pending_epoch is not None:
            self._adopt_epoch(driver.pending_epoch)
            driver.pending_epoch = None
        elif (
            self._user_sampler
            and isinstance(getattr(driver, "epoch", None), int)
            and driver.epoch != self._sampler_epoch_seen
        ):
            self._sampler_epoch_seen = driver.epoch
            self._adopt_epoch(driver.epoch)
        epoch, start = self._next_epoch, self._resume_at
        self._next_epoch, self._resume_at, self._loaded = epoch + 1, 0, None
        self._epoch_set = False
        return epoch, start

    def state_dict(self) -> dict:
        """Where the loader is: restoring it yields exactly the batches that would have come next.

        With a sampler driving the order (and on the generic path) the state is a position in the
        sampler's order (see ``_front/sampling.py``); Lightning and accelerate's ``save_state`` call this. From another
        thread during an iteration: the position between two batches (a ``next()`` in flight finishes first)."""
        with self._guard:
            return self._state_dict()

    def _state_dict(self) -> dict:
        epoch, done = self._progress.epoch, self._progress.done
        if self._epoch_set:  # set_epoch since the last iteration started: the next one's start, not the last's end
            epoch, done = self._next_epoch, self._resume_at
        if self._order is None and self._sampled is None:
            # a loaded position not iterated yet: its generator state is the pending replay's
            pending = self._plan.pending
            rng = pending[1] if pending is not None else self._plan.rng
            if done and done >= (_len_or_none(self) or done + 1):  # its last batch received: the next epoch's start
                epoch, done, rng = epoch + 1, 0, None
            return generic_state(self._torch_index_sampler(), self._num_samples(), epoch, done, rng)
        # mid-epoch on the fast path: the chain's state, each stage's part nested in its downstream's (fast/stage.py);
        # the position the order saves is its first stage's, the next batch it would hand out
        live = self._live() if self._live is not None and not self._epoch_set else None
        chain = live.state() if live is not None and live.running else None
        at = innermost(chain)
        if at is not None:
            epoch, done = at["epoch"], at["batch"]
        elif innermost(self._copied_stages) == {"epoch": epoch, "batch": done}:
            chain = self._copied_stages  # a copy of a loader mid-iteration, at the original's position
        if done >= (len(self) if self._sampled is not None else self._order.num_batches(epoch)):
            epoch, done, chain = epoch + 1, 0, None
        if self._sampled is not None:
            state = self._sampled.state_dict(epoch, done)
        else:
            state = self._order.state_dict(done, epoch)
        return state if chain is None else state | {"stages": chain}

    def load_state_dict(self, state: dict | list) -> None:
        """Go on from ``state`` (what ``state_dict()`` returned). With fastload's own order, a state saved with
        another number of processes or another batch size resumes too (elastic, ``fast/elastic.py``): the rest of
        the saved epoch is split over this loader's ranks, every sample read once. ``state`` may be one rank's
        state (all ranks had received the same number of batches, as under DDP) or the list of all ranks'."""
        with self._guard:
            if self._batcher is not None:
                # the order and position the running iteration reads: from another thread refused; in this one
                # the iteration stops first (its producer thread reads the seed), its next() saying why
                running = self._running_here("load_state_dict()")
                if running is not None:
                    running.supersede(RELOADED)
            self._load_state_dict(state)

    def _load_state_dict(self, state: dict | list) -> None:
        if self._order is None:
            if isinstance(state, (list, tuple)):
                raise ValueError(
                    "load_state_dict got a list of states: that is for fastload's own order (an elastic resume "
                    "from every rank's state); this loader's order is its sampler's, which resumes from one state: "
                    "pass the dict state_dict() returned on this rank"
                )
            if self._sampled is None:
                self._next_epoch, self._resume_at, self._plan.pending = load_generic_state(
                    self._torch_index_sampler(), self._num_samples(), state
                )
            else:
                self._next_epoch, self._resume_at = self._sampled.load_state_dict(state)
                self._adopt_seed(self._sampled.seed)
        else:
            if any(isinstance(s, dict) and s.get("driver") == "sampler" for s in _as_list(state)):
                raise ValueError(
                    "this state was saved by a loader whose sampler drove the order; this loader uses "
                    "fastload's own order (no sampler=): build it with the same kind of sampler"
                )
            self._resume_at = self._order.load_state_dict(state)
            self._next_epoch = self._order.epoch
            self._adopt_seed(self._order.seed)
            # until an iteration starts from it: an order made for another process (accelerate's prepare of a loader
            # built before the process group, ``loader.retarget``) goes on from it too
            self._loaded, self._seed_loaded = state, True
        self._progress = Progress(self._next_epoch, self._resume_at)
        self._epoch_set = False
        # the chain's state, when this loader goes on where it was saved: the next iteration's chain resets each of
        # its stages from its part (an elastic resume starts a new split: its chain starts afresh)
        chain = state.get("stages") if isinstance(state, dict) and self._batcher is not None else None
        at = {"epoch": self._next_epoch, "batch": self._resume_at}
        self._chain_state = chain if isinstance(chain, dict) and innermost(chain) == at else None
        driver = self._driver()
        if isinstance(driver, EpochInput):
            driver.pending_epoch = None  # the state says which epoch comes next
        self._sampler_epoch_seen = getattr(driver, "epoch", 0)

    def _adopt_seed(self, seed: int) -> None:
        """The order goes on with the state's seed (the epoch's permutation and every sample's draws depend on it):
        ``loader.seed`` says so, and a ``seed=`` given to this loader that it replaces is not dropped silently."""
        if self._seed_given is not None and seed != self._seed_given:
            warnings.warn(
                f"fastload: load_state_dict resumes with the state's seed={seed}, not this loader's seed="
                f"{self._seed_given}: a position counts batches of the order that seed made, so the rest of the run "
                f"keeps it. To start over with seed={self._seed_given}, leave load_state_dict out",
                UserWarning,
                stacklevel=4,
            )
        self.seed = seed


def _len_or_none(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:  # an IterableDataset with no length
        return None


def _as_list(state: Any) -> list:
    return list(state) if isinstance(state, (list, tuple)) else [state]
