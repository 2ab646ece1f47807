"""Fixtures shared by the tests of fastload/fast/ (the stages of the fast path)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import fastload
from fastload._transforms.sequences import PackJob


def as_plain(batch) -> tuple:
    """A batch of any order (an index array, or a ``PackJob``) as plain, comparable values."""
    if isinstance(batch, PackJob):
        return tuple(tuple(np.asarray(getattr(batch, k)).tolist()) for k in ("samples", "starts", "lengths", "dst")) \
            + (batch.real,)
    return tuple(np.asarray(batch).tolist())


def all_batches(order, epoch: int) -> list:
    return [as_plain(x) for x in order.batches(epoch, 0)]


def _check_save_load(make, epoch: int, k: int) -> None:
    """After ``k`` batches of ``epoch``, a state loaded into a fresh order yields exactly the rest (the one
    resume logic every order shares: ``Order.batches`` and ``state_dict``/``load_state_dict``)."""
    a = make(seed=11)
    a.set_epoch(epoch)
    it = a.batches()
    for _ in range(k):
        next(it)
    state = json.loads(json.dumps(a.state_dict(k)))  # plain data
    rest = [as_plain(x) for x in it]
    b = make(seed=999)  # the saved seed wins (a loader that drew a seed draws another one after restart)
    assert b.load_state_dict(state) == k
    if k < len(a):
        assert b.begin_epoch() == epoch
        assert [as_plain(x) for x in b.batches()] == rest
        assert [as_plain(x) for x in b.batches()] == all_batches(a, epoch)  # resume used once
        assert [as_plain(x) for x in b.batches(epoch + 1)] == all_batches(a, epoch + 1)
    else:  # a finished epoch resumes at the next one
        assert b.begin_epoch() == epoch + 1
        assert [as_plain(x) for x in b.batches()] == all_batches(a, epoch + 1)
    c = make(seed=0)
    c.load_state_dict(state)
    assert [as_plain(x) for x in c.batches(epoch, start=k)] == rest  # explicit start


@pytest.fixture
def check_save_load():
    """``check(make, epoch, k)``: the save/load harness for any order (``make(seed=...)`` builds one)."""
    return _check_save_load


@pytest.fixture(scope="session")
def records(tmp_path_factory):
    """2,000 cheap records (int32[16] tokens, an int64 label): batches that cost little to fill."""
    root = tmp_path_factory.mktemp("records")
    rng = np.random.default_rng(0)
    fastload.pack({"tokens": rng.integers(0, 1000, (2000, 16), dtype=np.int32),
                   "label": np.arange(2000, dtype=np.int64)}, root / "ds")
    return fastload.open(root / "ds")
