"""fastload/fast/readahead.py: ``ReadAhead``, a remote dataset's read plan as a stage, keeps each batch's
generator with its batch and nests its upstream's state."""

from __future__ import annotations

import itertools

import numpy as np

from fastload.fast.order import Jobs, Order
from fastload.fast.readahead import ReadAhead


def test_read_ahead_keeps_each_generator_with_its_batch():
    order = Order(100, 10, kind="random", seed=3)
    seen = []

    def reading(batches):  # a read plan looks several batches ahead before handing out the first
        ahead = list(itertools.islice(batches, 3))
        seen.append(len(ahead))
        yield from ahead
        yield from batches

    stage = ReadAhead(Jobs(order, 0, 0, needs_rng=True), reading)
    got = list(stage)
    assert seen == [3] and len(got) == 10
    for b, (idx, rng) in enumerate(got):
        assert np.array_equal(idx, list(order.batches(0, 0))[b])
        assert rng.random() == order.batch_rng(0, b).random()
    assert stage.state() == {"source": {"epoch": 0, "batch": 10}}  # an upstream's state nests
    stage.reset({"source": {"batch": 8}})
    rest = list(stage)
    assert seen == [3, 2] and len(rest) == 2 and rest[0][1].random() == order.batch_rng(0, 8).random()
