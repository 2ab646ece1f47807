"""Encoding source samples for the packer, in order, on threads or worker processes (``_local.py``).

A worker process that dies (killed from outside, the OOM killer, a crash in user code) makes the pack
raise instead of hang; Ctrl-C is the main process's to handle.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import re
import signal
import sys
from collections import deque
from typing import Any, Iterator

from ._encode import ImageOptions, encode_sample
from .._errors import FastloadError
from .._install import MissingDependency
from ..fields.image import reencodings
from ..sources import Source

_WORKER: dict[str, Any] = {}
PR_SET_PDEATHSIG = 1  # linux/prctl.h
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _init_worker(source: Source, opts: ImageOptions) -> None:
    _WORKER["source"] = source
    _WORKER["opts"] = opts


def _init_process_worker(source: Source, opts: ImageOptions, parent: int) -> None:
    # Ctrl-C is the main process's to handle: it stops the pack and ends the workers. SIGTERM is how it ends
    # them: a handler the pack process had (a framework's, a test runner's), inherited through fork, would let a
    # worker sleep through it, and the pack's shutdown then waits on that worker for ever
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with(parent)
    _init_worker(source, opts)


def _die_with(parent: int) -> None:
    """End this worker when the pack process dies: one killed with SIGKILL cannot end its workers, which would wait
    on their task queue for ever (Linux's parent-death signal; elsewhere the pack ends them as it stops)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the signal was set up
        os._exit(1)


def _encode_one(i: int) -> tuple[int, list | None, str | None, str | None]:
    """``(i, encoded, error, note)``: ``note`` says why an image of the sample was re-encoded with loss unasked."""
    src, opts = _WORKER["source"], _WORKER["opts"]
    try:
        with reencodings() as notes:
            encoded = encode_sample(src.schema, src.load(i), opts)
        return i, encoded, None, notes[0] if notes else None
    except (KeyboardInterrupt, SystemExit, MissingDependency):
        raise
    except Exception as e:  # any failure of user data or user code: reported with the sample's name
        # without object addresses ("<_io.BytesIO object at 0x7f...>"): the same pack writes the same manifest
        return i, None, _ADDRESS.sub("", f"{type(e).__name__}: {e}"), None


def _encode_range(lo: int, hi: int) -> list[tuple[int, list | None, str | None, str | None]]:
    return [_encode_one(i) for i in range(lo, hi)]


def _threaded(fn, indices: range, workers: int) -> Iterator:
    """``map(fn, indices)`` on a thread pool, in order, with a bounded number of pending results."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers, thread_name_prefix="fastload-pack") as ex:
        pending: deque = deque()
        for i in indices:
            pending.append(ex.submit(fn, i))
            if len(pending) >= 4 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _encoded(
    source: Source, opts: ImageOptions, start: int, workers: int, stop: int | None = None
) -> Iterator[tuple[int, list | None, str | None, str | None]]:
    indices = range(start, len(source) if stop is None else stop)
    cheap = opts.mode == "passthrough" and opts.check == "header" and source.files_only
    if workers <= 1 or not source.parallel or cheap:  # cheap: any pool costs more than it saves
        _init_worker(source, opts)
        yield from map(_encode_one, indices)
        return
    if opts.mode == "passthrough" and source.files_only:
        # Reading files and validating JPEGs in native code releases the GIL: threads scale without
        # the pickling that worker processes pay for every sample.
        _init_worker(source, opts)
        yield from _threaded(_encode_one, indices, workers)
        return
    yield from _in_processes(source, opts, indices, workers)


def _in_processes(source: Source, opts: ImageOptions, indices: range, workers: int, chunk: int = 8) -> Iterator:
    """Encode on worker processes, in order, a bounded number of chunks in flight. A worker that dies
    (killed from outside, the OOM killer, a crash in user code) raises instead of hanging the pack."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    methods = mp.get_all_start_methods()
    ctx = mp.get_context("fork" if "fork" in methods else "spawn")
    ex = ProcessPoolExecutor(
        workers, mp_context=ctx, initializer=_init_process_worker, initargs=(source, opts, os.getpid())
    )
    procs: dict = {}  # pid -> Process, to name a dead worker
    pending: deque = deque()
    ok = broken = False
    try:
        for lo in range(indices.start, indices.stop, chunk):
            pending.append(ex.submit(_encode_range, lo, min(lo + chunk, indices.stop)))
            procs.update(getattr(ex, "_processes", None) or {})
            if len(pending) >= 4 * workers:
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()
        ok = True
    except BrokenProcessPool:
        broken = True
    finally:
        for f in pending:
            f.cancel()
        if not ok:  # stop at once: a worker may be stuck in user code
            procs.update(getattr(ex, "_processes", None) or {})
            for proc in list(procs.values()):
                if proc.is_alive():
                    proc.terminate()
            for proc in list(procs.values()):  # one ended while holding the task queue's lock blocks the others
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.kill()
                    proc.join(timeout=10)
        ex.shutdown(wait=True, cancel_futures=True)  # every worker joined: their exit codes are known
    if broken:
        raise FastloadError(
            f"a pack worker process died unexpectedly ({_deaths(procs)}); the shards finished "
            f"so far are kept: run the same pack again to resume"
        )


def _deaths(procs: dict) -> str:
    dead = []
    for pid, proc in procs.items():
        code = proc.exitcode
        if code is not None and code != -signal.SIGTERM:  # SIGTERM: ended by the pool after the death
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            dead.append(f"pid {pid}, {how}")
    return "; ".join(dead) or "killed or crashed"
