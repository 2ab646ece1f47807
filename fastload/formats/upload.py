"""Packing to object storage: ``fastload pack SRC s3://bucket/ds``.

The pack runs into a local staging folder exactly as a local pack does (crash-safe, resumable); each
shard is uploaded as soon as it is complete, on background threads, and the manifest goes up last, so
a reader never sees a half-written remote dataset (no manifest: not a dataset). ``uploaded.json`` in
the staging folder records what is up; running the same command again resumes the pack and uploads
only what is missing. The staging folder is removed once the manifest is up.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from .._errors import FastloadError, RemoteError
from ._cache import CacheStats, dataset_key
from ._manifest import MANIFEST_NAME, SHARD_NAME
from .remote import default_cache_dir, describe, retrying, url_to_fs
from .shards import file_digest

RECORD = "uploaded.json"
UPLOAD_THREADS = 4


def default_staging(url: str) -> Path:
    return default_cache_dir().parent / "staging" / dataset_key(url.rstrip("/"))


class Uploader:
    """Uploads finished shard files of a staging folder to ``url``; the manifest only by ``finish``."""

    def __init__(self, url: str, staging: Path, storage_options: dict | None = None, threads: int = UPLOAD_THREADS):
        self.url = url.rstrip("/")
        self.staging = staging
        self.fs, self.root = url_to_fs(self.url, storage_options)
        self.stats = CacheStats()
        self._ex = ThreadPoolExecutor(threads, thread_name_prefix="fastload-upload")
        self._futures: dict[str, Future] = {}
        self._lock = threading.Lock()
        self.uploaded = 0
        path = staging / RECORD
        self.record: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}

    def check_destination(self, overwrite: bool) -> None:
        """Refuse a URL that holds a finished dataset (unless ``overwrite``: its manifest goes first)."""
        manifest = f"{self.root}/{MANIFEST_NAME}"
        try:
            exists = self.fs.exists(manifest)
        except Exception as e:
            raise RemoteError(f"cannot reach {self.url}: {describe(e)}") from None
        if not exists:
            return
        if not overwrite:
            raise FastloadError(f"{self.url} already holds a packed dataset; pass overwrite=True (--overwrite) to "
                                f"replace it")
        self.fs.rm_file(manifest)  # from now on readers see no dataset there
        for name in self.fs.ls(self.root, detail=False):
            if SHARD_NAME.fullmatch(name.rsplit("/", 1)[-1]):
                self.fs.rm_file(name)
        self.record = {}
        (self.staging / RECORD).unlink(missing_ok=True)

    def shard_done(self, path: Path) -> None:
        """Called by the packer when ``path`` is a complete shard: upload it in the background."""
        with self._lock:
            self._futures[path.name] = self._ex.submit(self._put, path)

    def _put(self, path: Path) -> None:
        size, digest = file_digest(path)
        if self.record.get(path.name) == f"{size}:{digest}":
            return  # a resumed pack: already up
        try:
            retrying(lambda: self.fs.put_file(str(path), f"{self.root}/{path.name}"), self.stats)
        except Exception as e:
            raise RemoteError(f"cannot upload {path} to {self.url}/{path.name}: {describe(e)}") from None
        with self._lock:
            self.uploaded += 1
            self.record[path.name] = f"{size}:{digest}"
            tmp = self.staging / (RECORD + ".tmp")
            tmp.write_text(json.dumps(self.record))
            os.replace(tmp, self.staging / RECORD)

    def finish(self, shard_names: list[str], folder: Path) -> None:
        """Wait for every upload, upload any shard of ``folder`` still missing, then the manifest, last."""
        for name in shard_names:
            if name not in self._futures:
                self.shard_done(folder / name)  # shards a previous, interrupted run had packed
        try:
            for fut in list(self._futures.values()):
                fut.result()
        finally:
            self._ex.shutdown(wait=True)
        manifest = folder / MANIFEST_NAME
        try:
            retrying(lambda: self.fs.put_file(str(manifest), f"{self.root}/{MANIFEST_NAME}"), self.stats)
        except Exception as e:
            raise RemoteError(f"cannot upload the manifest to {self.url}/{MANIFEST_NAME}: {describe(e)}") from None

    def abort(self) -> None:
        for fut in self._futures.values():
            fut.cancel()
        self._ex.shutdown(wait=True)


def pack_to_url(pack: Callable[..., Any], source: Any, url: str, *, staging: str | os.PathLike | None,
                storage_options: dict | None, overwrite: bool, part: Any = None, **kwargs: Any) -> Any:
    """``pack(source, staging, on_shard=upload)`` then the manifest: see the module docstring. A part
    (``part=(i, n)``) goes to ``URL/parts/i``, for ``fastload merge URL``."""
    from .reader import read_manifest
    from .._pack import PackSummary

    url = url.rstrip("/")
    stage = Path(staging) if staging is not None else default_staging(url)
    local = stage / "pack"  # what the packer writes; the upload record sits beside it
    target, shards_dir = url, local
    if part is not None:
        from .._parts import parse_part

        target = f"{url}/parts/{parse_part(part)[0]}"
        shards_dir = local / "parts" / str(parse_part(part)[0])
        stage = stage / f"part-{parse_part(part)[0]}"
    stage.mkdir(parents=True, exist_ok=True)
    up = Uploader(target, stage, storage_options)
    up.check_destination(overwrite)
    if overwrite and shards_dir.exists():
        shutil.rmtree(shards_dir)
    ok = False
    try:
        if (shards_dir / MANIFEST_NAME).exists() and not (shards_dir / "pack_state.json").exists():
            m = read_manifest(shards_dir)  # packed by an earlier run that stopped while uploading
            summary = PackSummary(target, "shards", m.num_samples, m.skipped, sum(e.bytes for e in m.shards),
                                  len(m.shards), 0.0, m.num_samples)
        else:
            summary = pack(source, local, on_shard=up.shard_done, overwrite=False, part=part, **kwargs)
        up.finish([e.file for e in read_manifest(shards_dir).shards], shards_dir)
        ok = True
    finally:
        if not ok:
            up.abort()
    shutil.rmtree(stage)
    if part is not None:
        shutil.rmtree(shards_dir, ignore_errors=True)
    summary.dest = target
    return summary
