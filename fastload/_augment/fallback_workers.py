"""A batch's per-sample transforms (``fallback.py``) in forked worker processes, over shared-memory rows.

The host slot's rows may be pinned memory, which a forked child must not touch (``_ring.py``), so the rows go
through a staging area of anonymous shared memory (``_shm.shared_buffer``, one per pool, sized for a whole
batch and mapped before the fork): the caller copies the rows to transform into it, each worker transforms
its contiguous share of them in place (``fallback.run_rows``, seeded per sample from ``Plan.seeds``: the result
never depends on how the batch was split), and the caller copies them back.

One duplex pipe per worker, no threads on either side:
  main -> worker  ``(first, stop, seeds, labels)``: transform staging rows ``first .. stop-1``; ``None`` stops.
  worker -> main  ``(OK, SampleTimes)`` or ``(ERROR, ExceptionWrapper)`` (the transform's exception, re-raised in
                  the caller with the worker's traceback, as torch's workers do).

Lifetime: the pool is made when a loader's iteration starts (``FallbackRunner.start``, from ``fast_iterator``),
in the thread that makes the iterator, before its producer thread runs -- where torch's DataLoader starts its
workers: forking while other Python threads run (the producer thread fills batches, the training thread
waits) can leave the child a lock another thread held at the fork (Python 3.12 warns "This process is
multi-threaded, use of fork() may lead to deadlocks in the child"). A pool is made later, at a batch, only in
the main thread (``may_fork_here``: the loader's ``num_workers='auto'`` measurement, at other thread counts);
a producer thread uses the pool ``start`` made, and where none is left (an error closed it) runs the rest of
the iteration's transforms itself, with a warning; the next iteration starts a pool again. It is closed with
its ``ImageDecoding``
(each epoch's end for a non-persistent loader, as torch's worker processes; the loader's collection
otherwise, through a finalizer). Closing asks each worker to stop, then terminates and joins as the generic
path's workers (``_generic/workers.py``) do; a worker that dies mid-batch, or since the last batch, is reported in
torch's words (``_worker_proc.death_message``) and the pool is closed. The wait for a batch's answers ends at the
loader's ``timeout=`` (``ImageDecoding.fallback_timeout``): the late workers are ended and named, as torch's
"DataLoader timed out"; without it a stuck transform hung the producer thread, which the loader joins.
Forked children inherit the transforms as they are (nothing is pickled: a lambda works); they run with one
torch thread and the generic path's signal handling. An exception whose class does not pickle comes back as
a RuntimeError with its traceback.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import warnings
import weakref
from multiprocessing import connection
from typing import Any, Sequence

import numpy as np
from torch._utils import ExceptionWrapper
from torch.utils.data import _utils as _tutils

from .._errors import FastPathWarning
from .._generic.shm import shared_buffer
from .._generic.worker_proc import HoldCtrlC, death_message, worker_start
from .fallback import SampleTimes, run_rows

OK, ERROR = range(2)

__all__ = ["FallbackPool", "FallbackRunner", "can_fork"]


def can_fork() -> bool:
    """Whether this process may start worker processes: not a daemonic one (a torch DataLoader worker calling
    ``ds.__getitems__``: multiprocessing forbids it children), and ``fork`` and memfd exist here."""
    return (
        not multiprocessing.current_process().daemon
        and hasattr(os, "memfd_create")
        and "fork" in multiprocessing.get_all_start_methods()
    )


def may_fork_here() -> bool:
    """Whether a pool may be made lazily in this thread: the main thread (where a loader's iterator is made, and
    where torch forks its workers whatever other threads run), or the process's only thread; never a loader's
    producer thread, which fills batches while the training thread and others run."""
    return threading.current_thread() is threading.main_thread() or threading.active_count() == 1


def _serve(conn: Any, transforms: Sequence[Any], staging: np.ndarray, wid: int, close_fds: list) -> None:
    """One worker: transform the staging rows it is told to, until told to stop or orphaned."""
    try:
        worker_start(close_fds)
        parent = os.getppid()
        while True:
            if not conn.poll(_tutils.MP_STATUS_CHECK_INTERVAL):
                if os.getppid() != parent:
                    return
                continue
            msg = conn.recv()
            if msg is None:
                return
            first, stop, seeds, labels = msg
            times = SampleTimes(len(transforms))
            try:
                run_rows(transforms, staging[first:stop], range(stop - first), seeds, labels.__getitem__, times)
            except Exception:
                wrapped = ExceptionWrapper(where=f"in fastload's per-sample transform worker {wid}")
                try:
                    conn.send((ERROR, wrapped))
                except Exception:  # its class does not pickle (defined in a function): its traceback, as torch's
                    wrapped.exc_type = RuntimeError  # RuntimeError, rather than the worker dying without it
                    conn.send((ERROR, wrapped))
                continue
            conn.send((OK, times))
    except (KeyboardInterrupt, BrokenPipeError, ConnectionResetError, EOFError):
        pass  # Ctrl-C or the main process went away


def _stop(workers: list, conns: list) -> None:
    """Ask every worker to stop, then terminate and join them (bounded: about a second a worker)."""
    for c in conns:
        try:
            c.send(None)
        except OSError:
            pass
    with HoldCtrlC():  # an interrupt inside a join can lose a worker's exit status (see _generic/workers.py)
        try:
            live = {p.sentinel for p in workers if p.is_alive()}
            if live:
                connection.wait(list(live), timeout=_tutils.MP_STATUS_CHECK_INTERVAL)
        finally:  # whatever cut the polite wait short, the workers are reaped
            for p in workers:
                if p.is_alive():
                    p.terminate()
            while workers:
                p = workers[0]
                p.join(timeout=1.0)
                if p.is_alive():
                    p.kill()
                    p.join()
                workers.pop(0)
            while conns:
                conns.pop().close()


class FallbackPool:
    """``n`` forked workers running ``transforms`` on up to ``rows`` staging rows of shape ``row_shape``."""

    def __init__(self, transforms: Sequence[Any], n: int, rows: int, row_shape: tuple[int, ...]) -> None:
        self.n = n
        with HoldCtrlC():  # an interrupt between the two would leak the descriptor (pools start in the caller's thread)
            fd, mm = shared_buffer(max(1, rows * int(np.prod(row_shape))))
            os.close(fd)  # the mapping stays; the children inherit it, not the descriptor
        self.staging = np.frombuffer(mm, np.uint8, rows * int(np.prod(row_shape))).reshape(rows, *row_shape)
        self.workers: list = []
        self.conns: list = []
        self._stopper = weakref.finalize(self, _stop, self.workers, self.conns)
        ctx = multiprocessing.get_context("fork")
        try:
            for wid in range(n):
                ours, theirs = ctx.Pipe(duplex=True)
                close = [c.fileno() for c in self.conns] + [ours.fileno()]
                p = ctx.Process(
                    target=_serve,
                    args=(theirs, tuple(transforms), self.staging, wid, close),
                    daemon=True,
                    name=f"fastload-transform-{wid}",
                )
                self.conns.append(ours)
                with HoldCtrlC():  # a started worker is always in self.workers, where _stop finds it
                    try:
                        p.start()
                    finally:
                        theirs.close()
                    self.workers.append(p)
        except BaseException:
            self.close()
            raise

    @property
    def closed(self) -> bool:
        return not self._stopper.alive

    def close(self) -> None:
        self._stopper()

    def run(
        self, rows: np.ndarray, ks: Sequence[int], seeds: np.ndarray, where: Any, times: SampleTimes, timeout: float = 0
    ) -> None:
        """Transform rows ``ks`` of ``rows`` (e.g. a pinned host slot's) through the staging area, in place.
        ``timeout``: the loader's (seconds; 0 waits as long as the workers live). On any error or interrupt the
        pool is closed (a later batch makes a new one) and the error raised."""
        ks = list(ks)
        m = len(ks)
        try:
            self.staging[:m] = rows[ks]
            bounds = np.linspace(0, m, min(self.n, m) + 1).round().astype(int)
            out, first = {}, {}
            for w, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
                if hi > lo:
                    labels = [where(k) for k in ks[lo:hi]]
                    try:
                        self.conns[w].send((int(lo), int(hi), seeds[ks[lo:hi]], labels))
                    except OSError:  # it died since the last batch (the OOM killer, say): which one, as mid-batch
                        self._died(w)
                    out[self.conns[w]] = w
                    first[w] = labels[0]
            errors = self._collect(out, times, timeout, first)
            if errors:
                errors[0].reraise()
            rows[ks] = self.staging[:m]
        except BaseException:
            self.close()
            raise

    def _collect(self, out: dict, times: SampleTimes, timeout: float = 0, first: dict | None = None) -> list:
        """Wait for every worker given a share; the errors they sent, in row order. A dead worker raises, and
        so does one still owing its share after ``timeout`` seconds (``first``: where its share starts)."""
        errors: list = []
        deadline = time.monotonic() + timeout if timeout > 0 else None
        while out:
            sentinels = {self.workers[w].sentinel: w for w in out.values()}
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = connection.wait(list(out) + list(sentinels), timeout=left)
            if not ready and deadline is not None and time.monotonic() >= deadline:
                self._late(sorted(out.values()), timeout, first or {})
            for r in ready:
                if r in out:
                    w = out.pop(r)
                    try:
                        kind, value = r.recv()
                    except (EOFError, OSError):  # it died before answering
                        self._died(w)
                    if kind == OK:
                        times.add(value)
                    else:
                        errors.append((w, value))
            for r in ready:
                w = sentinels.get(r)
                if w is not None and w in out.values() and not self.conns[w].poll():
                    self._died(w)
        return [e for _, e in sorted(errors, key=lambda x: x[0])]

    def _late(self, owed: list, timeout: float, first: dict) -> None:
        """Workers ``owed`` did not answer within the loader's ``timeout``: end them (the pool closes) and say so
        in torch's words, naming each and where its share starts."""
        late = "; ".join(
            f"per-sample image transform worker {w} (pid {self.workers[w].pid}) still had its share "
            f"from {first.get(w, '?')}"
            for w in owed
        )
        for w in owed:
            self.workers[w].terminate()
        raise RuntimeError(f"DataLoader timed out after {timeout} seconds: {late}")

    def _died(self, w: int) -> None:
        p = self.workers[w]
        p.join(timeout=1.0)
        raise RuntimeError(
            death_message(w, p.pid, p.exitcode) + " (a per-sample image transform worker: the "
            "transform ended the process)"
        ) from None  # not the pipe's error that showed it


class FallbackRunner:
    """One image field's per-sample transforms in a loader: in worker processes (as many as the loader's native
    threads, ``num_workers``) or, at ``num_workers=0`` (or where this process may not fork), in the calling
    thread. Says once, after its first batch, what they cost (a ``FastPathWarning``)."""

    def __init__(
        self, field: str, transforms: Sequence[Any], batch_size: int, stage: str = "after the native decode"
    ) -> None:
        self.field = field
        self.stage = stage  # where in the pipeline they run, for the warning
        self.transforms = tuple(transforms)
        self.batch_size = batch_size
        self.pool: FallbackPool | None = None
        self.warned = False
        self.degraded = False  # said that this iteration runs them in its own thread (``_degrade``)

    def start(self, n: int, row_shape: tuple[int, ...]) -> None:
        """Have a pool of ``n`` workers for rows of ``row_shape`` ready now, before any batch: called in the thread
        that makes the loader's iterator, before its producer thread starts (the module docstring). A pool that
        fits (a persistent loader's) is kept."""
        n = n if can_fork() else 0
        self.degraded = False
        if n <= 0:
            self.close()
            return
        if not self._fits(self.pool, row_shape, self.batch_size) or self.pool.n != n:
            self.close()
            self.pool = FallbackPool(self.transforms, n, self.batch_size, tuple(row_shape))

    @staticmethod
    def _fits(pool: FallbackPool | None, row_shape: tuple, rows: int) -> bool:
        return (
            pool is not None
            and not pool.closed
            and pool.staging.shape[1:] == tuple(row_shape)
            and len(pool.staging) >= rows
        )

    def run(
        self, rows: np.ndarray, ks: Sequence[int], seeds: np.ndarray, where: Any, native_pool: Any, timeout: float = 0
    ) -> None:
        """Transform rows ``ks`` of ``rows`` in place; ``native_pool``: the loader's decode threads (as many
        worker processes; None or 0 threads: in this thread); ``timeout``: the loader's, for the workers' answers.
        A pool is made here only where ``may_fork_here``; elsewhere the pool made by ``start`` is used (even if
        the thread count changed since), or none (``_degrade``)."""
        n = int(getattr(native_pool, "size", 0) or 0) if can_fork() else 0
        times = SampleTimes(len(self.transforms))
        if n > 0:
            fits = self._fits(self.pool, rows.shape[1:], len(ks))
            here = may_fork_here()
            if not (fits and self.pool.n == n) and (here or not fits):
                self.close()
                if here:
                    self.pool = FallbackPool(self.transforms, n, max(self.batch_size, len(rows)), tuple(rows.shape[1:]))
                else:
                    n = 0
                    self._degrade()
        if n > 0:
            n = self.pool.n
            self.pool.run(rows, ks, seeds, where, times, timeout)
        else:
            self.close()  # a pool made at another thread count (num_workers='auto' measured it) is not kept idle
            run_rows(self.transforms, rows, ks, seeds, where, times)
        if not self.warned and times.images:
            self.warned = True
            warnings.warn(self._cost(times, n), FastPathWarning, stacklevel=2)

    def _degrade(self) -> None:
        if not self.degraded:
            self.degraded = True
            warnings.warn(
                f"fastload: transforms['{self.field}']: no per-sample transform worker is running (an "
                f"error closed them, or the iteration did not start them) and none is forked from this "
                f"thread, which runs beside others (forking a multi-threaded process can deadlock the "
                f"child): this iteration runs the transforms in this thread from here on; the next one "
                f"starts workers again",
                FastPathWarning,
                stacklevel=3,
            )

    def _cost(self, times: SampleTimes, workers: int) -> str:
        each = "; ".join(
            f"{t.name}: {ms:.2f} ms per image" + (f" ({t.reason})" if t.reason else "")
            for t, ms in zip(self.transforms, times.per_image_ms())
        )
        place = (
            f"in {workers} worker process{'es' if workers != 1 else ''}"
            if workers
            else "in the calling thread (num_workers=0)"
        )
        return (
            f"fastload: transforms['{self.field}'] has {len(self.transforms)} transform(s) fastload does not run "
            f"natively; they run per sample in Python {self.stage}, {place}: {each} (measured over "
            f"the first batch, {times.images} images). Use fastload.transforms' equivalents to keep the whole "
            f"pipeline in the native decoder."
        )

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None  # its staging mapping goes with it
