"""The logical layout shared by every on-disk format.

Each field is split into fixed-size *columns* (one row per sample, gathered for a whole batch with one
numpy ``take``) and, for variable-size fields, one *blob* per sample (bytes addressed by offsets):

=======================  ==========================================  =====================
field                    columns (dtype, per-sample shape)           blob
=======================  ==========================================  =====================
int                      values ('<i8', ())                          -
float                    values ('<f8', ())                          -
ndarray, fixed shape     values (dtype, shape)                       -
ndarray, variable shape  shape ('<i8', (ndim,))                      the array's bytes (C order)
image                    meta ('<u4', (3,)): height, width, encoding JPEG bytes or raw HxWx3 uint8
bytes                    -                                           the bytes
str                      -                                           UTF-8 bytes
=======================  ==========================================  =====================

An encoded sample is a list, one entry per field in schema order, of ``(column values, blob)``:
``column values`` is a tuple with one value per column, ``blob`` is bytes or None.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._native import native
from .._schema import Field, Schema

# image encodings in the "meta" column: defined once, in the native core that decodes them (csrc/batch.h)
IMAGE_JPEG = int(native().IMAGE_JPEG)
IMAGE_RAW = int(native().IMAGE_RAW)
IMAGE_ENCODINGS = (IMAGE_JPEG, IMAGE_RAW)

FORMAT_VERSION = 1
MAX_JPEG_SIDE = 65535  # the JPEG format's own limit
MAX_RAW_SIDE = (1 << 31) - 1


class Column(NamedTuple):
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def row_items(self) -> int:
        return math.prod(self.shape)  # exact: a crafted schema's huge dims must not wrap around

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize * self.row_items


def columns_of(field: Field) -> tuple[Column, ...]:
    if field.kind in ("int", "float") or (field.kind == "ndarray" and field.fixed_size):
        return (Column("values", field.np_dtype, () if field.kind != "ndarray" else tuple(field.shape)),)
    if field.kind == "ndarray":
        return (Column("shape", np.dtype("<i8"), (len(field.shape),)),)
    if field.kind == "image":
        return (Column("meta", np.dtype("<u4"), (3,)),)
    return ()


def has_blob(field: Field) -> bool:
    return not field.fixed_size


def expected_blob_length(field: Field, columns: dict[str, np.ndarray]) -> np.ndarray | None:
    """Per-row blob length implied by the columns (raw images, variable arrays), -1 where free.

    ``columns`` maps column name to an array with one row per sample. Returns None when the field's
    blob length is unconstrained (JPEG, bytes, str).
    """
    if field.kind == "image":
        meta = columns["meta"].astype(np.int64)
        # h * w * 3 < 2**66 can overflow int64: flag such rows (-2, never matches) instead of wrapping
        return np.where(meta[:, 2] == IMAGE_RAW,
                        _exact_or_bad(meta[:, :2], 3), -1)
    if field.kind == "ndarray" and not field.fixed_size:
        shape = columns["shape"]
        if shape.size and shape.min() < 0:
            return np.full(len(shape), -2, dtype=np.int64)  # negative dims can never match
        return _exact_or_bad(shape, np.dtype(field.dtype).itemsize)
    return None


MAX_BLOB_BYTES = 1 << 62


def _exact_or_bad(dims: np.ndarray, itemsize: int) -> np.ndarray:
    """Row-wise ``prod(dims) * itemsize`` as int64, -2 where it exceeds ``MAX_BLOB_BYTES``.

    The int64 product of crafted dimensions can wrap around to a small number that matches the blob
    length (e.g. (2**62, 2) float32 -> 0 bytes); a float64 product, exact enough to detect that, guards it.
    Zero dimensions count as 1 in the guard: numpy refuses (0, 2**62) too.
    """
    if not dims.shape[1]:
        return np.full(len(dims), itemsize, dtype=np.int64)
    with np.errstate(over="ignore"):
        n = np.prod(dims.astype(np.int64), axis=1) * itemsize
    approx = np.prod(np.maximum(dims, 1).astype(np.float64), axis=1) * itemsize
    return np.where(approx > MAX_BLOB_BYTES, -2, n)


def check_columns(field: Field, columns: dict[str, np.ndarray], first: int = 0) -> str | None:
    """Validate column contents that the format itself constrains. Returns a message or None.

    Row k is named ``sample first + k`` in the message (``first``: the dataset index of row 0).
    """
    if field.kind == "image":
        meta = columns["meta"]
        bad = np.nonzero(~np.isin(meta[:, 2], IMAGE_ENCODINGS))[0]
        if bad.size:
            return f"sample {first + int(bad[0])}: image encoding {int(meta[bad[0], 2])} is not 0 (jpeg) or 1 (raw)"
        # no image is empty; a JPEG side fits 16 bits; the native core indexes pixels with int32
        limit = np.where(meta[:, 2] == IMAGE_JPEG, MAX_JPEG_SIDE, MAX_RAW_SIDE)
        bad = np.nonzero((meta[:, :2] == 0).any(axis=1) | (meta[:, :2] > limit[:, None]).any(axis=1))[0]
        if bad.size:
            h, w, enc = (int(v) for v in meta[bad[0]])
            kind = "JPEG" if enc == IMAGE_JPEG else "raw"
            return (f"sample {first + int(bad[0])}: {kind} image size {h}x{w} is impossible (each side must be "
                    f"1..{MAX_JPEG_SIDE if enc == IMAGE_JPEG else MAX_RAW_SIDE})")
    if field.kind == "ndarray" and not field.fixed_size:
        shape = columns["shape"]
        for j, d in enumerate(field.shape):
            if d is not None:
                bad = np.nonzero(shape[:, j] != d)[0]
                if bad.size:
                    return (f"sample {first + int(bad[0])}: dimension {j} is {int(shape[bad[0], j])}, "
                            f"the schema fixes it to {d}")
        bad = np.nonzero((shape < 0).any(axis=1))[0] if shape.size else np.array([], dtype=np.int64)
        if bad.size:
            return f"sample {first + int(bad[0])}: negative array shape {shape[bad[0]].tolist()}"
    return None


def min_bytes(schema: Schema, n: int) -> int:
    """Bytes that ``n`` samples of ``schema`` need at the least in any container: their fixed-size columns
    and blob offsets, and never less than a byte a sample, so that a sample count (and what is sized from it:
    orders, index arrays) is bounded by the bytes on disk. Exact integers: nothing wraps around."""
    row = sum(c.row_bytes for f in schema for c in columns_of(f))
    blobs = sum(1 for f in schema if has_blob(f))
    return n * max(row + 8 * blobs, 1) + (8 * blobs if n else 0)


def section_names(schema: Schema) -> list[tuple[str, str]]:
    """(field, part) for every section of a shard, in file order: columns, then offsets and data."""
    out = []
    for f in schema:
        out.extend((f.name, c.name) for c in columns_of(f))
        if has_blob(f):
            out.append((f.name, "offsets"))
            out.append((f.name, "data"))
    return out
