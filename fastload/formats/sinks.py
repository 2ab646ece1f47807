"""The writers a pack drives, one per on-disk form: ``ShardSink`` (samples to shard files, a block at a
time), ``ArraySink`` (numpy arrays to shards a column slice at a time) and ``LmdbSink`` (chunks committed
to one LMDB environment). Each keeps the pack resumable: ``pack_state.json`` (shards) or the LMDB state
record says what is committed, and nothing is marked complete before the manifest.

The packer (``_pack.py``) names no format module: ``prepare_dest`` reads what a destination holds (a
finished dataset, an unfinished pack to resume, a killed pack's scratch) and ``sink_for`` picks the writer.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .._errors import FastloadError, SourceError
from .._version import __version__
from . import lmdb as lmdb_format
from ._layout import columns_of
from ._manifest import MANIFEST_NAME, SHARD_NAME, Manifest, ShardEntry, fsync_dir, write_manifest
from .shards import shard_index, shard_name, write_shard, write_shard_columns

STATE_NAME = "pack_state.json"
_OWN_FILES = (MANIFEST_NAME, STATE_NAME, lmdb_format.DATA_FILE, "lock.mdb")


def write_state(dest: Path, state: dict) -> None:
    tmp = dest / (STATE_NAME + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, dest / STATE_NAME)
    fsync_dir(dest)


def sink_for(dest: Path, src: Any, params: dict, shard_bytes: int, state: dict | None, span: tuple[int, int],
             on_shard: Callable[[Path], None] | None = None, keep_state: bool = False) -> "ShardSink | LmdbSink":
    """The writer for ``params["format"]`` that takes samples one at a time (``add``/``skip``/``finish``)."""
    if params["format"] == "shards":
        return ShardSink(dest, src, params, shard_bytes, state, span, on_shard, keep_state)
    return LmdbSink(dest, src, params, state)


def is_write_error(e: BaseException) -> bool:
    """True for a failed write that a format's own library raised (LMDB's errors are not OSErrors)."""
    return lmdb_format.is_lmdb_error(e)


# -- the destination: what a pack finds there, and its resume state -----------------------------

def _own_file(name: str) -> bool:
    """Exactly the names a pack writes (and their temporary names): only these are ever removed."""
    base = name.removesuffix(".tmp")
    return base in _OWN_FILES or SHARD_NAME.fullmatch(base) is not None


def prepare_dest(dest: Path, overwrite: bool, params: dict, staged_for: str | None = None) -> dict | None:
    """Create or clear ``dest``; return the resume state of an unfinished identical pack, if any.

    ``staged_for``: ``dest`` stages a pack for that URL (``upload.py``). Its resume state outlives the
    manifest until the upload is done, so a re-run finishes uploading only a staged pack of the same
    source and options, and refuses any other (the same check as a local resume)."""
    where = f"staging folder {dest} (for {staged_for})" if staged_for else f"destination {dest}"
    if not dest.exists():
        dest.mkdir(parents=True)
        return None
    if not dest.is_dir():
        raise FastloadError(f"{where} exists and is not a directory")
    names = os.listdir(dest)
    foreign = [n for n in names if not _own_file(n) or (dest / n).is_dir()]
    if foreign:
        raise FastloadError(f"{where} holds files fastload did not write ({', '.join(sorted(foreign)[:5])}); "
                            f"refusing to write there — choose an empty or new directory")
    if lmdb_format.DATA_FILE in names and _foreign_lmdb(dest):
        raise FastloadError(f"{where} holds an LMDB database fastload did not write (its data.mdb has entries but "
                            f"no fastload manifest or pack state); refusing to write there — choose an empty or new "
                            f"directory")
    if overwrite:
        for n in names:
            (dest / n).unlink()  # files only, each one a pack's own (a folder counts as foreign)
        return None
    if MANIFEST_NAME in names and STATE_NAME in names and params["format"] == "shards":
        state = _read_state(dest, "shards")
        if state is not None and state.get("params") == params:
            if staged_for is None:  # killed after the manifest, before its resume state was removed: finish that
                (dest / STATE_NAME).unlink()
                fsync_dir(dest)
            return {"complete": True}
    if staged_for is not None and (MANIFEST_NAME in names or STATE_NAME in names):
        state = _read_state(dest, params["format"])
        if state is None or state.get("params") != params:
            raise FastloadError(f"{where} holds a pack of a different source or different options, not yet "
                                f"uploaded; run the command that started it to finish it, pass overwrite=True "
                                f"(--overwrite) to discard it (and replace any dataset at {staged_for}), or "
                                f"choose another staging folder (--staging / staging=)")
        return state
    if MANIFEST_NAME in names or _lmdb_complete(dest):
        raise FastloadError(f"{where} already holds a packed dataset; pass overwrite=True (--overwrite) "
                            f"to replace it")
    state = _read_state(dest, params["format"])
    if state is None:
        if names and not _nothing_committed(dest, names):
            raise FastloadError(f"{where} is not empty and holds no resumable pack; use --overwrite")
        for n in names:  # scratch of a pack killed before it committed anything
            (dest / n).unlink()
        return None
    if state.get("params") != params:
        raise FastloadError(f"{where} holds an unfinished pack with different parameters or source; "
                            f"run the original command to resume it, or pass --overwrite to start over")
    return state


def clear_pack(dest: Path, keep: str) -> None:
    """Remove a finished pack's own files from ``dest`` before packing there again (``overwrite``); the
    folder ``keep`` is left to its owner. Anything fastload did not write is refused, and nothing removed."""
    names = os.listdir(dest)
    foreign = [n for n in names if n != keep and (not _own_file(n) or (dest / n).is_dir())]
    if foreign:
        shown = ", ".join(sorted(foreign)[:5])
        raise FastloadError(f"destination {dest} holds files fastload did not write ({shown}); refusing to write "
                            f"there — choose an empty or new directory")
    for n in names:
        if n != keep:
            (dest / n).unlink()


def remove_pack(dest: Path) -> None:
    """Remove a pack's own files from ``dest`` (a staged copy, once uploaded), then ``dest`` if that
    emptied it; anything else there is left alone."""
    if not dest.is_dir():
        return
    for n in os.listdir(dest):
        if _own_file(n) and (dest / n).is_file():
            (dest / n).unlink()
    try:
        dest.rmdir()
    except OSError:
        pass


def _foreign_lmdb(dest: Path) -> bool:
    """True when ``dest`` holds someone else's LMDB database: entries, but neither a fastload manifest nor
    a pack's resume state. Opened read-only, without a lock: nothing is written to it."""
    if _lmdb_half_created(dest):
        return False
    import lmdb

    try:
        env = lmdb.open(str(dest), readonly=True, lock=False, subdir=True, max_dbs=0)
    except lmdb.Error:
        return True  # not even readable as LMDB: not ours to delete
    try:
        with env.begin() as txn:
            ours = txn.get(lmdb_format.MANIFEST_KEY) is not None or txn.get(lmdb_format.STATE_KEY) is not None
        return not ours and env.stat()["entries"] > 0
    finally:
        env.close()


def _nothing_committed(dest: Path, names: list[str]) -> bool:
    """True when ``names`` are only what a pack killed before its first commit leaves: temporary files
    (never complete by construction) and an LMDB environment holding no entry."""
    rest = [n for n in names if not n.endswith(".tmp")]
    if not rest:
        return True
    if set(rest) <= {"data.mdb", "lock.mdb"} and _lmdb_half_created(dest):
        return True
    if set(rest) <= {"data.mdb", "lock.mdb"} and "data.mdb" in rest:
        w = lmdb_format.LmdbWriter(dest, None)  # type: ignore[arg-type]
        try:
            return w.env.stat()["entries"] == 0
        finally:
            w.close()
    return False


def _lmdb_complete(dest: Path) -> bool:
    if not lmdb_format.is_lmdb(dest) or _lmdb_half_created(dest):
        return False
    try:
        lmdb_format.read_manifest(dest)
        return True
    except FastloadError:
        return False


def _lmdb_half_created(dest: Path) -> bool:
    """A pack killed while LMDB created its environment: lock.mdb alone, or a data.mdb shorter than the
    two meta pages LMDB writes first. No transaction was ever committed there."""
    data = dest / "data.mdb"
    return not data.exists() or data.stat().st_size < 2 * mmap.PAGESIZE


def _read_state(dest: Path, fmt: str) -> dict | None:
    if fmt == "lmdb":
        if not lmdb_format.is_lmdb(dest) or _lmdb_half_created(dest):
            return None
        w = lmdb_format.LmdbWriter(dest, None)  # type: ignore[arg-type]
        try:
            state = w.read_state()
        finally:
            w.close()
        return state or None
    path = dest / STATE_NAME
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return None


class ShardSink:
    def __init__(self, dest: Path, src: Any, params: dict, shard_bytes: int, state: dict | None,
                 span: tuple[int, int], on_shard: Callable[[Path], None] | None = None, keep_state: bool = False):
        self.dest, self.src, self.params, self.limit = dest, src, params, shard_bytes
        self.on_shard = on_shard
        self.keep_state = keep_state  # a staged pack: its resume state says what it is until it is uploaded
        self.span = span  # the source samples [lo, hi) this pack writes (all of them, or one part's)
        self.block = params["block"]
        self.state = state or {"params": params, "shards": [], "skipped": [], "next_sample": span[0]}
        self.next_sample = self.state["next_sample"]
        self.buffer: list[list] = []
        self.buffered = 0
        if state is None:  # from now on the destination is a resumable pack, whenever it is killed
            write_state(dest, self.state)

    def close(self) -> None:
        pass

    def add(self, i: int, encoded: list) -> None:
        self.buffer.append(encoded)
        self.buffered += sum(len(b) if b is not None else 0 for _, b in encoded) + 64
        if self.buffered >= self.limit or (i + 1) % self.block == 0:
            self._flush(i + 1)

    def skip(self, record: dict) -> None:
        self.state["skipped"].append(record)
        if (record["index"] + 1) % self.block == 0:
            self._flush(record["index"] + 1)

    def _flush(self, next_sample: int) -> None:
        entry = None
        if self.buffer:
            b = (next_sample - 1) // self.block  # the block of the buffered samples
            done = sum(1 for s in self.state["shards"] if shard_index(s["file"]) // self.block == b)
            name = shard_name(b * self.block + done)
            entry = write_shard(self.dest / name, self.src.schema, self.buffer)
            self.state["shards"].append(entry.to_json())
        self.buffer, self.buffered = [], 0
        self.state["next_sample"] = next_sample
        write_state(self.dest, self.state)
        if entry is not None and self.on_shard is not None:
            self.on_shard(self.dest / entry.file)

    def finish(self) -> Manifest:
        if self.buffer:
            self._flush(self.span[1])
        shards = [ShardEntry(**s) for s in self.state["shards"]]
        metadata = dict(self.src.metadata)
        if "part" in self.params:
            metadata["part"] = self.params["part"]  # merge removes it
        m = Manifest("shards", self.src.schema, sum(s.num_samples for s in shards), shards,
                     self.params["image_mode"], self.state["skipped"], metadata,
                     created_by=f"fastload {__version__}")
        write_manifest(self.dest, m)
        if not self.keep_state:
            (self.dest / STATE_NAME).unlink(missing_ok=True)
            fsync_dir(self.dest)
        return m

    def total_bytes(self) -> int:
        return sum(s["bytes"] for s in self.state["shards"])


def array_rows(src: Any, shard_bytes: int) -> int:
    """Rows per shard of a fixed-size array source: shard k holds rows [k * rows, (k + 1) * rows)."""
    row_bytes = sum(c.row_bytes for f in src.schema for c in columns_of(f))
    return max(1, shard_bytes // max(row_bytes, 1))


class ArraySink(ShardSink):
    """Numpy arrays to shards a column slice at a time: no per-sample Python at all."""

    def run(self, progress: bool, label: str) -> None:
        src = self.src
        columns = []
        for f in src.schema:
            arr = src.arrays[f.name]
            dt = f.np_dtype
            if arr.dtype != dt and not np.can_cast(arr.dtype, dt, "safe"):
                raise SourceError(f"array '{f.name}' of dtype {arr.dtype} cannot be stored as {dt} without loss")
            want = tuple(f.shape) if f.kind == "ndarray" else ()
            if tuple(arr.shape[1:]) != want:
                raise SourceError(f"array '{f.name}' has rows of shape {arr.shape[1:]}, the schema says {want}")
            columns.append((arr, dt))
        rows = array_rows(src, self.limit)
        first, n = self.span
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=n - first, initial=self.next_sample - first, unit="sample",
                       desc=f"pack {label}")
        for lo in range(self.next_sample, n, rows):
            hi = min(n, lo + rows)
            cols = [np.asarray(a[lo:hi]).astype(dt, copy=False) for a, dt in columns]
            entry = write_shard_columns(self.dest / shard_name(lo // rows), src.schema, cols)
            self.state["shards"].append(entry.to_json())
            self.state["next_sample"] = hi
            write_state(self.dest, self.state)
            if self.on_shard is not None:
                self.on_shard(self.dest / entry.file)
            if bar is not None:
                bar.update(hi - lo)
        if bar is not None:
            bar.close()


class LmdbSink:
    """Samples are committed a chunk at a time; skipped samples do not take an index."""

    def __init__(self, dest: Path, src: Any, params: dict, state: dict | None):
        self.src, self.params = src, params
        self.writer = lmdb_format.LmdbWriter(dest, src.schema)
        self.state = state or {"params": params, "skipped": [], "next_sample": 0, "chunk_digests": []}
        self.next_sample = self.state["next_sample"]
        self.buffer: list[list] = []
        self.rows = self.writer.rows

    def add(self, i: int, encoded: list) -> None:
        self.buffer.append(encoded)
        if len(self.buffer) == self.rows:
            self._flush(i + 1)

    def skip(self, record: dict) -> None:
        self.state["skipped"].append(record)

    def _flush(self, next_sample: int) -> None:
        self.state["next_sample"] = next_sample
        self.writer.write_chunk(self.writer.committed, self.buffer, self.state)
        self.buffer = []

    def finish(self) -> Manifest:
        if self.buffer:
            self._flush(len(self.src))
        metadata = dict(self.src.metadata,
                        lmdb={"rows_per_chunk": self.rows, "chunk_digests": self.state["chunk_digests"]})
        m = Manifest("lmdb", self.src.schema, self.writer.committed, [], self.params["image_mode"],
                     self.state["skipped"], metadata, created_by=f"fastload {__version__}")
        self.writer.finish(m)
        return m

    def close(self) -> None:
        self.writer.close()

    def total_bytes(self) -> int:
        return os.path.getsize(self.writer.path / lmdb_format.DATA_FILE)
