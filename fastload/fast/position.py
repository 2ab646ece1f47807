"""The position: where one iteration stands (its epoch and the batches the loop has received).

It has one owner: the loader makes one ``Progress`` per iteration (or on ``load_state_dict``) and hands it
to the ``Count`` stage, the last one of the chain (after the device copy when there is one), which alone
advances it; the generic path's ``Counted`` does the same for torch's iterator. ``state_dict`` reads it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from .stage import Stage

_forks = 0  # forks this process is down from the one that imported fastload (an os.getpid() per batch costs more)
_making = threading.Lock()  # making a loader's guard (``loader_guard``)


def _forked() -> None:
    global _forks, _making
    _forks += 1
    _making = threading.Lock()  # a thread of the parent may have held it at the fork


def loader_guard(attrs: dict) -> threading.RLock:
    """The lock of one loader's iterations (``Count``), kept in ``attrs`` (the loader's ``__dict__``): the same for
    every thread, and a new one in a forked child, where a thread of the parent may have held the old one."""
    made = attrs.get("_guard_of")
    if made is None or made[0] != _forks:
        with _making:
            made = attrs.get("_guard_of")
            if made is None or made[0] != _forks:
                made = attrs["_guard_of"] = (_forks, threading.RLock())
    return made[1]


os.register_at_fork(after_in_child=_forked)


def in_own_process(stage: "Count") -> bool:
    """Whether ``stage``'s iteration was started in this process (not in a parent before a fork)."""
    return stage.forks == _forks


class Progress:
    """An iteration's epoch and how many of its batches the loop has received."""

    __slots__ = ("epoch", "done")

    def __init__(self, epoch: int = 0, done: int = 0):
        self.epoch, self.done = epoch, done

    def advance(self) -> None:
        self.done += 1

    def end_epoch(self) -> None:
        """The epoch ran out: the next one starts afresh."""
        self.epoch, self.done = self.epoch + 1, 0


class Count(Stage):
    """The chain's last stage: hands each batch on and advances the iteration's ``Progress`` (the only
    writer of the position).

    It is also where the iteration's ``next()`` is admitted (``chain.FastIterator`` says why): each one holds
    ``guard``, the loader's lock, and none reaches the chain once the iteration has ``ended`` (run out or
    closed: StopIteration again, as torch's iterators) or was ``stopped`` (the reason is raised), nor in a
    process forked from the one that started it (``forks``), whose producer thread is not there to wait for."""

    def __init__(self, source: Any, progress: Progress, guard: Any = None):
        self.source, self.progress = source, progress
        self.guard = guard if guard is not None else threading.RLock()
        self.pid, self.forks = os.getpid(), _forks
        self.ended = False
        self.stopped: str | None = None

    def __next__(self) -> Any:
        if self.forks != _forks:  # before the guard: a thread of the parent may have held it at the fork
            raise RuntimeError(
                f"fastload: this iterator of the DataLoader was started in process {self.pid}, and "
                f"this process ({os.getpid()}) was forked from it: its producer thread and the "
                f"batches it had ready stayed there. Call iter(loader) in this process for an "
                f"iteration of its own"
            )
        with self.guard:
            if self.stopped is not None:
                raise RuntimeError(self.stopped)
            if self.ended:
                raise StopIteration
            try:
                out = next(self.source)
            except StopIteration:
                self.ended = True
                raise
            self.progress.done += 1
            return out

    def state(self) -> dict:
        return {"epoch": self.progress.epoch, "done": self.progress.done, "source": super().state().get("source")}

    def reset(self, state: dict | None = None) -> None:
        """Start over from ``state`` (``state()``'s kind): the position it names, every stage upstream from its
        part (None: where the upstream starts, no batch received)."""
        self.progress.epoch = self.progress.epoch if state is None else state["epoch"]
        self.progress.done = 0 if state is None else state["done"]
        self.ended = False
        super().reset(state)
