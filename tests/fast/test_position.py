"""fast/position.py: the position has one writer, the chain's last stage."""

from __future__ import annotations

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
