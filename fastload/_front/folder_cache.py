"""``fastload.open`` on an unpacked ImageFolder: packed once into a cache keyed by the folder's content.

``fastload.open("train/")`` where ``train/`` is a torchvision ImageFolder tree (no fastload dataset) packs it
with ``fastload.pack``'s defaults into the cache and opens the pack; the next open of the same, unchanged
folder opens the pack at once. Layout under ``<cache>/folders/`` (``<cache>``: ``cache_dir=``, else
``$FASTLOAD_CACHE_DIR``, else ``~/.cache/fastload``)::

    <name>-<key>/          the packed dataset (fastload.pack's files only: its resume state until complete)
    <name>-<key>.json      {"source": the folder's absolute path, "files": n} (for people, and for cleanup);
                           "variant" too for a sample list other than the folder's own (``cached_pack``)
    <name>-<key>.lock      the entry's lock (kept: unlinking lock files races)

``key`` is an XXH3-128 of the folder's listing as ImageFolder sees it (relative path, class index, size and
mtime of every image), so any added, removed, renamed, resized or touched file gives a new entry. A pack
interrupted (Ctrl-C, a crash) resumes on the next open, through the packer's own resume.

Processes (DDP ranks, several jobs) share entries through ``flock`` on the lock file; the kernel drops a
dead process's locks:

* an opener takes the lock *shared* and, if the pack is complete, keeps it for as long as its Dataset lives;
* otherwise it takes the lock *exclusively* (waiting, with one log line, while another process packs), packs
  unless that process already did, and downgrades to shared. Nobody reads a half-written pack, and only one
  process packs each entry;
* after a pack, older entries of the same source folder are removed, each only if its lock can be taken
  exclusively at once: an entry any process still reads is never removed.

Parquet files and WebDataset tar shards (a file, a folder of them, a glob or a brace pattern) are packed
and cached the same way, keyed by their files' paths, sizes and mtimes (``sources.local_source`` picks the
adapter). Any other local path that holds no dataset (a folder that is not an ImageFolder, a CSV, a .npy
file) raises the error with the ``fastload pack`` command that packs it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shlex
import shutil
from pathlib import Path
from typing import IO

import xxhash

from .._errors import FormatError, SourceError
from ..formats.reader import NotADataset, read_manifest

log = logging.getLogger("fastload")

CACHE_ENV = "FASTLOAD_CACHE_DIR"


def cache_root(cache_dir: str | os.PathLike | None) -> Path:
    """Where packed folders go: ``<cache_dir or $FASTLOAD_CACHE_DIR or ~/.cache/fastload>/folders``.

    Always a ``folders`` subdirectory: the remote shard cache may share ``$FASTLOAD_CACHE_DIR`` and evicts
    the shard files of its own subdirectories."""
    if cache_dir is None:
        cache_dir = (
            os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fastload"
        )
    return Path(cache_dir) / "folders"


def resolve(path: Path, cache_dir: str | os.PathLike | None) -> tuple[Path, IO | None]:
    """``(dataset path, lease)``: ``path`` itself when it holds a dataset (lease None); for an unpacked
    ImageFolder, its pack in the cache and the open lock file that keeps the pack from being removed while
    the Dataset reading it lives. Anything else raises the error that says how to pack it."""
    try:
        read_manifest(path)
        return path, None
    except NotADataset as e:
        reason = str(e)
    from ..sources import is_pattern, local_source

    if not path.exists() and not is_pattern(str(path)):
        raise FormatError(f"'{path}' does not exist") from None
    try:
        source = local_source(path)
    except SourceError as e:
        if not path.is_dir():
            raise  # a source of a kind fastload knows (a Parquet file...) that cannot be read: its own error
        source, reason = None, f"{reason}; not an ImageFolder either ({e})"
    if source is None:
        raise FormatError(_pack_hint(path, reason)) from None
    return _cached_pack(source, cache_root(cache_dir))


def _pack_hint(path: Path, reason: str) -> str:
    """The error for a local path with no dataset: the ``fastload pack`` command that packs it."""
    named = path if path.name else path.resolve()  # "." has no name
    dest = str(named.with_name(named.stem + "_packed"))
    if path.is_dir():  # not an ImageFolder: its files pack from a manifest that lists them
        how = (
            f"`fastload pack` reads a folder as an ImageFolder (one subfolder of images per class); for any "
            f"other layout, list the files (a 'path' column, relative to the folder, plus your label "
            f"columns) in a CSV or JSONL manifest and pack that:\n    fastload pack files.csv "
            f"{shlex.quote(dest)} --root {shlex.quote(str(path))}"
        )
    else:
        how = (
            f"Pack it once (see `fastload pack --help` for the options):\n    fastload pack "
            f"{shlex.quote(str(path))} {shlex.quote(dest)}"
        )
    return f"{reason}. {how}\nthen open the packed copy: fastload.open({dest!r})"


def folder_key(source) -> str:
    """XXH3-128 of what ImageFolder lists: relative path, class index, size and mtime of every image (another
    source: of its ``cache_key()``, which says the same of its files)."""
    h = xxhash.xxh3_128()
    if hasattr(source, "cache_key"):
        h.update(source.cache_key().encode())
        return h.hexdigest()
    for path, label in source.samples:
        st = os.stat(path)
        h.update(f"{os.path.relpath(path, source.root)}\0{label}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def cached_pack(source, cache_dir: str | os.PathLike | None) -> tuple[Path, IO]:
    """``(pack path, lease)`` of an ImageFolder-like ``source`` (``fastload.DataLoader`` over torchvision's
    ImageFolder packs the dataset's own sample list, ``_front/tvfolder.py``), packed once into the cache as above.
    A source whose ``cache_variant`` is not None (a sample list other than the folder's own listing) keeps
    entries of its own: older entries of the same folder and variant are removed, the folder's others kept."""
    return _cached_pack(source, cache_root(cache_dir))


def _complete(entry: Path) -> bool:
    try:
        read_manifest(entry)  # written last and atomically by the packer
        return True
    except FormatError:
        return False


def _cached_pack(source, root: Path) -> tuple[Path, IO]:
    folder = Path(source.root).resolve()
    name = re.sub(r"[^A-Za-z0-9._-]", "_", folder.name)[:64] or "folder"
    entry = root / f"{name}-{folder_key(source)[:24]}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(f"{entry}.lock", "a+")  # noqa: SIM115  (the lease: open as long as the Dataset lives)
    except OSError as e:
        raise FormatError(
            f"fastload.open('{source.root}'): cannot use the pack cache {root} ({e.strerror}); "
            f"choose another place with cache_dir= or ${CACHE_ENV}"
        ) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_SH)
        if _complete(entry):
            return entry, lock
        fcntl.flock(lock, fcntl.LOCK_UN)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("fastload: another process is packing '%s' into %s; waiting for it", folder, entry)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if not _complete(entry):
            variant = getattr(source, "cache_variant", None)
            side = {"source": str(folder), "files": len(source)} | ({"variant": variant} if variant else {})
            Path(f"{entry}.json").write_text(json.dumps(side) + "\n")
            _pack(source, folder, entry)
            _remove_stale(root, folder, entry, variant)
        fcntl.flock(lock, fcntl.LOCK_SH)  # downgrade: readers share, cleanup leaves it alone
        return entry, lock
    except BaseException:
        lock.close()
        raise


def _pack(source, folder: Path, entry: Path) -> None:
    from ..pack import pack

    what = "image folder" if hasattr(source, "samples") else source.metadata.get("source", "source")
    log.warning(
        "fastload: packing %s '%s' (%d samples) once into %s; later opens of the unchanged "
        "folder read the pack (cache_dir= or $%s choose the place)",
        what,
        folder,
        len(source),
        entry,
        CACHE_ENV,
    )
    try:
        pack(source, entry, progress=True)
    except SourceError as e:
        raise SourceError(
            f"{e}\nfastload.open packs a folder with fastload.pack's defaults; to choose options "
            f"(e.g. --skip-bad), pack it yourself and open the result:\n    fastload pack "
            f"{shlex.quote(str(folder))} {shlex.quote(str(folder) + '_packed')} --skip-bad"
        ) from None


def _remove_stale(root: Path, folder: Path, keep: Path, variant: str | None = None) -> None:
    """Entries packed from ``folder`` (the same sample list ``variant``) before it changed, that no process has
    open."""
    for sidecar in root.glob("*.json"):
        entry = sidecar.with_suffix("")
        if entry == keep or not entry.is_dir():
            continue
        try:
            side = json.loads(sidecar.read_text())
            if side.get("source") != str(folder) or side.get("variant") != variant:
                continue
        except (OSError, ValueError, AttributeError):
            continue
        with open(f"{entry}.lock", "a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a Dataset somewhere still reads it
            shutil.rmtree(entry, ignore_errors=True)
            sidecar.unlink(missing_ok=True)
            log.warning("fastload: removed %s, the pack of '%s' before it changed", entry, folder)
