"""Packing to object storage: ``fastload pack SRC s3://bucket/ds``.

The pack runs into a local staging folder exactly as a local pack does (crash-safe, resumable); each
shard is uploaded as soon as it is complete, on background threads, and the manifest goes up last, so
a reader never sees a half-written remote dataset (no manifest: not a dataset). ``uploaded.json`` in
the staging folder records what is up; running the same command again resumes the pack and uploads
only what is missing, and only when the staged pack is of the same source and options (the local
pack's own resume check, ``_sinks.prepare_dest``); otherwise it refuses, saying why.

The staging folder is fastload's own (``Staging``): one it created, or an empty one it was given, marked
with ``.fastload-staging``; a folder holding anything else is refused. Once the manifest is up, exactly
what fastload wrote there is removed, and the folder itself only when fastload created it. The URL is
checked (reachable, writable, no finished dataset unless overwriting) before anything is packed.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .._errors import FastloadError, RemoteError
from ..formats._manifest import MANIFEST_NAME, SHARD_NAME
from ..formats.reader import read_manifest
from ..formats.remote import CacheStats, dataset_key, default_cache_dir, describe, file_digest, retrying, url_to_fs
from ._local import pack_local
from ._parts import parse_part
from ._sinks import remove_pack

RECORD = "uploaded.json"
MARK = ".fastload-staging"
UPLOAD_THREADS = 4


def default_staging(url: str) -> Path:
    return default_cache_dir().parent / "staging" / dataset_key(url.rstrip("/"))


class Uploader:
    """Uploads finished shard files of a staging folder to ``url``; the manifest only by ``finish``."""

    def __init__(self, url: str, staging: Path, storage_options: dict | None = None, threads: int = UPLOAD_THREADS):
        self.url = url.rstrip("/")
        self.staging = staging  # where the upload record is kept (need not exist yet)
        self.fs, self.root = url_to_fs(self.url, storage_options)
        self.stats = CacheStats()
        self._ex = ThreadPoolExecutor(threads, thread_name_prefix="fastload-upload")
        self._futures: dict[str, Future] = {}
        self._lock = threading.Lock()
        self.uploaded = 0
        path = staging / RECORD
        self.record: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}

    def check_destination(self, overwrite: bool) -> None:
        """Before anything is packed: the URL must be reachable and writable (a missing bucket or read-only
        credentials fail now, not after the whole pack), and hold no finished dataset unless ``overwrite``
        (then its manifest goes first)."""
        manifest = f"{self.root}/{MANIFEST_NAME}"
        try:
            exists = self.fs.exists(manifest)
        except Exception as e:
            raise RemoteError(f"cannot reach {self.url}: {describe(e)}") from None
        probe = f"{self.root}/.fastload-write-check-{uuid.uuid4().hex}"  # ours alone: removed right away
        try:
            retrying(lambda: self.fs.pipe_file(probe, b""), self.stats)
        except Exception as e:
            raise RemoteError(
                f"cannot write to {self.url}: {describe(e)}. Checked before packing: does the bucket "
                f"exist, and may these credentials write to it?"
            ) from None
        try:
            self.fs.rm_file(probe)
        except Exception:  # an object store that allows writes but not deletes: a harmless empty object
            pass
        if not exists:
            return
        if not overwrite:
            raise FastloadError(
                f"{self.url} already holds a packed dataset; pass overwrite=True (--overwrite) to replace it"
            )
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
            self.staging.mkdir(parents=True, exist_ok=True)
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


class Staging:
    """The local folder a URL pack is staged in, and proof that it is fastload's own.

    A folder fastload creates, or an empty one it is given, gets the mark file (the URL it stages, and
    whether fastload created the folder). A marked folder staging the same URL is resumed; anything else
    (a folder holding other files, one staging another URL) is refused, so a mistyped ``--staging``
    never loses a user's files. ``done`` removes only what the pack wrote."""

    def __init__(self, root: Path, url: str):
        self.root, self.url = root, url
        self.created = not root.exists()
        mark = root / MARK
        if self.created:
            return
        if not root.is_dir():
            raise FastloadError(
                f"staging folder {root} exists and is not a folder; choose a new or empty folder (--staging / staging=)"
            )
        if mark.is_file():
            try:
                note = json.loads(mark.read_text())
                self.created, staged = bool(note["created"]), note["url"]
            except (ValueError, KeyError, TypeError):
                raise FastloadError(
                    f"staging folder {root}: its {MARK} file is unreadable; choose a new or empty "
                    f"folder (--staging / staging=)"
                ) from None
            if staged != url:
                raise FastloadError(
                    f"staging folder {root} holds a pack staged for {staged}, not {url}: run that "
                    f"pack again to finish it, or choose a new or empty folder (--staging / staging=)"
                )
            return
        names = sorted(os.listdir(root))
        if names:
            raise FastloadError(
                f"staging folder {root} holds files fastload did not write ({', '.join(names[:5])}); "
                f"a staging folder must be new or empty (fastload cleans it up after the upload): "
                f"choose another folder (--staging / staging=)"
            )

    def claim(self) -> None:
        """Create and mark the folder (after the URL was checked: a refused pack leaves nothing behind)."""
        mark = self.root / MARK
        if mark.is_file():
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            mark.write_text(json.dumps({"url": self.url, "created": self.created}))
        except OSError as e:
            raise FastloadError(
                f"cannot create the staging folder {self.root}: {e.strerror or e}; choose a folder "
                f"you can write (--staging / staging=)"
            ) from None

    def done(self, pack_dir: Path, record_dir: Path) -> None:
        """After the manifest is up: remove the staged pack and the upload record, then the folders they
        emptied, then the mark and the folder itself if fastload created it. Nothing else is touched."""
        remove_pack(pack_dir)
        (record_dir / RECORD).unlink(missing_ok=True)
        for d in (pack_dir.parent, record_dir):
            while d != self.root and self.root in d.parents and _rmdir_if_empty(d):
                d = d.parent
        if os.listdir(self.root) == [MARK]:
            (self.root / MARK).unlink()
            if self.created:
                _rmdir_if_empty(self.root)


def _rmdir_if_empty(d: Path) -> bool:
    try:
        d.rmdir()
        return True
    except OSError:  # not empty (another part's files, or something of the user's), or gone
        return not d.exists()


def pack_to_url(
    source: Any,
    url: str,
    *,
    staging: str | os.PathLike | None,
    storage_options: dict | None,
    overwrite: bool,
    part: Any = None,
    **kwargs: Any,
) -> Any:
    """``pack_local(source, staging, on_shard=upload)`` then the manifest: see the module docstring. A part
    (``part=(i, n)``) goes to ``URL/parts/i``, for ``fastload merge URL``."""
    t0 = time.perf_counter()
    url = url.rstrip("/")
    stage = Staging(Path(staging) if staging is not None else default_staging(url), url)
    local = stage.root / "pack"  # what the packer writes; the upload record sits beside it
    target, shards_dir, record_dir = url, local, stage.root
    if part is not None:
        i = parse_part(part)[0]
        target, shards_dir, record_dir = f"{url}/parts/{i}", local / "parts" / str(i), stage.root / f"part-{i}"
    up = Uploader(target, record_dir, storage_options)
    up.check_destination(overwrite)
    stage.claim()
    ok = False
    try:
        summary = pack_local(
            source, local, on_shard=up.shard_done, overwrite=overwrite, part=part, staged_for=target, **kwargs
        )
        up.finish([e.file for e in read_manifest(shards_dir).shards], shards_dir)
        ok = True
    finally:
        if not ok:
            up.abort()
    stage.done(shards_dir, record_dir)
    summary.dest = target
    summary.seconds = time.perf_counter() - t0
    return summary
