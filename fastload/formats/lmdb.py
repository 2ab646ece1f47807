"""The LMDB format: the same schema and layout inside one LMDB environment.

Keys (all bytes):

=============================  =================================================================
``manifest``                   the manifest JSON (layout "lmdb"; ``lmdb.rows_per_chunk`` in it)
``c/<field>/<column>/<chunk>`` rows ``chunk*R .. chunk*R+R-1`` of a fixed-size column (R rows per
                               chunk, chunk as 8 decimal digits), raw little-endian values
``s/<index>``                  sample record (index as 12 decimal digits) holding the blobs of the
                               variable-size fields: u64 ends[k] for the k blob fields, then data
``pack_state``                 only while a pack is unfinished: how many samples are committed
=============================  =================================================================

Readers open the environment read-only with ``lock=False`` and one long-lived read transaction with
``buffers=True``: values are zero-copy views into LMDB's memory map, checked before use.
"""

from __future__ import annotations

import json
import mmap
import os
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import xxhash

from .._errors import FastloadError, FormatError
from .._schema import Schema
from ._layout import check_columns, columns_of, expected_blob_length, has_blob, min_bytes
from .._version import __version__
from ..fields.registry import blob_problem
from ._format import Format
from ._manifest import Manifest

MANIFEST_KEY = b"manifest"
STATE_KEY = b"pack_state"
DEFAULT_ROWS_PER_CHUNK = 1024
DATA_FILE = "data.mdb"


def _lmdb():
    import lmdb  # a declared dependency; imported lazily to keep `import fastload` light

    return lmdb


def is_lmdb_error(e: BaseException) -> bool:
    """True for py-lmdb's errors (without importing lmdb when nothing used it)."""
    import sys

    mod = sys.modules.get("lmdb")
    return mod is not None and isinstance(e, mod.Error)


def chunk_key(field: str, col: str, chunk: int) -> bytes:
    return f"c/{field}/{col}/{chunk:08d}".encode()


def sample_key(i: int) -> bytes:
    return f"s/{i:012d}".encode()


def is_lmdb(path: Path) -> bool:
    return (path / DATA_FILE).is_file()


def encode_record(schema: Schema, sample: list) -> bytes:
    blobs = [bytes(sample[i][1]) for i, f in enumerate(schema) if has_blob(f)]
    ends = np.cumsum([len(b) for b in blobs], dtype="<u8") if blobs else np.zeros(0, "<u8")
    return ends.tobytes() + b"".join(blobs)


def encode_chunk(schema: Schema, samples: Sequence[list]) -> dict[tuple[str, str], bytes]:
    out = {}
    for i, f in enumerate(schema):
        for j, col in enumerate(columns_of(f)):
            arr = np.empty((len(samples),) + col.shape, dtype=col.dtype)
            for k, s in enumerate(samples):
                arr[k] = s[i][0][j]
            out[(f.name, col.name)] = arr.tobytes()
    return out


def chunk_digest(columns: dict[tuple[str, str], bytes], records: Sequence[bytes]) -> str:
    """xxh3_64 over a chunk's column values (schema order) then its records, as hex."""
    h = xxhash.xxh3_64()
    for data in columns.values():
        h.update(data)
    for rec in records:
        h.update(len(rec).to_bytes(8, "little"))
        h.update(rec)
    return h.hexdigest()


class LmdbWriter:
    """Appends samples chunk by chunk; each chunk is one transaction, so a killed pack resumes."""

    def __init__(self, path: Path, schema: Schema, rows_per_chunk: int | None = None, map_size: int = 1 << 40):
        self.path = path
        self.schema = schema
        self.rows = rows_per_chunk or DEFAULT_ROWS_PER_CHUNK
        self.env = _lmdb().open(
            str(path), map_size=map_size, subdir=True, readonly=False, metasync=True, sync=True, max_dbs=0
        )
        with self.env.begin() as txn:
            raw = txn.get(STATE_KEY)
        state = json.loads(raw) if raw else {"committed": 0}
        self.committed = int(state["committed"])

    def write_chunk(self, start: int, samples: Sequence[list], state: dict) -> None:
        """Write samples ``start ..`` (start a multiple of rows_per_chunk) and the resume state."""
        if start % self.rows:
            raise ValueError(f"chunk start {start} is not a multiple of {self.rows}")
        chunk = start // self.rows
        columns = encode_chunk(self.schema, samples)
        records = [encode_record(self.schema, s) for s in samples]
        digests = state.setdefault("chunk_digests", [])
        del digests[chunk:]
        digests.append(chunk_digest(columns, records))
        with self.env.begin(write=True) as txn:
            for (field, col), data in columns.items():
                txn.put(chunk_key(field, col, chunk), data)
            for k, rec in enumerate(records):
                txn.put(sample_key(start + k), rec)
            txn.put(STATE_KEY, json.dumps(dict(state, committed=start + len(samples))).encode())
        self.committed = start + len(samples)

    def read_state(self) -> dict:
        with self.env.begin() as txn:
            raw = txn.get(STATE_KEY)
        return json.loads(raw) if raw else {}

    def finish(self, manifest: Manifest) -> None:
        with self.env.begin(write=True) as txn:
            txn.put(MANIFEST_KEY, manifest.to_json().encode())
            txn.delete(STATE_KEY)
        self.env.sync(True)
        self.close()

    def close(self) -> None:
        self.env.close()


class LmdbSegment:
    """The whole LMDB environment as one segment, read zero-copy from one read transaction."""

    def __init__(self, path: Path, manifest: Manifest):
        self.path = path
        self.name = "lmdb"
        self.dataset = str(path)
        self.schema = manifest.schema
        self.count = manifest.num_samples
        info = manifest.metadata.get("lmdb")
        rows = info.get("rows_per_chunk") if isinstance(info, dict) else None
        if not isinstance(rows, int) or isinstance(rows, bool) or rows <= 0:
            raise FormatError(f"dataset '{path}': manifest metadata.lmdb.rows_per_chunk {rows!r} is not a positive int")
        self.rows = rows
        self.blob_fields = [f.name for f in self.schema if has_blob(f)]
        self._env = None
        self._txn = None
        self._pid = None
        self._chunks: dict[tuple[str, str, int], np.ndarray] = {}

    def _fail(self, msg: str) -> FormatError:
        return FormatError(f"dataset '{self.dataset}' (lmdb): {msg}")

    def open(self) -> "LmdbSegment":
        if self._txn is not None and self._pid == os.getpid():
            return self
        self._chunks = {}
        self._env = acquire_env(self.path)
        try:
            self._txn = self._env.begin(buffers=True)
        except _lmdb().Error as e:
            release_env(self.path)
            self._env = None
            raise self._fail(f"cannot start a read transaction: {e}") from None
        self._pid = os.getpid()
        return self

    def _get(self, key: bytes, what: str = "") -> memoryview:
        try:
            v = self.open()._txn.get(key)
        except _lmdb().Error as e:  # a damaged B-tree page (MDB_CORRUPTED, MDB_PAGE_NOTFOUND, ...)
            self._restart_txn()
            raise self._fail(f"{what}reading key {key.decode()} failed: {e}") from None
        if v is None:
            raise self._fail(f"{what}key {key.decode()} is missing")
        return v

    def _chunk(self, field: str, col: str, chunk: int) -> np.ndarray:
        key = (field, col, chunk)
        arr = self._chunks.get(key)
        if arr is None:
            c = next(c for c in columns_of(self.schema[field]) if c.name == col)
            nrows = min(self.rows, self.count - chunk * self.rows)
            where = f"samples {chunk * self.rows}..{chunk * self.rows + nrows - 1}, field '{field}': "
            buf = self._get(chunk_key(field, col, chunk), where)
            if len(buf) != nrows * c.row_bytes:
                raise self._fail(
                    f"{where}column chunk {field}/{col}/{chunk} is {len(buf)} bytes, expected {nrows} x {c.row_bytes}"
                )
            arr = np.frombuffer(buf, dtype=c.dtype, count=nrows * c.row_items).reshape((nrows,) + c.shape)
            msg = check_columns(self.schema[field], {col: arr}, chunk * self.rows)
            if msg:
                raise self._fail(f"field '{field}', {msg}")
            self._chunks[key] = arr
        return arr

    def _restart_txn(self) -> None:
        """A failed transaction refuses every later read: begin a fresh one on the same environment,
        which stays mapped, so views handed out before stay valid."""
        try:
            self._txn.abort()
            self._txn = self._env.begin(buffers=True)
        except _lmdb().Error:
            pass  # later reads fail again, each with its own FormatError

    def row(self, field: str, col: str, i: int) -> np.ndarray:
        return self._chunk(field, col, i // self.rows)[i % self.rows]

    def take(self, field: str, col: str, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        chunks = idx // self.rows
        first = self._chunk(field, col, int(chunks[0])) if len(idx) else None
        out = np.empty(
            (len(idx),) + (first.shape[1:] if first is not None else ()),
            dtype=first.dtype if first is not None else np.uint8,
        )
        for c in np.unique(chunks):
            sel = chunks == c
            out[sel] = self._chunk(field, col, int(c))[idx[sel] % self.rows]
        return out

    label = None  # one environment: messages name no shard

    def blob_sources(self, field: str, idx: np.ndarray) -> tuple[list, np.ndarray, np.ndarray, np.ndarray]:
        """Where samples ``idx``'s values of blob ``field`` lie: each value (a view into its record) is its
        own region."""
        regions = [self.blob(field, int(i)) for i in idx.tolist()]
        return (
            regions,
            np.arange(len(regions), dtype=np.int64),
            np.zeros(len(regions), np.int64),
            np.array([len(b) for b in regions], dtype=np.int64),
        )

    def column_region(self, field: str) -> None:
        """None: a column is stored in chunks (``row_sources`` says where each row lies)."""
        return None

    def row_sources(self, field: str, idx: np.ndarray, row_bytes: int) -> tuple[list, np.ndarray, np.ndarray]:
        """Where rows ``idx`` of fixed-size column ``field`` lie, for the native gather: each chunk the rows
        touch (read and checked as ``take`` reads it) is a region; a row's offset is its place in its chunk."""
        idx = np.asarray(idx, dtype=np.int64)
        chunks, region = np.unique(idx // self.rows, return_inverse=True)
        regions = [self._chunk(field, "values", int(c)) for c in chunks]
        return regions, region.astype(np.int64), (idx % self.rows) * row_bytes

    def blob(self, field: str, i: int) -> memoryview:
        rec = self._get(sample_key(i), f"sample {i}, field '{field}': record ")
        k = self.blob_fields.index(field)
        nb = len(self.blob_fields)
        if len(rec) < 8 * nb:
            raise self._fail(
                f"sample {i}, field '{field}': record is {len(rec)} bytes, shorter than its {8 * nb}-byte header"
            )
        ends = np.frombuffer(rec, dtype="<u8", count=nb)
        start = int(ends[k - 1]) if k else 0
        end = int(ends[k])
        payload = len(rec) - 8 * nb
        if not (start <= end <= payload) or int(ends[-1]) != payload:
            raise self._fail(
                f"sample {i}, field '{field}': blob range {start}..{end} does not fit the {payload}-byte record"
            )
        f = self.schema[field]
        cols = {c.name: self.row(field, c.name, i)[None] for c in columns_of(f)}
        expected = expected_blob_length(f, cols)
        if expected is not None and (expected[0] == -2 or (expected[0] >= 0 and expected[0] != end - start)):
            need = "is impossible" if expected[0] == -2 else f"needs {int(expected[0])}"
            raise self._fail(f"sample {i}, field '{field}': {end - start} bytes of data, the recorded shape {need}")
        return rec[8 * nb + start : 8 * nb + end]

    def close(self) -> None:
        self._chunks = {}
        if self._txn is not None and self._pid == os.getpid():
            self._txn.abort()
            release_env(self.path)
        self._txn = self._env = None


# LMDB allows one Environment per path per process: readers share it, counted.
_ENVS: dict[str, list] = {}
_ENVS_LOCK = threading.Lock()


def acquire_env(path: Path):
    key = os.path.realpath(path)
    with _ENVS_LOCK:
        entry = _ENVS.get(key)
        if entry is not None and entry[0] == os.getpid():
            entry[2] += 1
            return entry[1]
        if entry is not None:  # forked from the process that opened it: py-lmdb refuses a second open while
            entry[1].close()  # its copy lives here; closing it (lock=False) only unmaps this process's copy
        try:
            env = _lmdb().open(str(path), readonly=True, lock=False, subdir=True, readahead=False, max_readers=1024)
        except _lmdb().Error as e:
            raise FormatError(f"dataset '{path}': cannot open as LMDB: {e}") from None
        try:
            _check_not_truncated(path, env)
        except BaseException:
            env.close()
            raise
        _ENVS[key] = [os.getpid(), env, 1]
        return env


def _check_not_truncated(path: Path, env) -> None:
    """Refuse a data.mdb shorter than its last committed page: LMDB maps the file and would touch
    pages past its end (SIGBUS) rather than report a truncated copy."""
    try:
        need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        size = os.path.getsize(path / DATA_FILE)
    except (_lmdb().Error, OSError) as e:
        raise FormatError(f"dataset '{path}': cannot read the LMDB environment: {e}") from None
    if size < need:
        raise FormatError(
            f"dataset '{path}': {DATA_FILE} is {size} bytes, but its last committed page ends "
            f"at byte {need}: the file is truncated (an incomplete copy?)"
        )


def release_env(path: Path) -> None:
    key = os.path.realpath(path)
    with _ENVS_LOCK:
        entry = _ENVS.get(key)
        if entry is None or entry[0] != os.getpid():
            return
        entry[2] -= 1
        if entry[2] == 0:
            del _ENVS[key]
            entry[1].close()


def read_manifest(path: Path) -> Manifest:
    env = acquire_env(path)
    try:
        with env.begin() as txn:
            raw = txn.get(MANIFEST_KEY)
            unfinished = txn.get(STATE_KEY) is not None
    except _lmdb().Error as e:
        raise FormatError(f"dataset '{path}': cannot read the manifest from LMDB: {e}") from None
    finally:
        release_env(path)
    if raw is None:
        hint = " (an unfinished pack: run the same pack command again to resume)" if unfinished else ""
        raise FormatError(f"dataset '{path}': LMDB environment has no manifest{hint}")
    m = Manifest.parse(raw, f"dataset '{path}'")
    if m.layout != "lmdb":
        raise FormatError(f"dataset '{path}': manifest layout is {m.layout!r} inside an LMDB environment")
    size = os.path.getsize(path / DATA_FILE)
    need = min_bytes(m.schema, m.num_samples)
    if need > size:
        raise FormatError(
            f"dataset '{path}': the manifest claims {m.num_samples} samples, whose columns alone "
            f"need {need} bytes, but {DATA_FILE} is {size} bytes"
        )
    return m


def verify_lmdb(path: Path, manifest: Manifest, progress: Callable[[int], None] | None = None) -> list[str]:
    """Recompute every chunk's digest and validate every record. Returns one message per problem;
    ``progress`` is told each chunk's samples once that chunk is checked."""
    try:
        seg = LmdbSegment(path, manifest)
    except FormatError as e:  # a bad rows_per_chunk: a problem to report, not a traceback
        return [str(e)]
    digests = manifest.metadata["lmdb"].get("chunk_digests")
    problems = []
    n_chunks = -(-manifest.num_samples // seg.rows)
    if not isinstance(digests, list) or len(digests) != n_chunks:
        return [
            f"manifest lists {len(digests) if isinstance(digests, list) else 'no'} chunk digests, expected {n_chunks}"
        ]
    try:
        seg.open()
        for c in range(n_chunks):
            lo, hi = c * seg.rows, min(manifest.num_samples, (c + 1) * seg.rows)
            if progress is not None and c:
                progress(seg.rows)  # chunk c - 1 is checked
            try:
                columns = {}
                for f in seg.schema:
                    for col in columns_of(f):
                        seg._chunk(f.name, col.name, c)
                        columns[(f.name, col.name)] = bytes(seg._get(chunk_key(f.name, col.name, c)))
                records = [bytes(seg._get(sample_key(i))) for i in range(lo, hi)]
                for i in range(lo, hi):
                    for name in seg.blob_fields:
                        seg.blob(name, i)
                bad = blob_problem(seg.schema, seg, range(lo, hi))  # e.g. masks' PNGs decode
                if bad is not None:
                    problems.append(f"chunk {c} (samples {lo}..{hi - 1}): {bad}")
            except FormatError as e:
                problems.append(f"chunk {c} (samples {lo}..{hi - 1}): {e}")
                continue
            if chunk_digest(columns, records) != digests[c]:
                problems.append(f"chunk {c} (samples {lo}..{hi - 1}): checksum does not match the manifest's")
        if progress is not None and n_chunks:
            progress(manifest.num_samples - (n_chunks - 1) * seg.rows)
    finally:
        seg.close()
    return problems


# -- writing: the pack's sink and what a destination holds (driven by fastload/pack/) ----------------


class LmdbSink:
    """Samples are committed a chunk at a time; skipped samples do not take an index."""

    def __init__(self, dest: Path, src: Any, params: dict, state: dict | None):
        self.src, self.params = src, params
        self.writer = LmdbWriter(dest, src.schema)
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
        metadata = dict(
            self.src.metadata, lmdb={"rows_per_chunk": self.rows, "chunk_digests": self.state["chunk_digests"]}
        )
        m = Manifest(
            "lmdb",
            self.src.schema,
            self.writer.committed,
            [],
            self.params["image_mode"],
            self.state["skipped"],
            metadata,
            created_by=f"fastload {__version__}",
        )
        self.writer.finish(m)
        return m

    def close(self) -> None:
        self.writer.close()

    def total_bytes(self) -> int:
        return os.path.getsize(self.writer.path / DATA_FILE)


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
            ours = txn.get(MANIFEST_KEY) is not None or txn.get(STATE_KEY) is not None
        return not ours and env.stat()["entries"] > 0
    finally:
        env.close()


def _lmdb_complete(dest: Path) -> bool:
    if not is_lmdb(dest) or _lmdb_half_created(dest):
        return False
    try:
        read_manifest(dest)
        return True
    except FastloadError:
        return False


def _lmdb_half_created(dest: Path) -> bool:
    """A pack killed while LMDB created its environment: lock.mdb alone, or a data.mdb shorter than the
    two meta pages LMDB writes first. No transaction was ever committed there."""
    data = dest / "data.mdb"
    return not data.exists() or data.stat().st_size < 2 * mmap.PAGESIZE


def _nothing_committed(dest: Path, names: list[str]) -> bool:
    """A pack killed before its first commit leaves an LMDB environment holding no entry."""
    if set(names) <= {DATA_FILE, "lock.mdb"} and _lmdb_half_created(dest):
        return True
    if set(names) <= {DATA_FILE, "lock.mdb"} and DATA_FILE in names:
        w = LmdbWriter(dest, None)  # type: ignore[arg-type]
        try:
            return w.env.stat()["entries"] == 0
        finally:
            w.close()
    return False


class LmdbFormat(Format):
    """One LMDB environment (``data.mdb``) holding the manifest, column chunks and per-sample records."""

    name = "lmdb"
    marker = f"LMDB {DATA_FILE}"

    def detect(self, path: Path) -> bool:
        return is_lmdb(path)

    def manifest(self, path: Path) -> Manifest:
        return read_manifest(path)

    def segments(self, path: Path, manifest: Manifest) -> list:
        return [LmdbSegment(path, manifest)]

    def verify(self, path: Path, manifest: Manifest, progress: Callable[[int], None] | None = None) -> list[str]:
        return verify_lmdb(path, manifest, progress)

    def describe(self, path: Path, manifest: Manifest) -> list[str]:
        size = (path / DATA_FILE).stat().st_size
        return [f"lmdb      {size / 1e6:,.1f} MB, {manifest.metadata['lmdb']['rows_per_chunk']} rows per chunk"]

    def verified(self, manifest: Manifest) -> str:
        return f"{manifest.num_samples:,} samples, every LMDB chunk verified"

    def where(self, files: int) -> str:
        return "one LMDB environment"

    def sink(self, dest, src, params, shard_bytes, state, span, on_shard, keep_state) -> LmdbSink:
        return LmdbSink(dest, src, params, state)

    def owns(self, name: str) -> bool:
        return name in (DATA_FILE, "lock.mdb")

    def read_state(self, dest: Path) -> dict | None:
        if not is_lmdb(dest) or _lmdb_half_created(dest):
            return None
        w = LmdbWriter(dest, None)  # type: ignore[arg-type]
        try:
            state = w.read_state()
        finally:
            w.close()
        return state or None

    def complete(self, dest: Path) -> bool:
        return _lmdb_complete(dest)

    def foreign(self, dest: Path, names: list[str]) -> str | None:
        if DATA_FILE in names and _foreign_lmdb(dest):
            return (
                "an LMDB database fastload did not write (its data.mdb has entries but no fastload manifest or "
                "pack state)"
            )
        return None

    def nothing_committed(self, dest: Path, names: list[str]) -> bool:
        return _nothing_committed(dest, names)

    def is_write_error(self, e: BaseException) -> bool:
        return is_lmdb_error(e)


FORMAT = LmdbFormat()
