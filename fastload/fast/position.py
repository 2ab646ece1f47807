"""The position: where one iteration stands (its epoch and the batches the loop has received).

It has one owner: the loader makes one ``Progress`` per iteration (or on ``load_state_dict``) and hands it
to the ``Count`` stage, the last one of the chain (after the device copy when there is one), which alone
advances it; the generic path's ``Counted`` does the same for torch's iterator. ``state_dict`` reads it.
"""

from __future__ import annotations

from typing import Any

from .stage import Stage


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
    writer of the position)."""

    def __init__(self, source: Any, progress: Progress):
        self.source, self.progress = source, progress

    def __next__(self) -> Any:
        out = next(self.source)
        self.progress.done += 1
        return out

    def state(self) -> dict:
        return {"epoch": self.progress.epoch, "done": self.progress.done, "source": super().state().get("source")}
