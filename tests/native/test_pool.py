"""csrc/pool.cc: the native thread pool starts and joins its threads, is shared safely by Python threads,
and still works (in the calling thread) in a forked child."""

import gc
import os
import threading
import time

import numpy as np
import pytest

from native_common import _C, batch_args, mixed_samples, run_batch

def native_thread_count():
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_pool_threads_are_joined_on_delete():
    gc.collect()
    before = native_thread_count()
    pool = _C.Pool(3)
    assert pool.size == 3 and "3" in repr(pool)
    assert native_thread_count() == before + 3
    args = batch_args(mixed_samples())
    assert run_batch(pool, args) == []
    del pool
    gc.collect()
    assert native_thread_count() == before
    assert _C.Pool(0).size == 0 and native_thread_count() == before
    with pytest.raises(ValueError):
        _C.Pool(-1)


def test_pool_shared_by_python_threads():
    pool = _C.Pool(2)
    samples = mixed_samples()
    ref = batch_args(samples)
    run_batch(pool, ref)
    errors = []

    def worker():
        for _ in range(5):
            a = batch_args(samples)
            if run_batch(pool, a) or not np.array_equal(a["out"], ref["out"]):
                errors.append("mismatch")

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def _reap(pid: int) -> None:
    """Wait up to 20 s for a forked child; it must exit 0 (a hang or an abort fails the test)."""
    deadline = time.time() + 20
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0, f"the child ended with {os.waitstatus_to_exitcode(status)}"
            return
        time.sleep(0.02)
    os.kill(pid, 9)
    pytest.fail("forked child hung using the pool")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_pool_usable_after_fork():
    pool = _C.Pool(2)
    args = batch_args(mixed_samples())
    run_batch(pool, args)
    ref = args["out"].copy()
    pid = os.fork()
    if pid == 0:  # child: the pool's threads are gone; work runs in the calling thread
        code = 1
        try:
            args["out"][:] = 0
            if run_batch(pool, args) == [] and np.array_equal(args["out"], ref):
                code = 0
            del pool
            gc.collect()
        finally:
            os._exit(code)
    _reap(pid)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_inherited_pool_deleted_in_a_child_that_has_its_own_pool():
    """A torch worker inherits its parent's pool, makes its own, and garbage-collects both. The inherited
    threads do not exist in the child, and their stacks are reused for the child's new threads: touching the
    stale handles (detach) used to detach the *new* pool's threads, whose join then failed and aborted."""
    pool = _C.Pool(2)
    args = batch_args(mixed_samples())
    run_batch(pool, args)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            own = _C.Pool(2)
            if run_batch(own, args) == []:
                del pool
                gc.collect()
                run_batch(own, args)
                del own
                gc.collect()
                code = 0
        finally:
            os._exit(code)
    _reap(pid)
