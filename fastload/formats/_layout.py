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

Each field kind's codec (``fields/``) defines its columns, blob and checks; the functions below ask it.

An encoded sample is a list, one entry per field in schema order, of ``(column values, blob)``:
``column values`` is a tuple with one value per column, ``blob`` is bytes or None.
"""

from __future__ import annotations

import numpy as np

from .._schema import Field, Schema
from ..fields import Column, codec_of
from ..fields.image import IMAGE_ENCODINGS, IMAGE_JPEG, IMAGE_RAW  # noqa: F401  (the formats' and decoders' names)

FORMAT_VERSION = 1


def columns_of(field: Field) -> tuple[Column, ...]:
    return codec_of(field).columns(field)


def has_blob(field: Field) -> bool:
    return codec_of(field).has_blob(field)


def expected_blob_length(field: Field, columns: dict[str, np.ndarray]) -> np.ndarray | None:
    """Per-row blob length implied by the columns (raw images, variable arrays), -1 where free.

    ``columns`` maps column name to an array with one row per sample. Returns None when the field's
    blob length is unconstrained (JPEG, bytes, str).
    """
    return codec_of(field).expected_blob_length(field, columns)


def check_columns(field: Field, columns: dict[str, np.ndarray], first: int = 0) -> str | None:
    """Validate column contents that the format itself constrains. Returns a message or None.

    Row k is named ``sample first + k`` in the message (``first``: the dataset index of row 0).
    """
    return codec_of(field).check_columns(field, columns, first)


def min_bytes(schema: Schema, n: int) -> int:
    """Bytes that ``n`` samples of ``schema`` need at the least in any container: their fixed-size columns
    and blob offsets, and never less than a byte a sample, so that a sample count (and what is sized from it:
    orders, index arrays) is bounded by the bytes on disk. Exact integers: nothing wraps around."""
    row = sum(c.row_bytes for f in schema for c in columns_of(f))
    blobs = sum(1 for f in schema if has_blob(f))
    return n * max(row + 8 * blobs, 1) + (8 * blobs if n else 0)


def section_names(schema: Schema) -> list[tuple[str, str]]:
    """(field, part) for every section of a shard, in file order: columns, then offsets and data."""
    out: list[tuple[str, str]] = []
    for f in schema:
        out.extend((f.name, c.name) for c in columns_of(f))
        if has_blob(f):
            out.append((f.name, "offsets"))
            out.append((f.name, "data"))
    return out
