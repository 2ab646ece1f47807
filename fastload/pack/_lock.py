"""One writer per destination folder: a pack holds an exclusive ``flock`` on ``DST/.fastload-pack.lock`` from
before it looks at ``DST`` until its manifest is written, so a second pack into the same folder is refused at
once, naming the first (its pid, written in the file), instead of mixing or deleting the first one's files.

The kernel releases the lock when its holder dies, however it dies (SIGKILL included): a lock file left by a
killed pack is taken over by the next one. A process forked while the lock is held (the pack's worker processes)
closes its copy of the descriptor at once: an ``flock`` lasts while any descriptor of it is open, and a killed
pack's workers live on as orphans, which would otherwise keep its folder locked with the dead pack's pid.

A finished pack removes the file while it still holds the lock; whoever opened the old file meanwhile finds, once
it has the lock, that the path is no longer that file, and starts again with the new one (the usual protocol for
removable lock files).
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .._errors import FastloadError


LOCK_NAME = ".fastload-pack.lock"

_held: set[str] = set()  # the lock paths this process holds
_held_lock = threading.Lock()
_fds: set[int] = set()  # their descriptors, closed in a forked child (the module docstring)


def _close_in_child() -> None:
    for fd in _fds:
        try:
            os.close(fd)
        except OSError:
            pass
    _fds.clear()
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)


@contextmanager
def writer_lock(dest: Path, label: str | None = None) -> Iterator[None]:
    """Hold ``dest``'s pack lock for the block (``dest`` is created if missing); ``label`` names the destination
    in the error (the URL of a staged pack). A lock held by this process (another pack on another thread) is
    refused as well: ``flock`` alone would not tell two file descriptions of one process apart on every system."""
    path = str(dest / LOCK_NAME)
    with _held_lock:
        busy = path in _held
        _held.add(path)
    if busy:
        raise FastloadError(
            f"another fastload pack (pid {os.getpid()}, this process) is writing {label or dest}: two "
            f"packs into one folder would mix their files; wait for it to finish, or pack into another "
            f"folder"
        )
    try:
        fd = _acquire(dest, path, label or str(dest))
        _fds.add(fd)
        try:
            yield
        finally:
            try:
                os.unlink(path)  # while still held: see the module docstring
            except FileNotFoundError:
                pass
            _fds.discard(fd)
            os.close(fd)
    finally:
        with _held_lock:
            _held.discard(path)


def _acquire(dest: Path, path: str, label: str) -> int:
    dest.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise FastloadError(
                f"another fastload pack ({holder}) is writing {label}: two packs into one folder "
                f"would mix their files; wait for it to finish, stop it, or pack into another "
                f"folder"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder we waited on removed that file: lock the new one
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
    return fd


def _holder(fd: int) -> str:
    """'pid N' (and the host, when another machine's) from the lock file, as its holder wrote it."""
    try:
        words = os.pread(fd, 256, 0).decode("utf-8", "replace").split()
    except OSError:
        words = []
    if not words or not words[0].isdigit():
        return "pid unknown: it has only just started"
    host = f" on {words[1]}" if len(words) > 1 and words[1] != socket.gethostname() else ""
    return f"pid {words[0]}{host}"


def remove_if_free(path: Path) -> None:
    """Remove a lock file that no pack holds (one a killed pack left); leave a held one alone."""
    if not path.exists():
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.path.samestat(os.fstat(fd), os.stat(path)):
            os.unlink(path)
    except (BlockingIOError, FileNotFoundError):
        pass
    finally:
        os.close(fd)
