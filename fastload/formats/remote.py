"""Datasets in object storage: any fsspec URL (``s3://``, ``gs://``, ``az://``, ``https://``, ``file://``),
read through the local shard cache (``_cache.py``).

Only the manifest is read at open. A shard is downloaded whole into the cache the first time a batch
needs it (checked against the manifest's size and XXH3-64, renamed into place), then memory-mapped from
there and validated exactly like a local shard: the batcher cannot tell the difference. A loader hands
its batch sequence to ``ReadPlan``, which looks ahead, downloads the shards of the coming batches on
background threads in the order they will be needed, and unmaps (so the cache may evict) each shard
once no batch in the look-ahead uses it.
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import tempfile
import threading
import time
import warnings
from collections import Counter, OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from .._errors import FastloadError, FormatError, RemoteError
from .._install import pip_extra
from ._cache import CacheStats, ShardCache, dataset_key  # noqa: F401  (dataset_key: the packer's staging)
from ._manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest, ShardEntry
from .shards import FORMAT as SHARDS
from .shards import ShardSegment, file_digest, shard_segments, verify_shard

RETRIES = 5  # attempts after the first, for one request, with exponential backoff
LOOKAHEAD_BATCHES = 1024  # the most batches a read plan looks ahead
DEFAULT_LOOKAHEAD_BYTES = 8 << 30
DOWNLOAD_THREADS = 4


def is_url(path: Any) -> bool:
    return isinstance(path, str) and "://" in path


def default_cache_dir() -> Path:
    env = os.environ.get("FASTLOAD_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fastload" / "shards"


def url_to_fs(url: str, storage_options: dict | None) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for ``url``, with an install hint when a backend is missing."""
    try:
        import fsspec.core
    except ImportError:
        raise ImportError(
            f"remote datasets need fsspec: {pip_extra('remote')} (s3fs for s3://; gcsfs for gs://, adlfs for az://)"
        ) from None
    opts = dict(storage_options or {})
    protocol = url.split("://", 1)[0]
    one_layer = protocol in ("s3", "s3a") and "config_kwargs" not in opts
    if one_layer:
        # one retry layer, fastload's: it backs off and counts every retry in loader.stats()
        opts["config_kwargs"] = {"retries": {"total_max_attempts": 1}}
    try:
        fs, path = fsspec.core.url_to_fs(url, **opts)
        if one_layer:
            fs.retries = 1  # s3fs's own loop around each call (an instance of our options: fsspec caches by them)
        return fs, path
    except ImportError as e:
        raise ImportError(f"{url}: {e} (fastload reads object storage through fsspec's backends)") from None
    except ValueError as e:
        raise ValueError(f"{url}: {e}") from None


def permanent(e: BaseException) -> bool:
    """An error that retrying cannot fix: missing object or bucket, denied access, no credentials, bad input."""
    if isinstance(
        e,
        (
            FileNotFoundError,
            PermissionError,
            IsADirectoryError,
            NotADirectoryError,
            ValueError,
            TypeError,
            ImportError,
            FastloadError,
        ),
    ):
        return True
    return any("Credential" in c.__name__ or c.__name__ == "NoSuchBucket" for c in type(e).__mro__)


def retrying(fn: Callable[[], Any], stats: CacheStats, retries: int = RETRIES) -> Any:
    """``fn()``, retried with exponential backoff (and jitter) on transient errors; each retry counted."""
    delay = 0.05
    for attempt in itertools.count():
        try:
            return fn()
        except Exception as e:
            if permanent(e) or attempt >= retries:
                raise
            stats.add(retries=1)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(2 * delay, 5.0)


def describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class Remote:
    """One remote dataset: its filesystem, manifest, cache and download threads."""

    def __init__(
        self,
        url: str,
        *,
        cache_dir: str | os.PathLike | None = None,
        cache_limit: int | None = None,
        storage_options: dict | None = None,
        download_threads: int = DOWNLOAD_THREADS,
        retries: int = RETRIES,
    ):
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.cache_limit = cache_limit
        self.download_threads = max(1, int(download_threads))
        self.retries = retries
        self.stats = CacheStats()
        self._setup()
        self.manifest = self._read_manifest()
        if self.manifest.layout != SHARDS.name:  # a URL is a way to reach shards, not a format of its own
            raise FormatError(
                f"dataset '{self.url}': layout {self.manifest.layout!r}; remote datasets are read a "
                f"shard at a time and must be packed as {SHARDS.name} (--format {SHARDS.name})"
            )
        SHARDS.check(self.manifest, f"dataset '{self.url}'")
        biggest = max((e.bytes for e in self.manifest.shards), default=0)
        if cache_limit is not None and biggest > cache_limit:
            raise ValueError(
                f"cache_limit={cache_limit} bytes is smaller than the largest shard of {self.url} "
                f"({biggest} bytes): the cache must hold at least the shards of one batch"
            )
        self.starts = np.concatenate([[0], np.cumsum([e.num_samples for e in self.manifest.shards])]).astype(np.int64)

    def _setup(self) -> None:
        self._fs, self.root = url_to_fs(self.url, self.storage_options)
        self.cache = ShardCache(self.cache_dir, self.cache_limit, self.stats)
        self.dir = self.cache.dataset_dir(self.url)
        self._pid = os.getpid()
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._open: OrderedDict[int, RemoteShardSegment] = OrderedDict()
        self.plans = 0  # read plans iterating now (they decide what stays open)
        self.need: Counter = Counter()  # shard -> batches of all plans' look-aheads that need it

    @property
    def fs(self) -> Any:
        """The fsspec filesystem; a forked child (worker processes) makes its own: fsspec's async
        filesystems and thread pools do not survive a fork."""
        if self._pid != os.getpid():
            self._fs, _ = url_to_fs(self.url, self.storage_options)
            self.cache = ShardCache(self.cache_dir, self.cache_limit, self.stats)
            self._executor = None
            self._pid = os.getpid()
        return self._fs

    def __getstate__(self) -> dict:
        keep = (
            "url",
            "storage_options",
            "cache_dir",
            "cache_limit",
            "download_threads",
            "retries",
            "manifest",
            "starts",
        )
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.stats = CacheStats()
        self._setup()

    # -- reading -----------------------------------------------------------------------------------
    def _read_manifest(self) -> Manifest:
        where = f"{self.url}/{MANIFEST_NAME}"
        path = f"{self.root}/{MANIFEST_NAME}"

        def read() -> bytes:  # one ranged GET (Manifest.parse refuses anything longer than the limit)
            return self.fs.cat_file(path, start=0, end=MAX_MANIFEST_BYTES + 1)

        try:
            raw = retrying(read, self.stats, self.retries)
        except FileNotFoundError as e:
            if self._exists(f"{self.root}/pack_state.json"):
                raise FormatError(
                    f"dataset '{self.url}' is an unfinished pack (no manifest yet): run the same "
                    f"pack command again to finish it"
                ) from None
            raise RemoteError(
                f"cannot open {where}: {describe(e)} (is the bucket and path right? a dataset "
                f"is complete once its manifest is uploaded)"
            ) from None
        except Exception as e:
            raise RemoteError(f"cannot open {where}: {describe(e)}") from None
        return Manifest.parse(raw, f"dataset '{self.url}'")

    def _exists(self, path: str) -> bool:
        try:
            return bool(self.fs.exists(path))
        except Exception:
            return False

    def segments(self) -> list["RemoteShardSegment"]:
        m = self.manifest
        shard_segments(Path(self.dir), m)  # the manifest's size sanity checks, before anything is sized from it
        return [RemoteShardSegment(self, k, e, int(self.starts[k])) for k, e in enumerate(m.shards)]

    def local_path(self, entry: ShardEntry) -> Path:
        return self.dir / ShardCache.file_name(entry)

    def acquire(self, k: int, count: bool = True) -> int:
        """An fd holding a shared lock on shard ``k``'s cached file, downloading it when absent
        (``count``: a cache hit is counted in the stats)."""
        entry = self.manifest.shards[k]
        self.fs  # noqa: B018  (a forked child replaces what it inherited first)
        return self.cache.acquire(self.local_path(entry), entry, lambda tmp: self._download(entry, tmp), count)

    def _download(self, entry: ShardEntry, tmp: Path) -> None:
        url = f"{self.url}/{entry.file}"
        rpath = f"{self.root}/{entry.file}"
        for _attempt in (1, 2):
            t = time.perf_counter()
            try:
                retrying(lambda: self.fs.get_file(rpath, str(tmp)), self.stats, self.retries)
            except FileNotFoundError as e:
                raise FormatError(
                    f"dataset '{self.url}', shard '{entry.file}': missing in storage ({url}: "
                    f"{describe(e)}); the dataset is incomplete"
                ) from None
            except Exception as e:
                raise RemoteError(f"cannot download {url}: {describe(e)}") from None
            size, digest = file_digest(tmp)
            self.stats.add(downloads=1, bytes_downloaded=size, download_s=time.perf_counter() - t)
            if size == entry.bytes and digest == entry.xxh3_64:
                return
            self.stats.add(corrupt_downloads=1)
        raise FormatError(
            f"{url}: downloaded twice, and the copy is {size} bytes with XXH3-64 {digest} where the "
            f"manifest says {entry.bytes} bytes, {entry.xxh3_64}: the object in storage is corrupt or "
            f"was replaced (re-upload the dataset)"
        )

    def verify(self, progress: Callable[[int], None] | None = None) -> list[str]:
        """``fastload verify URL``: download every shard (one at a time, into a scratch folder beside the cache,
        removed after) and check it as a local shard is checked (size, XXH3-64, structure). One message per bad
        shard, as the local verify's; ``progress(samples)`` after each shard. What is in storage is checked, not
        a cached copy."""
        problems = []
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="verify-", dir=self.cache_dir) as scratch:
            for e, start in zip(self.manifest.shards, self.starts.tolist()):
                local = Path(scratch) / e.file
                rpath = f"{self.root}/{e.file}"
                try:
                    retrying(functools.partial(self.fs.get_file, rpath, str(local)), self.stats, self.retries)
                except FileNotFoundError:
                    problems.append(f"{e.file}: missing in storage ({self.url}/{e.file})")
                except Exception as err:
                    problems.append(f"{e.file}: cannot download {self.url}/{e.file}: {describe(err)}")
                else:
                    bad = verify_shard(local, e, self.manifest.schema, self.url, start)
                    if bad is not None:
                        problems.append(f"{e.file}: {bad}")
                    local.unlink(missing_ok=True)
                if progress is not None:
                    progress(e.num_samples)
        return problems

    def pin(self, k: int) -> Future:
        """Download shard ``k`` in the background; the future's result is its shared-lock fd."""
        self.fs  # noqa: B018
        if self._executor is None:
            with self._lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(self.download_threads, thread_name_prefix="fastload-download")
        return self._executor.submit(self.acquire, k)

    def opened(self, seg: "RemoteShardSegment") -> None:
        """Without a read plan (``ds[i]``), keep the mapped shards within half the cache limit, LRU first."""
        with self._lock:
            self._open[seg.k] = seg
            self._open.move_to_end(seg.k)
            if self.plans or self.cache_limit is None:
                return
            victims = []
            total = sum(s.entry.bytes for s in self._open.values())
            for _k, s in list(self._open.items())[:-1]:
                if total <= self.cache_limit // 2:
                    break
                victims.append(s)
                total -= s.entry.bytes
        for s in victims:
            s.close()

    def closed(self, seg: "RemoteShardSegment") -> None:
        with self._lock:
            self._open.pop(seg.k, None)

    def open_items(self) -> list[tuple[int, "RemoteShardSegment"]]:
        with self._lock:
            return list(self._open.items())

    def plan(self, batches: Iterator, lookahead_bytes: int | None = None) -> "ReadPlan":
        return ReadPlan(self, batches, lookahead_bytes)


class RemoteShardSegment(ShardSegment):
    """A shard read from the cache: ``open()`` downloads it if needed and holds a shared lock while mapped."""

    def __init__(self, remote: Remote, k: int, entry: ShardEntry, start: int):
        super().__init__(remote.local_path(entry), entry, remote.manifest.schema, remote.url, start)
        self.remote = remote
        self.k = k
        self._fd: int | None = None
        self._seg_lock = threading.Lock()

    def open(self) -> "RemoteShardSegment":
        if self._mm is not None:
            return self
        with self._seg_lock:
            if self._mm is not None:
                return self
            fd = self.remote.acquire(self.k, count=self.remote.need[self.k] <= 0)  # a plan's pin counted it
            try:
                super().open()
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
        self.remote.opened(self)
        return self

    def close(self) -> None:
        with self._seg_lock:
            super().close()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
        self.remote.closed(self)


def _samples(item: Any) -> np.ndarray:
    return np.asarray(getattr(item, "samples", item), dtype=np.int64)  # PackJob.samples, or the index batch


class ReadPlan:
    """Wraps a loader's batch iterator: downloads the coming batches' shards ahead, in the order they are
    needed, within ``lookahead_bytes``; unmaps shards no batch in the look-ahead needs.

    Iterated by the thread that fills batches: when it asks for the next batch, the previous one is
    filled, so closing a shard's mapping then can never pull it from under a fill.
    """

    def __init__(self, remote: Remote, batches: Iterator, lookahead_bytes: int | None = None):
        self.remote = remote
        self.it = iter(batches)
        if lookahead_bytes is None:
            limit = remote.cache_limit
            lookahead_bytes = DEFAULT_LOOKAHEAD_BYTES if limit is None else min(limit // 2, DEFAULT_LOOKAHEAD_BYTES)
        self.budget = lookahead_bytes
        self.ahead: deque = deque()
        self.mine: Counter = Counter()  # shard -> batches of this plan's look-ahead needing it
        self.pins: dict[int, Future] = {}
        self.pinned_bytes = 0
        self.current: np.ndarray | None = None
        self.exhausted = False
        self.closed = False
        with remote._lock:
            remote.plans += 1

    def __iter__(self) -> "ReadPlan":
        return self

    def __next__(self) -> Any:
        if self.closed:
            raise StopIteration
        if self.current is not None:  # the previous batch is filled
            self._count(self.current, -1)
            self.current = None
        self._top_up()
        if not self.ahead:
            self.close()
            raise StopIteration
        item, shards = self.ahead.popleft()
        self.current = shards
        self._release()
        t = time.perf_counter()
        waited = False
        try:
            for k in shards.tolist():
                fut = self.pins[k]
                waited |= not fut.done()
                fut.result()
        except BaseException:
            self.close()
            raise
        if waited:
            self.remote.stats.add(wait_s=time.perf_counter() - t)
        self._top_up()
        return item

    def _top_up(self) -> None:
        while not self.exhausted and len(self.ahead) < LOOKAHEAD_BATCHES:
            if self.ahead and self.pinned_bytes >= self.budget:
                return
            try:
                item = next(self.it)
            except StopIteration:
                self.exhausted = True
                return
            samples = _samples(item)
            shards = np.unique(np.searchsorted(self.remote.starts, samples, side="right") - 1)
            self.ahead.append((item, shards))
            self._count(shards, 1)
            for k in shards.tolist():
                if k not in self.pins:
                    self.pins[k] = self.remote.pin(k)
                    self.pinned_bytes += self.remote.manifest.shards[k].bytes

    def _release(self) -> None:
        """Unpin every shard no batch of this plan's look-ahead needs; unmap every open shard that no
        plan needs (so the cache may evict it)."""
        need = self.remote.need
        for k in [k for k, n in self.mine.items() if n <= 0]:
            del self.mine[k]
            self.pinned_bytes -= self.remote.manifest.shards[k].bytes
            _close_when_done(self.pins.pop(k))
        for k, seg in self.remote.open_items():
            if need[k] <= 0:
                seg.close()

    def _count(self, shards: np.ndarray, d: int) -> None:
        with self.remote._lock:
            for k in shards.tolist():
                self.mine[k] += d
                self.remote.need[k] += d

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with self.remote._lock:
            self.remote.plans -= 1
            for k, n in self.mine.items():
                self.remote.need[k] -= n
        self.mine.clear()
        for fut in self.pins.values():
            _close_when_done(fut)
        self.pins.clear()
        self.ahead.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _close_when_done(fut: Future) -> None:
    def done(f: Future) -> None:
        if not f.cancelled() and f.exception() is None:
            os.close(f.result())

    if not fut.cancel():
        fut.add_done_callback(done)


def warn_local_options(path: Any, **options: Any) -> None:
    given = [k for k, v in options.items() if v is not None]
    if given:
        warnings.warn(
            f"fastload.open('{path}'): {', '.join(given)} apply to remote datasets (URLs) only and are "
            f"ignored for a local path",
            RuntimeWarning,
            stacklevel=3,
        )
