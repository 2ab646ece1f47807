"""``PackedReader``: what the layers above the bytes on disk need from an opened dataset, whatever its format.

The batcher, the image decoders, the loader, ``ds[i]`` and ``fastload bench`` ask it to locate samples,
group a batch by segment, say where fixed-size rows and blobs lie for the native calls (it returns the
regions and offsets; the caller makes the call, with its own thread pool), and read columns, values and
names for messages. Segments of every format (shards, local or cached from a URL, and LMDB) answer the
same methods: nothing here or above checks a segment's class.

``joined`` reads several datasets as one (``fastload.mix``), each segment answering in the mix's field names.

``read_manifest``, ``local_segments``, ``verify`` and ``describe_storage`` are the format-neutral entries
for a local path: each asks the ``Format`` of ``registry.py`` that recognises what is on disk.

A *batch view* (``Located``) is computed once per batch: ``seg_ids`` and ``local`` per position,
``groups`` = ``[(segment index, positions)]``, and the opened segments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .._errors import FormatError
from ._layout import columns_of
from ._manifest import STATE_NAME, Manifest
from .registry import FORMATS, format_of


def read_manifest(path: Path) -> Manifest:
    """The manifest of a local dataset, in whichever format it is (the first that ``detect``s it), validated;
    FormatError otherwise."""
    for f in FORMATS.values():
        if f.detect(path):
            return f.manifest(path)
    if (path / STATE_NAME).exists():
        raise FormatError(
            f"dataset '{path}' is an unfinished pack (no manifest yet); run the same pack command again to resume it"
        )
    raise NotADataset(f"'{path}' is not a fastload dataset: no " + " and no ".join(f.marker for f in FORMATS.values()))


class NotADataset(FormatError):
    """A local path holds nothing a format recognises (``fastload.open`` then looks for a source to pack)."""


def local_segments(path: Path, manifest: Manifest) -> list:
    """The segments of a local dataset: one per shard file, or the LMDB environment."""
    return format_of(manifest).segments(path, manifest)


def verify(path: Path, manifest: Manifest, progress: Any = None) -> list[str]:
    """Check every byte of a local dataset against its manifest (shards: size, checksum, structure; LMDB:
    every chunk's digest and record). One message per problem; empty when the dataset is sound.
    ``progress(samples)`` is called as parts of the dataset are checked (for a progress bar)."""
    return format_of(manifest).verify(path, manifest, progress)


def describe_storage(path: Path, manifest: Manifest) -> list[str]:
    """What ``fastload inspect`` prints about the files of a local dataset: the shards with their sizes and
    checksums, or the LMDB environment's size."""
    return format_of(manifest).describe(path, manifest)


def verified_what(manifest: Manifest) -> str:
    """What ``verify`` checked, for its OK line."""
    return format_of(manifest).verified(manifest)


class Located:
    """A batch's samples by segment: ``seg_ids``/``local`` per position, ``groups``, the opened ``segs``."""

    __slots__ = ("_region_of", "groups", "local", "seg_ids", "segs")

    def __init__(self, seg_ids: np.ndarray, local: np.ndarray, groups: list, segs: dict):
        self.seg_ids, self.local, self.groups, self.segs = seg_ids, local, groups, segs
        self._region_of = None

    def __len__(self) -> int:
        return len(self.local)

    @property
    def region_of(self) -> np.ndarray:
        """Position -> index into ``groups`` (built on first use, shared by the batch's columns)."""
        if self._region_of is None:
            self._region_of = np.zeros(len(self.local), np.int64)
            for k, (_, pos) in enumerate(self.groups[1:], 1):
                self._region_of[pos] = k
        return self._region_of


class PackedReader:
    """One per opened dataset (``Dataset.reader``); see the module docstring."""

    def __init__(self, segments: list, path: Path | str):
        self.segments = segments
        self.starts = np.concatenate([[0], np.cumsum([s.count for s in segments], dtype=np.int64)])
        self.path = path
        self._row_bytes: dict[str, int] = {}
        self._one_group: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # n -> (zeros, arange), read-only

    def _whole_batch(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``(zeros(n), arange(n))``, read-only and kept per batch size: a batch in one segment needs them as its
        segment ids, its region numbers and its one group's positions, for every batch, made once
        instead of per batch. A few sizes at most: the batch size and a last, shorter batch."""
        got = self._one_group.get(n)
        if got is None:
            if len(self._one_group) >= 4:
                self._one_group.clear()
            got = (np.zeros(n, np.int64), np.arange(n, dtype=np.int64))
            for a in got:
                a.flags.writeable = False
            self._one_group[n] = got
        return got

    def sample(self, i: int) -> tuple[Any, int]:
        """(opened segment, index within it) of global sample ``i`` (``ds[i]``: one sample, no batch view)."""
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return self.segments[k].open(), i - int(self.starts[k])

    def close(self) -> None:
        """Unmap shards / close LMDB now; a segment reopens when next read."""
        for s in self.segments:
            s.close()

    @property
    def sizes(self) -> list[int]:
        """Samples per segment, in order."""
        return [s.count for s in self.segments]

    def locate(self, indices: np.ndarray) -> Located:
        """Group a batch's global sample ``indices`` by segment and open those segments."""
        if len(self.segments) == 1:  # common for small records: skip the shard lookup
            zeros, positions = self._whole_batch(len(indices))
            at = Located(zeros, indices, [(0, positions)], {0: self.segments[0].open()})
            at._region_of = zeros  # one group: every position's region is 0
            return at
        seg_ids = np.searchsorted(self.starts, indices, side="right") - 1
        local = indices - self.starts[seg_ids]
        present = np.flatnonzero(np.bincount(seg_ids, minlength=len(self.segments)))
        if len(present) > 1:
            groups = [(int(s), np.flatnonzero(seg_ids == s)) for s in present]
            return Located(seg_ids, local, groups, {s: self.segments[s].open() for s, _ in groups})
        zeros, positions = self._whole_batch(len(indices))
        s = int(present[0])
        at = Located(seg_ids, local, [(s, positions)], {s: self.segments[s].open()})
        at._region_of = zeros
        return at

    def locate_one(self, i: int) -> Located:
        """The batch view of the one global sample ``i`` (``ds[i]``), its segment opened."""
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return Located(
            np.array([k]),
            np.array([i - int(self.starts[k])]),
            [(k, np.zeros(1, np.int64))],
            {k: self.segments[k].open()},
        )

    def row(self, at: Located, field: str, column: str, position: int) -> np.ndarray:
        """One sample's row of a column (``values``, ``shape``, ``meta``): a view, not a copy."""
        return at.segs[int(at.seg_ids[position])].row(field, column, int(at.local[position]))

    def shard(self, seg_id: int) -> str | None:
        """The shard file a segment is, for messages (None for LMDB)."""
        return self.segments[int(seg_id)].label

    def take(self, at: Located, field: str, column: str) -> np.ndarray:
        """Rows of a small column (``meta``, ``shape``) for every position of the batch."""
        parts = [(pos, at.segs[s].take(field, column, at.local[pos])) for s, pos in at.groups]
        out = np.empty((len(at),) + parts[0][1].shape[1:], dtype=parts[0][1].dtype)
        for pos, rows in parts:
            out[pos] = rows
        return out

    def row_sources(self, at: Located, field: str) -> tuple[list, np.ndarray, np.ndarray, int]:
        """What the native gather needs to copy fixed-size column ``field``'s rows of the batch into a
        buffer: ``(regions, region, offset, row_bytes)`` for ``_C.gather_rows(pool, regions, region, offset,
        row_bytes, out)``. The caller owns the copy (and its thread pool); the reader only says where."""
        row_bytes = self._row_bytes.get(field)
        if row_bytes is None:
            f = self.segments[0].schema[field]
            row_bytes = self._row_bytes[field] = next(c.row_bytes for c in columns_of(f) if c.name == "values")
        if len(at.groups) == 1:  # the common case, kept short: it runs for every column of every batch
            whole = at.segs[at.groups[0][0]].column_region(field)
            if whole is not None:
                offset = at.local * row_bytes  # a new array: add the column's start in place
                offset += whole[1]
                return [whole[0]], at.region_of, offset, row_bytes
        whole = [at.segs[s].column_region(field) for s, _ in at.groups]
        if all(w is not None for w in whole):  # each segment holds the column in one piece (shards): vectorised
            base = np.array([start for _, start in whole], dtype=np.int64)
            region = at.region_of
            return [buf for buf, _ in whole], region, base[region] + at.local * row_bytes, row_bytes
        regions: list = []
        region = np.empty(len(at), dtype=np.int64)
        offset = np.empty(len(at), dtype=np.int64)
        for s, pos in at.groups:
            got, r, o = at.segs[s].row_sources(field, at.local[pos], row_bytes)
            region[pos] = len(regions) + (0 if r is None else r)
            offset[pos] = o
            regions.extend(got)
        return regions, region, offset, row_bytes

    def blob_sources(self, at: Located, field: str) -> tuple[list, np.ndarray, np.ndarray, np.ndarray]:
        """Where each sample's value of blob ``field`` lies, for the native calls: ``(regions, region,
        offset, length)``. A shard's values are byte ranges of its mapped file; an LMDB value is its own
        region."""
        n = len(at)
        region = np.empty(n, dtype=np.int64)
        offset = np.empty(n, dtype=np.int64)
        length = np.empty(n, dtype=np.int64)
        regions: list = []
        for s, pos in at.groups:
            got, r, o, ln = at.segs[s].blob_sources(field, at.local[pos])
            region[pos] = len(regions) + (0 if r is None else r)
            offset[pos] = o
            length[pos] = ln
            regions.extend(got)
        return regions, region, offset, length

    def image_sources(self, at: Located, field: str) -> tuple[np.ndarray, list, np.ndarray, np.ndarray, np.ndarray]:
        """Everything the image decoders read of image field ``field`` for the batch, in one call (data, not
        callbacks): ``(meta, regions, region, offset, length)``, ``meta`` the ``(n, 3)`` int64 stored height,
        width and encoding per position, the rest ``blob_sources``' (the decoders' ``ImageSources``)."""
        return (self.take(at, field, "meta").astype(np.int64),) + self.blob_sources(at, field)

    def blob(self, at: Located, field: str, position: int) -> Any:
        """One sample's value of blob ``field`` (a zero-copy view)."""
        return at.segs[int(at.seg_ids[position])].blob(field, int(at.local[position]))

    def first_dims(self, field: str) -> np.ndarray:
        """Every sample's first dimension of a variable-shape field, from the shape columns (no blobs read)."""
        parts = []
        for seg in self.segments:
            seg.open()
            parts.append(seg.take(field, "shape", np.arange(seg.count))[:, 0])
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def image_sizes(self, field: str) -> np.ndarray:
        """Every sample's stored (height, width) of image field ``field``, ``(n, 2)`` int64, from the ``meta``
        column (no blobs read): what ``fastload.open`` checks the transforms against."""
        parts = []
        for seg in self.segments:
            seg.open()
            parts.append(seg.take(field, "meta", np.arange(seg.count))[:, :2].astype(np.int64))
        return np.concatenate(parts) if parts else np.zeros((0, 2), np.int64)


def joined(parts: list, schema: Any, path: Path | str) -> PackedReader:
    """One reader over several datasets' segments, in order (``fastload.mix``: the global index space is their
    concatenation): ``parts`` is ``[(name, reader, fields)]``, ``fields`` mapping each of ``schema``'s field names
    to that dataset's stored name."""
    return PackedReader(
        [RenamedSegment(seg, name, schema, fields) for name, reader, fields in parts for seg in reader.segments], path
    )


class RenamedSegment:
    """A segment answering in other field names (``joined``): ``fields`` maps each name to the segment's stored
    one; ``label`` (for messages) starts with ``member``, the dataset the segment belongs to."""

    def __init__(self, inner: Any, member: str, schema: Any, fields: dict[str, str]):
        self.inner, self.member, self.schema, self.fields = inner, member, schema, fields
        self.count = inner.count

    def open(self) -> "RenamedSegment":
        self.inner.open()
        return self

    def close(self) -> None:
        self.inner.close()

    @property
    def label(self) -> str:
        inner = self.inner.label
        return f"{self.member}" if inner is None else f"{self.member}: {inner}"

    def row(self, field: str, col: str, i: int) -> np.ndarray:
        return self.inner.row(self.fields[field], col, i)

    def take(self, field: str, col: str, idx: np.ndarray) -> np.ndarray:
        return self.inner.take(self.fields[field], col, idx)

    def blob_sources(self, field: str, idx: np.ndarray) -> Any:
        return self.inner.blob_sources(self.fields[field], idx)

    def column_region(self, field: str) -> Any:
        return self.inner.column_region(self.fields[field])

    def row_sources(self, field: str, idx: np.ndarray, row_bytes: int) -> Any:
        return self.inner.row_sources(self.fields[field], idx, row_bytes)

    def blob(self, field: str, i: int) -> Any:
        return self.inner.blob(self.fields[field], i)
