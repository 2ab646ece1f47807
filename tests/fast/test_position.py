"""fast/position.py: the position has one writer, the chain's last stage."""

from __future__ import annotations

import threading

import pytest

import fastload
from fastload.fast.position import Count, Progress


def test_count_advances_its_progress_once_per_batch_handed_on():
    progress = Progress(3, 5)
    count = Count(iter(["a", "b"]), progress)
    assert [next(count), next(count)] == ["a", "b"] and (progress.epoch, progress.done) == (3, 7)
    assert count.state()["done"] == 7


def test_the_loaders_state_is_the_position_the_loop_received(records):
    dl = fastload.DataLoader(records, batch_size=100, shuffle=True, seed=1, num_workers=2)
    it = iter(dl)
    for _ in range(4):
        next(it)
    assert dl.state_dict()["batches_done"] == 4  # the producer ran ahead; the position did not
    assert dl._progress is it._inner.progress  # the loader's position is the one the last stage advances


class Once:
    """A source that fails the test when asked again after it ran out (a producer whose thread has ended: it
    waited forever)."""

    def __init__(self, items):
        self.items, self.out = list(items), False

    def __next__(self):
        assert not self.out, "asked again after StopIteration"
        if not self.items:
            self.out = True
            raise StopIteration
        return self.items.pop(0)


def test_count_admits_no_next_once_ended_or_stopped():
    count = Count(Once("ab"), Progress())
    assert list(count) == ["a", "b"]
    with pytest.raises(StopIteration):  # again: without asking the source
        next(count)
    count = Count(Once("ab"), Progress())
    next(count)
    count.stopped = "stopped by a newer iteration"
    with pytest.raises(RuntimeError, match="newer iteration"):
        next(count)


def test_each_next_holds_the_guard():
    """A next() waits while another thread holds the loader's lock (starting an iteration, state_dict)."""
    guard = threading.RLock()
    count = Count(iter("ab"), Progress(), guard)
    got = []
    with guard:
        t = threading.Thread(target=lambda: got.append(next(count)), daemon=True)
        t.start()
        t.join(0.3)
        assert got == [], "next() ran while another thread held the guard"
    t.join(10)
    assert got == ["a"]
