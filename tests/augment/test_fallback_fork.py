"""Per-sample transform workers (``_augment/fallback_workers.py``) are forked where torch forks its DataLoader
workers: in the thread that makes the iterator, before the loader's producer thread runs. They were forked at
the first batch that needed them, inside the producer thread, while the training thread (and the native decode
threads) ran: a child forked then may inherit a lock another thread held, and deadlock on it."""

from __future__ import annotations

import os
import threading
import warnings

import numpy as np
import pytest
import torch

import fastload
import fastload.transforms as T

pytestmark = pytest.mark.timeout(120)

CROP = [T.RandomResizedCrop(24), T.RandomHorizontalFlip()]

#: per fork while recording: (forked from the main thread, names of the other Python threads alive then)
FORKS: list[tuple[bool, list[str]]] = []
RECORDING = threading.Event()


def _before_fork() -> None:
    if RECORDING.is_set():
        me = threading.current_thread()
        FORKS.append((me is threading.main_thread(), sorted(t.name for t in threading.enumerate() if t is not me)))


os.register_at_fork(before=_before_fork)  # cannot be unregistered: it records only while RECORDING is set


@pytest.fixture
def forks():
    FORKS.clear()
    RECORDING.set()
    try:
        yield FORKS
    finally:
        RECORDING.clear()


def invert(img: torch.Tensor) -> torch.Tensor:
    return 255 - img


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_are_forked_in_the_callers_thread_before_the_producer_thread_runs(image_shards, forks, persistent):
    ds = fastload.open(image_shards, transforms={"image": [*CROP, invert]})
    plain = fastload.open(image_shards, transforms={"image": CROP})
    loader = fastload.DataLoader(ds, batch_size=8, shuffle=True, seed=0, num_workers=2,
                                 persistent_workers=persistent)
    reference = fastload.DataLoader(plain, batch_size=8, shuffle=True, seed=0, num_workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        for epoch in range(2):
            loader.set_epoch(epoch)
            reference.set_epoch(epoch)
            got = [b[0].clone() for b in loader]
            assert all(torch.equal(a, 255 - b[0]) for a, b in zip(got, reference, strict=True))
    ours = forks[:]  # the reference loader forks nothing (no per-sample transforms)
    assert len(ours) == (2 if persistent else 4)  # 2 workers: once, or at each epoch's start
    for main, others in ours:
        assert main and "fastload-batcher" not in others, (main, others)


def test_a_producer_thread_without_a_pool_runs_them_itself_and_says_so(forks):
    """Where no pool is left in a producer thread (an error closed it), none is forked there: the transforms run
    in that thread, with one warning, and the next ``start`` (the next iteration) makes a pool again."""
    from fastload._augment.fallback import UserTransform
    from fastload._augment.fallback_workers import FallbackRunner

    runner = FallbackRunner("image", [UserTransform(invert)], 4)
    rows = np.zeros((4, 2, 2, 3), np.uint8)
    seeds = np.arange(4, dtype=np.uint64)
    caught: list = []

    def produce() -> None:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _ in range(2):
                runner.run(rows, range(4), seeds, str, type("Pool", (), {"size": 2})())
        caught.extend(str(w.message) for w in seen)

    t = threading.Thread(target=produce, name="fastload-batcher")
    t.start()
    t.join()
    assert forks == [] and runner.pool is None and (rows == 0).all()  # inverted twice, in that thread
    degraded = [m for m in caught if "none is forked from this thread" in m]
    assert len(degraded) == 1 and "transforms['image']" in degraded[0], caught
    try:
        runner.start(2, (2, 2, 3))  # the next iteration's start, in the caller's thread
        assert len(forks) == 2 and runner.pool is not None and not runner.pool.closed
    finally:
        runner.close()
