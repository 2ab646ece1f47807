"""Packed shards: numbered binary files plus a JSON manifest (the default format).

Layout of one shard file (all integers little-endian; see docs/FORMAT.md for an example)::

    0   8 bytes  magic b"FLSHARD1"
    8   u32      format version
    12  u32      number of sections S
    16  u64      number of samples N
    24  u64      shard index K (the file is shard-K.fls: a renamed or swapped shard is refused)
    32  32 bytes zero
    64  S x (u64 offset, u64 length)   section table
        sections, each starting at a multiple of 64 bytes, in ``section_names(schema)`` order

Shards are memory-mapped read-only and every offset is validated when a shard is first touched, so
reads afterwards are plain slices of verified ranges.
"""

from __future__ import annotations

import itertools
import json
import mmap
import os
import struct
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import xxhash

from .._errors import FormatError, SourceError, VersionError
from .._schema import Field, Schema
from .._version import __version__
from ..fields.registry import blob_problem
from ._format import Format
from ._layout import FORMAT_VERSION, check_columns, columns_of, expected_blob_length, has_blob, min_bytes, section_names
from ._manifest import (
    MANIFEST_NAME,
    SHARD_NAME,
    STATE_NAME,
    Manifest,
    ShardEntry,
    fsync_dir,
    read_manifest_file,
    write_manifest,
)

SHARD_MAGIC = b"FLSHARD1"
HEADER = struct.Struct("<8sIIQQ32s")
RESERVED = bytes(32)
SECTION = struct.Struct("<QQ")
ALIGN = 64


def shard_name(k: int) -> str:
    return f"shard-{k:05d}.fls"


def shard_index(name: str) -> int:
    """K of ``shard-K.fls`` (the name is checked when the manifest is parsed, or here when writing)."""
    if not SHARD_NAME.fullmatch(name):
        raise ValueError(f"shard file name {name!r} is not of the form shard-NNNNN.fls")
    return int(name[len("shard-") : -len(".fls")])


def _pad(n: int) -> int:
    return (-n) % ALIGN


# -- writing ------------------------------------------------------------------------------------


def _sections(schema: Schema, samples: Sequence[list]) -> list[bytes | memoryview]:
    n = len(samples)
    out: list[bytes | memoryview] = []
    for i, f in enumerate(schema):
        for j, col in enumerate(columns_of(f)):
            arr = np.empty((n,) + col.shape, dtype=col.dtype)
            for k, s in enumerate(samples):
                arr[k] = s[i][0][j]
            out.append(memoryview(arr.reshape(-1).view(np.uint8)))  # cast("B") refuses zero-size shapes
        if has_blob(f):
            blobs = [s[i][1] for s in samples]
            offsets = np.zeros(n + 1, dtype="<u8")
            np.cumsum([len(b) for b in blobs], out=offsets[1:])
            out.append(memoryview(offsets).cast("B"))
            out.append(b"".join(blobs))
    return out


def write_shard(path: Path, schema: Schema, samples: Sequence[list]) -> ShardEntry:
    """Write encoded samples to ``path`` atomically (temp name, fsync, rename); return its entry."""
    return _write_sections(path, _sections(schema, samples), len(samples))


def write_shard_columns(path: Path, schema: Schema, columns: Sequence[np.ndarray]) -> ShardEntry:
    """Write a shard of a fixed-size-only schema straight from its columns (one array per column, in
    ``section_names`` order, already of the column's dtype and row shape): no per-sample work."""
    if any(has_blob(f) for f in schema):
        raise ValueError("write_shard_columns needs a schema of fixed-size fields only")
    n = len(columns[0]) if columns else 0
    sections = [memoryview(np.ascontiguousarray(c).reshape(-1).view(np.uint8)) for c in columns]
    return _write_sections(path, sections, n)


def _write_sections(path: Path, sections: list, n: int) -> ShardEntry:
    table_end = HEADER.size + SECTION.size * len(sections)
    pos = table_end + _pad(table_end)
    table = []
    for s in sections:
        table.append((pos, len(s)))
        pos += len(s) + _pad(len(s))
    header = HEADER.pack(SHARD_MAGIC, FORMAT_VERSION, len(sections), n, shard_index(path.name), RESERVED)
    head = header + b"".join(SECTION.pack(o, n) for o, n in table) + bytes(_pad(table_end))
    tmp = path.with_name(path.name + ".tmp")
    h = xxhash.xxh3_64()
    try:
        with open(tmp, "wb") as fh:
            for chunk in [head] + [x for s in sections for x in (s, bytes(_pad(len(s))))]:
                fh.write(chunk)
                h.update(chunk)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as e:  # a full disk: leave no partial file behind (a killed pack's is overwritten on resume)
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(tmp)) from e
    os.replace(tmp, path)
    return ShardEntry(path.name, n, pos, h.hexdigest())


def file_digest(path: Path, chunk: int = 8 << 20) -> tuple[int, str]:
    h = xxhash.xxh3_64()
    size = 0
    with open(path, "rb") as fh:
        while True:
            b = fh.read(chunk)
            if not b:
                break
            size += len(b)
            h.update(b)
    return size, h.hexdigest()


# -- reading ------------------------------------------------------------------------------------


class ShardSegment:
    """One memory-mapped shard: columns as numpy views, blobs as slices of the mapping."""

    def __init__(self, path: Path, entry: ShardEntry, schema: Schema, dataset: str, start: int = 0):
        self.path = path
        self.start = start  # dataset index of the shard's first sample, to name samples in errors
        self.name = entry.file
        self.count = entry.num_samples
        self.entry = entry
        self.schema = schema
        self.dataset = dataset
        self._mm: mmap.mmap | None = None
        self.columns: dict[tuple[str, str], np.ndarray] = {}
        self.offsets: dict[str, np.ndarray] = {}
        self.data: dict[str, memoryview] = {}
        self.data_start: dict[str, int] = {}
        self.column_start: dict[tuple[str, str], int] = {}  # file offset of each column section

    def _fail(self, msg: str) -> FormatError:
        return FormatError(f"dataset '{self.dataset}', shard '{self.name}': {msg}")

    def open(self) -> "ShardSegment":
        if self._mm is not None:
            return self
        try:
            with open(self.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size != self.entry.bytes:
                    raise self._fail(
                        f"file is {size} bytes, the manifest says {self.entry.bytes} (truncated or replaced)"
                    )
                if size < HEADER.size:
                    raise self._fail(f"file is {size} bytes, shorter than the {HEADER.size}-byte header")
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise self._fail(f"file is missing ({self.path})") from None
        except OSError as e:  # a directory, no permission, an I/O error, an unmappable file
            raise self._fail(f"cannot read the file ({type(e).__name__}: {e})") from None
        try:
            self._validate(mm, size)
        except Exception:
            self.columns.clear()
            self.offsets.clear()
            self.data.clear()
            raise
        self._mm = mm
        return self

    def _validate(self, mm: mmap.mmap, size: int) -> None:
        magic, version, nsec, n, index, reserved = HEADER.unpack_from(mm, 0)
        if magic != SHARD_MAGIC:
            raise self._fail(f"bad magic {magic!r}, expected {SHARD_MAGIC!r}")
        if version > FORMAT_VERSION:
            raise VersionError(
                f"dataset '{self.dataset}', shard '{self.name}': written with format version "
                f"{version}, this fastload reads up to version {FORMAT_VERSION}; upgrade fastload"
            )
        if version != FORMAT_VERSION:
            raise self._fail(f"shard format version {version}, this fastload reads version {FORMAT_VERSION}")
        if n != self.count:
            raise self._fail(f"header says {n} samples, the manifest says {self.count}")
        if index != shard_index(self.name):
            raise self._fail(f"header says this is shard {index}, not {shard_index(self.name)} (renamed or swapped)")
        if reserved != RESERVED:
            raise self._fail("reserved header bytes 32..63 are not zero")
        names = section_names(self.schema)
        if nsec != len(names):
            raise self._fail(f"{nsec} sections, the schema needs {len(names)}")
        table_end = HEADER.size + SECTION.size * nsec
        if table_end > size:
            raise self._fail("section table runs past the end of the file")
        table = np.frombuffer(mm, dtype="<u8", count=2 * nsec, offset=HEADER.size).reshape(nsec, 2)
        sections = {}
        prev_end = table_end  # sections lie in file order after the table and never overlap
        for (field, part), (off, length) in zip(names, table.tolist()):
            if off < prev_end or off % ALIGN or length > size or off > size - length:
                raise self._fail(
                    f"section {field}.{part} at offset {off} length {length} lies outside "
                    f"bytes {prev_end}..{size} of the file (or is not {ALIGN}-byte aligned)"
                )
            sections[(field, part)] = (off, length)
            prev_end = off + length
        for f in self.schema:
            self._validate_field(mm, f, sections)

    def _validate_field(self, mm: mmap.mmap, f: Field, sections: dict) -> None:
        n = self.count
        cols = {}
        for col in columns_of(f):
            off, length = sections[(f.name, col.name)]
            if length != n * col.row_bytes:
                raise self._fail(
                    f"field '{f.name}' column {col.name} is {length} bytes, expected {n} x {col.row_bytes}"
                )
            arr = np.frombuffer(mm, dtype=col.dtype, count=n * col.row_items, offset=off).reshape((n,) + col.shape)
            cols[col.name] = arr
            self.columns[(f.name, col.name)] = arr
            self.column_start[(f.name, col.name)] = off
        msg = check_columns(f, cols, self.start)
        if msg:
            raise self._fail(f"field '{f.name}', {msg}")
        if not has_blob(f):
            return
        off, length = sections[(f.name, "offsets")]
        if length != 8 * (n + 1):
            raise self._fail(f"field '{f.name}' offsets are {length} bytes, expected {8 * (n + 1)}")
        offsets = np.frombuffer(mm, dtype="<u8", count=n + 1, offset=off)
        doff, dlen = sections[(f.name, "data")]
        if offsets[0] != 0 or offsets[-1] != dlen:
            raise self._fail(
                f"field '{f.name}' offsets run from {int(offsets[0])} to {int(offsets[-1])}, "
                f"expected 0 to {dlen} (the data size)"
            )
        bad = np.nonzero(offsets[1:] < offsets[:-1])[0]
        if bad.size:
            raise self._fail(
                f"sample {self.start + int(bad[0])}, field '{f.name}': offsets decrease "
                f"({int(offsets[bad[0]])} then {int(offsets[bad[0] + 1])})"
            )
        lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
        expected = expected_blob_length(f, cols)
        if expected is not None:
            bad = np.nonzero((expected >= 0) & (lengths != expected) | (expected == -2))[0]
            if bad.size:
                k = int(bad[0])
                need = "is impossible" if expected[k] == -2 else f"needs {int(expected[k])}"
                raise self._fail(
                    f"sample {self.start + k}, field '{f.name}': {int(lengths[k])} bytes of data, "
                    f"the recorded shape {need}"
                )
        self.offsets[f.name] = offsets
        self.data[f.name] = memoryview(mm)[doff : doff + dlen]
        self.data_start[f.name] = doff

    def row(self, field: str, col: str, i: int) -> np.ndarray:
        return self.open().columns[(field, col)][i]

    def take(self, field: str, col: str, idx: np.ndarray) -> np.ndarray:
        return self.open().columns[(field, col)].take(idx, axis=0)

    @property
    def label(self) -> str:
        """The shard's file name, for messages."""
        return self.name

    def blob_sources(self, field: str, idx: np.ndarray) -> tuple[list, None, np.ndarray, np.ndarray]:
        """Where samples ``idx``'s values of blob ``field`` lie: byte ranges of the one mapped file."""
        buffer = self.buffer
        offs = self.offsets[field]
        return (
            [buffer],
            None,
            self.data_start[field] + offs[idx].astype(np.int64),
            (offs[idx + 1] - offs[idx]).astype(np.int64),
        )

    def column_region(self, field: str) -> tuple[mmap.mmap, int]:
        """Fixed-size column ``field`` in one piece: the mapped file and the column's byte offset in it (the
        reader computes every row's offset at once, for the whole batch)."""
        return self.buffer, self.column_start[(field, "values")]

    def blob(self, field: str, i: int) -> memoryview:
        self.open()
        offs = self.offsets[field]
        return self.data[field][int(offs[i]) : int(offs[i + 1])]

    def close(self) -> None:
        self.columns.clear()
        self.offsets.clear()
        for mv in self.data.values():
            mv.release()
        self.data.clear()
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # a caller still holds a view; the mapping goes when that view does
            self._mm = None

    @property
    def buffer(self) -> mmap.mmap:
        """The whole mapped file (for the native batch gather, with ``data_start`` offsets)."""
        self.open()
        return self._mm


def _starts(manifest: Manifest) -> list[int]:
    return list(itertools.accumulate((e.num_samples for e in manifest.shards[:-1]), initial=0))


def shard_segments(root: Path, manifest: Manifest) -> list[ShardSegment]:
    for e in manifest.shards:  # before anything is sized from the schema: a shard holds its samples' columns
        need = HEADER.size + min_bytes(manifest.schema, e.num_samples)
        if e.num_samples and need > e.bytes:
            raise FormatError(
                f"dataset '{root}', shard '{e.file}': the manifest says {e.num_samples} samples, "
                f"whose columns alone need {need} bytes, and {e.bytes} bytes for the shard"
            )
    return [
        ShardSegment(root / e.file, e, manifest.schema, str(root), start)
        for e, start in zip(manifest.shards, _starts(manifest))
    ]


def verify_shards(root: Path, manifest: Manifest, progress: Callable[[int], None] | None = None) -> list[str]:
    """Check every shard's size, checksum and structure. Returns one message per bad shard; ``progress`` is
    told each shard's samples once that shard is checked."""
    problems = []
    for e, start in _told(zip(manifest.shards, _starts(manifest)), progress):
        path = root / e.file
        if not path.exists():
            problems.append(f"{e.file}: missing")
            continue
        bad = verify_shard(path, e, manifest.schema, str(root), start)
        if bad is not None:
            problems.append(f"{e.file}: {bad}")
    return problems


def verify_shard(path: Path, e: ShardEntry, schema: Any, where: str, start: int) -> str | None:
    """What is wrong with the shard file at ``path`` (size, checksum, structure) against its manifest entry, or
    None. ``where`` names the dataset in messages; ``start`` is the shard's first sample. Used for a local
    dataset and for each downloaded shard of a remote one (``remote.py``)."""
    try:
        size, digest = file_digest(path)
    except OSError as err:
        return f"cannot read ({type(err).__name__}: {err})"
    if size != e.bytes:
        return f"{size} bytes, manifest says {e.bytes}"
    if digest != e.xxh3_64:
        return f"checksum {digest} does not match the manifest's {e.xxh3_64}"
    seg = ShardSegment(path, e, schema, where, start)
    try:
        seg.open()
        return blob_problem(schema, seg, range(seg.count), start)  # e.g. masks' PNGs decode
    except FormatError as err:
        return str(err)
    finally:
        seg.close()


def _told(items, progress: Callable[[int], None] | None):
    """Yield (entry, start) pairs; after the caller's loop body for one (``continue`` included), report it."""
    for item in items:
        yield item
        if progress is not None:
            progress(item[0].num_samples)


# -- writing: the pack's sinks (driven by fastload/pack/) -------------------------------------------


def _write_state(dest: Path, state: dict) -> None:
    """``pack_state.json``, atomically. (``Path.open``: tests that fill the disk under the shard writer's
    ``open`` count shard bytes only, as they did when this lived in the packer.)"""
    tmp = dest / (STATE_NAME + ".tmp")
    with tmp.open("w") as fh:
        json.dump(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, dest / STATE_NAME)
    fsync_dir(dest)


class ShardSink:
    """Samples to shard files, a block at a time; ``pack_state.json`` after each shard says what is done."""

    def __init__(
        self,
        dest: Path,
        src: Any,
        params: dict,
        shard_bytes: int,
        state: dict | None,
        span: tuple[int, int],
        on_shard: Callable[[Path], None] | None = None,
        keep_state: bool = False,
    ):
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
            _write_state(dest, self.state)

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
        _write_state(self.dest, self.state)
        if entry is not None and self.on_shard is not None:
            self.on_shard(self.dest / entry.file)

    def finish(self) -> Manifest:
        if self.buffer:
            self._flush(self.span[1])
        shards = [ShardEntry(**s) for s in self.state["shards"]]
        metadata = dict(self.src.metadata)
        if "part" in self.params:
            metadata["part"] = self.params["part"]  # merge removes it
        m = Manifest(
            "shards",
            self.src.schema,
            sum(s.num_samples for s in shards),
            shards,
            self.params["image_mode"],
            self.state["skipped"],
            metadata,
            created_by=f"fastload {__version__}",
        )
        write_manifest(self.dest, m)
        if not self.keep_state:
            (self.dest / STATE_NAME).unlink(missing_ok=True)
            fsync_dir(self.dest)
        return m

    def total_bytes(self) -> int:
        return sum(s["bytes"] for s in self.state["shards"])


def _array_rows(src: Any, shard_bytes: int) -> int:
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
        rows = _array_rows(src, self.limit)
        first, n = self.span
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=n - first, initial=self.next_sample - first, unit="sample", desc=f"pack {label}")
        for lo in range(self.next_sample, n, rows):
            hi = min(n, lo + rows)
            cols = [np.asarray(a[lo:hi]).astype(dt, copy=False) for a, dt in columns]
            entry = write_shard_columns(self.dest / shard_name(lo // rows), src.schema, cols)
            self.state["shards"].append(entry.to_json())
            self.state["next_sample"] = hi
            _write_state(self.dest, self.state)
            if self.on_shard is not None:
                self.on_shard(self.dest / entry.file)
            if bar is not None:
                bar.update(hi - lo)
        if bar is not None:
            bar.close()


class ShardsFormat(Format):
    """The default layout: numbered shard files and ``manifest.json`` (see the module docstring)."""

    name = "shards"
    marker = MANIFEST_NAME
    parts = True
    arrays = True

    def detect(self, path: Path) -> bool:
        return (path / MANIFEST_NAME).is_file()

    def manifest(self, path: Path) -> Manifest:
        m = read_manifest_file(path)
        if m.layout != "shards":
            raise FormatError(f"dataset '{path}': manifest.json says layout {m.layout!r}, expected 'shards'")
        self.check(m, f"dataset '{path}'")
        return m

    def check(self, manifest: Manifest, where: str) -> None:
        held = sum(s.num_samples for s in manifest.shards)
        if held != manifest.num_samples:
            raise FormatError(f"{where}: shards hold {held} samples, num_samples says {manifest.num_samples}")

    def segments(self, path: Path, manifest: Manifest) -> list:
        return shard_segments(path, manifest)

    def verify(self, path: Path, manifest: Manifest, progress: Callable[[int], None] | None = None) -> list[str]:
        return verify_shards(path, manifest, progress)

    def describe(self, path: Path, manifest: Manifest) -> list[str]:
        total = sum(s.bytes for s in manifest.shards)
        return [f"shards    {len(manifest.shards)}, {total / 1e6:,.1f} MB in all"] + [
            f"  {s.file}  {s.num_samples:>9,} samples  {s.bytes / 1e6:>10,.1f} MB  xxh3 {s.xxh3_64}"
            for s in manifest.shards
        ]

    def verified(self, manifest: Manifest) -> str:
        return f"{manifest.num_samples:,} samples, {len(manifest.shards)} shard(s) verified"

    def where(self, files: int) -> str:
        return f"{files} shard(s)"

    def sink(self, dest, src, params, shard_bytes, state, span, on_shard, keep_state) -> ShardSink:
        return ShardSink(dest, src, params, shard_bytes, state, span, on_shard, keep_state)

    def array_sink(self, dest, src, params, shard_bytes, state, span, on_shard, keep_state) -> ArraySink:
        return ArraySink(dest, src, params, shard_bytes, state, span, on_shard, keep_state)

    def array_rows(self, src: Any, shard_bytes: int) -> int:
        return _array_rows(src, shard_bytes)

    def owns(self, name: str) -> bool:
        return name in (MANIFEST_NAME, STATE_NAME) or SHARD_NAME.fullmatch(name) is not None

    def read_state(self, dest: Path) -> dict | None:
        path = dest / STATE_NAME
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text())
        except ValueError:
            return None

    def complete(self, dest: Path) -> bool:
        return (dest / MANIFEST_NAME).is_file()


FORMAT = ShardsFormat()
