"""The local shard cache: remote shards downloaded whole, verified, shared by processes, evicted LRU.

Layout under ``cache_dir``::

    <dataset key>/url.txt                         the dataset's URL (for people; the key is its hash)
    <dataset key>/shard-00003.<xxh3>.fls          a complete, checksum-verified shard
    <dataset key>/shard-00003.<xxh3>.fls.lock     its use lock (lock files are kept: unlinking them races)
    <dataset key>/shard-00003.<xxh3>.fls.download its download lock
    <dataset key>/shard-00003.<xxh3>.fls.<pid>-<n>.part   a download in progress

The digest is part of the name, so a dataset re-packed under the same URL never reuses stale shards.

Protocol (``flock`` on the lock file; the kernel drops a dead process's locks, SIGKILL included):

* a user of a shard holds a *shared* use lock on it for as long as it reads it (while it is mapped,
  or pinned by a read plan), taken before it even looks for the file;
* a downloader also holds the *exclusive* download lock: it writes ``.part``, checks size and XXH3-64
  against the manifest, and renames; the others wait for that lock, then find the file. Only a verified file ever has
  the final name, so a process killed mid-download leaves a ``.part`` that nothing takes for complete (removed by the
  next eviction scan);
* the evictor removes least-recently-used complete files (mtime, touched on every use) while the
  cache is over its limit, taking each one's use lock exclusively without waiting: a shard anyone uses
  is never removed.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import re
import threading
import warnings
from pathlib import Path
from typing import Callable

import xxhash

from ._manifest import ShardEntry

_PART = ".part"
_LOCK = ".lock"  # shared while a shard is used; the evictor takes it exclusively, without waiting
_DOWNLOAD = ".download"  # exclusive while a shard is downloaded
_counter = itertools.count()
_KEY = re.compile(r"[0-9a-f]{16}")  # a dataset folder: dataset_key(url)
# file_name(), its downloads in progress, and a url.txt being written
_CACHED = re.compile(r"shard-[0-9]+\.[0-9a-f]{16}\.fls(\.[0-9]+-[0-9]+\.part)?|url\.txt\.[0-9]+-[0-9]+\.part")


class CacheStats:
    """Counters of one dataset's remote reads (``loader.stats()["remote"]``)."""

    FIELDS = (
        "hits",
        "downloads",
        "bytes_downloaded",
        "download_s",
        "retries",
        "corrupt_downloads",
        "evictions",
        "wait_s",
    )

    def __init__(self):
        self._lock = threading.Lock()
        for f in self.FIELDS:
            setattr(self, f, 0)

    def add(self, **kw) -> None:
        with self._lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)

    def as_dict(self) -> dict:
        with self._lock:
            return {f: getattr(self, f) for f in self.FIELDS}


def dataset_key(url: str) -> str:
    return xxhash.xxh3_64_hexdigest(url.encode())


class ShardCache:
    """One cache directory, shared by every dataset and process that names it; ``limit`` in bytes (None: none)."""

    def __init__(self, root: str | os.PathLike, limit: int | None, stats: CacheStats):
        self.root = Path(root).expanduser()
        self.limit = limit
        self.stats = stats
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self._reserved = 0  # bytes of this process's downloads in progress (their .part files are not counted)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OSError(e.errno, f"cannot create the shard cache directory: {e.strerror}", str(self.root)) from None

    def dataset_dir(self, url: str) -> Path:
        d = self.root / dataset_key(url)
        d.mkdir(exist_ok=True)
        note = d / "url.txt"
        if not note.exists():
            tmp = d / f"url.txt.{os.getpid()}-{next(_counter)}{_PART}"
            tmp.write_text(url + "\n")
            os.replace(tmp, note)
        return d

    @staticmethod
    def file_name(entry: ShardEntry) -> str:
        return f"{entry.file[: -len('.fls')]}.{entry.xxh3_64}.fls"

    # -- use -------------------------------------------------------------------------------------
    def acquire(self, path: Path, entry: ShardEntry, download: Callable[[Path], None], count: bool = True) -> int:
        """Return an fd holding a shared lock on the complete file ``path``, downloading it first when
        absent (``download(tmp)`` writes ``tmp`` and must leave it verified). Close the fd to release."""
        fd = os.open(str(path) + _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            # Shared from the start and throughout: the file cannot be evicted between its download and
            # its use. Downloaders exclude each other on a second lock, which nobody holds for long
            # (waiting for an exclusive *use* lock would wait for every reader to finish).
            fcntl.flock(fd, fcntl.LOCK_SH)
            if _touch(path):
                if count:
                    self.stats.add(hits=1)
                return fd
            dl = os.open(str(path) + _DOWNLOAD, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(dl, fcntl.LOCK_EX)  # one downloader; the others wait here, then find the file
                if not _touch(path):
                    self._download(path, entry, download)
            finally:
                os.close(dl)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _download(self, path: Path, entry: ShardEntry, download: Callable[[Path], None]) -> None:
        tmp = path.with_name(f"{path.name}.{os.getpid()}-{next(_counter)}{_PART}")
        try:
            self.make_room(entry.bytes)
            download(tmp)
            os.replace(tmp, path)
            # holding the download lock, any other partial file of this shard is a dead downloader's
            # (a killed process): nothing will finish it
            for stale in path.parent.glob(path.name + ".*" + _PART):
                stale.unlink(missing_ok=True)
        finally:
            with self._lock:
                self._reserved -= entry.bytes
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass

    # -- eviction ---------------------------------------------------------------------------------
    def usage(self) -> int:
        return sum(size for _, size, _ in self._files())

    def _files(self) -> list[tuple[Path, int, float]]:
        """(path, size, mtime) of every complete shard and every download in progress, oldest first. Only
        files the cache itself names (in a dataset folder with its url.txt) count: a cache_dir that also
        holds a user's own datasets or downloads never has those evicted."""
        out = []
        for d in _subdirs(self.root):
            if not _KEY.fullmatch(d.name) or not (d / "url.txt").is_file():
                continue
            try:
                names = os.listdir(d)
            except FileNotFoundError:
                continue
            for n in names:
                if _CACHED.fullmatch(n):
                    try:
                        st = os.stat(d / n)
                    except FileNotFoundError:
                        continue
                    out.append((d / n, st.st_size, st.st_mtime))
        out.sort(key=lambda t: t[2])
        return out

    def make_room(self, need: int) -> None:
        """Evict least-recently-used unused shards until ``need`` more bytes fit under the limit (and
        remove downloads whose process died). Warns once when the shards in use alone exceed it."""
        mine = f".{os.getpid()}-"
        with self._lock:
            self._reserved += need  # reserved before looking: concurrent downloads see each other
            reserved = self._reserved
        if self.limit is None:
            self._clean_parts()
            return
        files = self._files()
        total = reserved - need + sum(s for p, s, _ in files if mine not in p.name)
        for path, size, _ in files:
            if path.name.endswith(_PART):
                if mine not in path.name and _stale_part(path):
                    total -= size
                continue
            if total + need <= self.limit:
                break
            if _evict(path):
                total -= size
                self.stats.add(evictions=1)
        if total + need > self.limit:
            self.warn_once(
                "over",
                f"fastload: the shard cache {self.root} holds {total / 1e6:,.0f} MB of shards "
                f"in use and needs {need / 1e6:,.0f} MB more, past its cache_limit of "
                f"{self.limit / 1e6:,.0f} MB: it goes over the limit. Raise cache_limit, or "
                f"use order='quasi' (its working set is `window` shards per phase)",
            )

    def _clean_parts(self) -> None:
        for path, _, _ in self._files():
            if path.name.endswith(_PART):
                _stale_part(path)

    def warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=3)


def _subdirs(root: Path) -> list[Path]:
    try:
        return [root / n for n in os.listdir(root) if (root / n).is_dir()]
    except FileNotFoundError:
        return []


def _touch(path: Path) -> bool:
    """Mark ``path`` used now (LRU order); False when it does not exist."""
    try:
        os.utime(path)
        return True
    except FileNotFoundError:
        return False
    except PermissionError:  # a read-only cache someone else filled: usable, just not reordered
        return path.exists()


def _try_exclusive(lock_path: str) -> int | None:
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise


def _unlink_if_free(path: Path, lock: str) -> bool:
    """Remove ``path`` if nobody holds the lock file ``lock`` (taken exclusively while removing)."""
    fd = _try_exclusive(lock)
    if fd is None:
        return False
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)


def _evict(path: Path) -> bool:
    """Remove a cached shard unless it is in use (mapped, pinned or being downloaded)."""
    return _unlink_if_free(path, str(path) + _LOCK)


def _stale_part(path: Path) -> bool:
    """Remove a ``.part`` whose downloader is gone (nobody holds its shard's download lock)."""
    shard = path.name.split(".fls.", 1)[0] + ".fls"
    return _unlink_if_free(path, str(path.with_name(shard)) + _DOWNLOAD)
