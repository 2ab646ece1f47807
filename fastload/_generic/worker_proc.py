"""What runs in a generic-path worker process (``worker_loop``), and the messages it and the main side
(``_generic/workers.py``) speak over their pipe; the protocol is described there.

``HoldCtrlC`` is here because both sides need it: the main side holds Ctrl-C back around a worker's start,
and a worker forked inside that window puts the real handler back first. ``death_message`` and ``worker_start``
are here because both pools of worker processes use them: the generic path's (``workers.py``) and the per-sample
transforms' (``_augment/fallback_workers.py``), which imports nothing of the generic path's main side.
"""

from __future__ import annotations

import collections
import os
import pickle
import random
import signal
import threading
from multiprocessing import reduction

import numpy as np
import torch
from torch._utils import ExceptionWrapper
from torch.utils.data import _utils as _tutils
from torch.utils.data._utils import worker as _worker
from torch.utils.data.dataloader import _DatasetKind

from .shm import Arena

TASK, RESET, RESULT, ERROR, STOP, ACK = range(6)


class HoldCtrlC:
    """Holds Ctrl-C back for a few lines and delivers it after them, through the handler that was there.

    Around a worker's start: an interrupt between the fork and ``_workers.append`` would lose the child
    (no one left to reap it). Python runs signal handlers in the main thread only, and only callable
    handlers can be deferred; elsewhere this does nothing."""

    def __init__(self):
        self.previous = None
        self.caught = None

    def __enter__(self):
        current = signal.getsignal(signal.SIGINT)
        if threading.current_thread() is threading.main_thread() and callable(current):
            self.previous = current
            signal.signal(signal.SIGINT, self._hold)
        return self

    def _hold(self, signum, frame) -> None:
        self.caught = (signum, frame)

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            if self.caught is not None:
                self.previous(*self.caught)


def _ship(conn, idx: int, arena: Arena, batch) -> None:
    """Send ``batch`` as a RESULT, then the fd of each slot main has not mapped yet."""
    sid, payload, new, retired = arena.seal(batch)
    try:
        conn.send((RESULT, idx, sid, payload, [(s, c) for s, c, _ in new], retired))
        for _, _, fd in new:
            reduction.send_handle(conn, fd, os.getppid())
    finally:
        for _, _, fd in new:
            os.close(fd)


def _send_error(conn, idx: int, wid: int) -> None:
    err = ExceptionWrapper(where=f"in DataLoader worker process {wid}")
    try:
        conn.send((ERROR, idx, err))
    except (pickle.PicklingError, TypeError, AttributeError):  # an exception class main cannot load
        err.exc_type = RuntimeError
        conn.send((ERROR, idx, err))


def death_message(wid: int, pid: int, code: int | None) -> str:
    """torch's message for a dead worker, word for word, then which worker it was and what may have done it."""
    if code is None:
        return f"DataLoader worker (pid(s) {pid}) exited unexpectedly (fastload worker {wid} closed its connection)"
    if code >= 0:
        return (
            f"DataLoader worker (pid {pid}) exited unexpectedly with exit code {code}. Details are lost due to "
            f"multiprocessing. Rerunning with num_workers=0 may give better error trace. (fastload worker {wid})"
        )
    sig = -code
    name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
    msg = f"DataLoader worker (pid {pid}) is killed by signal: {signal.strsignal(sig) or name}. "
    if sig == signal.SIGBUS:
        msg += (
            "It is possible that dataloader's workers are out of shared memory. Please try to raise your shared "
            "memory limit. "
        )
    hint = {"SIGKILL": "; the out-of-memory killer sends SIGKILL: check `dmesg` and the Dataset's memory use"}
    return msg + f"(fastload worker {wid}, {name}{hint.get(name, '')})"


def worker_start(close_fds: list) -> None:
    """What every forked worker does first (the generic path's and the per-sample transforms'): close the main
    process's ends of the pipes (so that EOF means it is gone), give Ctrl-C back its handler when forked while the
    main process held it back, torch's worker signal handlers, one intra-op thread."""
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    held = getattr(signal.getsignal(signal.SIGINT), "__self__", None)
    if isinstance(held, HoldCtrlC) and held.previous is not None:
        signal.signal(signal.SIGINT, held.previous)
    _tutils.signal_handling._set_worker_signal_handlers()
    torch.set_num_threads(1)


def worker_loop(
    conn, kind, dataset, auto_collation, collate_fn, drop_last, base_seed, init_fn, wid, num_workers, close_fds
) -> None:
    """One worker process. ``collate_fn`` None means default_collate into the slots."""
    try:
        worker_start(close_fds)
        seed = base_seed + wid
        random.seed(seed)
        torch.manual_seed(seed)
        np.random.seed(_worker._generate_state(base_seed, wid))
        _worker._worker_info = _worker.WorkerInfo(id=wid, num_workers=num_workers, seed=seed, dataset=dataset)
        arena = Arena()
        collate = arena.collate if collate_fn is None else collate_fn
        init_error = None
        try:
            if init_fn is not None:
                init_fn(wid)
            fetcher = _DatasetKind.create_fetcher(kind, dataset, auto_collation, collate, drop_last)
        except Exception:
            init_error = ExceptionWrapper(where=f"in DataLoader worker process {wid}")
        inbox: collections.deque = collections.deque()
        ended = False
        parent = os.getppid()
        while True:
            while conn.poll(0 if inbox else _tutils.MP_STATUS_CHECK_INTERVAL):
                inbox.append(conn.recv())
            if not inbox:
                if os.getppid() != parent:  # orphaned
                    return
                continue
            if any(m is None for m in inbox):
                return
            if any(m[0] == RESET for m in inbox):  # tasks queued before a reset are moot
                while inbox[0][0] != RESET:
                    arena.release(*inbox.popleft()[2:])
            op, arg, frees, drops = inbox.popleft()
            arena.release(frees, drops)
            if op == RESET:
                if init_error is None:
                    fetcher = _DatasetKind.create_fetcher(kind, dataset, auto_collation, collate, drop_last)
                ended = False
                conn.send((ACK, wid))
                continue
            idx, index = arg
            if ended:
                continue
            if init_error is not None:  # worker_init_fn or the fetcher failed: every task reports it
                conn.send((ERROR, idx, init_error))
                continue
            try:
                arena.begin()  # may create a slot: out of descriptors, that is this task's error, sent to main
                _ship(conn, idx, arena, fetcher.fetch(index))
            except (BrokenPipeError, ConnectionResetError):
                return
            except Exception as e:
                arena.abort()
                if isinstance(e, StopIteration) and kind == _DatasetKind.Iterable:
                    conn.send((STOP, idx))
                    ended = True
                else:
                    _send_error(conn, idx, wid)
    except (KeyboardInterrupt, BrokenPipeError, ConnectionResetError, EOFError):
        pass  # Ctrl-C or the main process went away: it reports whatever needs reporting
