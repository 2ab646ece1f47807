"""Variable-length fields batched to fixed shapes: ``Pad`` and ``Bucket`` (exported by
``fastload.transforms``).

Declared on an ndarray field whose first dimension varies (``shape=(None, ...)``), like image
transforms: ``fastload.open(path, transforms={"tokens": T.Pad(512)})``. The field's value then becomes
``(padded, length)``: ``ds[i]`` gives a tensor of shape ``(L, ...)`` and an int, and the loader gives
``[tensor (B, L, ...), lengths (B,) int64]``, which is what ``default_collate`` makes of such pairs.

- ``Pad(length)``: every sample padded (with ``value``) to ``length``; a longer sample is an error
  unless ``truncate=True``. Every batch has the same shape.
- ``Bucket(boundaries)``: a sample goes to the smallest boundary that holds it, and the loader builds
  each batch from one bucket only (``order`` shuffles within buckets and then the batches), so every
  batch is padded to its bucket's boundary: a handful of fixed shapes, far less padding than one
  global maximum.

Output buffers are allocated once, for the largest boundary; a batch is a contiguous view of them.
"""

from __future__ import annotations

import numpy as np

from ._schema import Field


class _Sequence:
    value: float
    truncate: bool

    def _check_common(self, value, truncate) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"value={value!r} should be a number")
        if not isinstance(truncate, bool):
            raise ValueError(f"truncate={truncate!r} should be a bool")
        self.value, self.truncate = value, truncate

    @property
    def max_length(self) -> int:
        raise NotImplementedError

    def bounds(self, lengths: np.ndarray) -> np.ndarray:
        """Padded length of each sample (before truncation)."""
        raise NotImplementedError

    def check(self, lengths: np.ndarray, describe) -> None:
        """Raise ValueError naming the first sample longer than ``max_length`` (unless truncating)."""
        if self.truncate:
            return
        bad = np.flatnonzero(lengths > self.max_length)
        if bad.size:
            k = int(bad[0])
            raise ValueError(f"{describe(k)}: length {int(lengths[k])} exceeds {self!r}; pass truncate=True "
                             f"to cut longer samples")

    def field_check(self, field: Field) -> None:
        if field.kind != "ndarray" or field.fixed_size or field.shape[0] is not None or None in field.shape[1:]:
            raise ValueError(f"{type(self).__name__} applies to ndarray fields whose first dimension alone "
                             f"varies (shape (None, ...)); field '{field.name}' is {field!r}")


class Pad(_Sequence):
    """Pad (or with ``truncate=True`` cut) the first dimension to ``length``."""

    def __init__(self, length: int, value: float = 0, truncate: bool = False):
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            raise ValueError(f"length={length!r} should be a positive int")
        self.length = length
        self._check_common(value, truncate)

    @property
    def max_length(self) -> int:
        return self.length

    def bounds(self, lengths: np.ndarray) -> np.ndarray:
        return np.full(len(lengths), self.length, dtype=np.int64)

    def __repr__(self) -> str:
        return f"Pad(length={self.length}, value={self.value}, truncate={self.truncate})"


class Bucket(_Sequence):
    """Pad each sample to the smallest of ``boundaries`` that holds it; batches stay within a bucket."""

    def __init__(self, boundaries, value: float = 0, truncate: bool = False):
        b = list(boundaries) if not isinstance(boundaries, (str, bytes)) else None
        if not b or any(not isinstance(x, int) or isinstance(x, bool) or x < 1 for x in b) or b != sorted(set(b)):
            raise ValueError(f"boundaries={boundaries!r} should be increasing positive ints, e.g. [64, 128, 256]")
        self.boundaries = tuple(b)
        self._check_common(value, truncate)

    @property
    def max_length(self) -> int:
        return self.boundaries[-1]

    def bucket_ids(self, lengths: np.ndarray) -> np.ndarray:
        ids = np.searchsorted(np.array(self.boundaries), lengths, side="left")
        return np.minimum(ids, len(self.boundaries) - 1)  # too long: last bucket (truncated or refused)

    def bounds(self, lengths: np.ndarray) -> np.ndarray:
        return np.array(self.boundaries, dtype=np.int64)[self.bucket_ids(lengths)]

    def __repr__(self) -> str:
        return f"Bucket(boundaries={list(self.boundaries)}, value={self.value}, truncate={self.truncate})"


def is_sequence_transform(t) -> bool:
    return isinstance(t, _Sequence)


def scatter_rows(out: np.ndarray, rows: np.ndarray, lengths: np.ndarray, starts: np.ndarray,
                 slots: np.ndarray) -> None:
    """Copy variable-length rows into ``out`` (n, bound, ...) without a per-sample Python loop.

    Sample j's rows ``rows[starts[j] : starts[j] + lengths[j]]`` (lengths already cut to the bound)
    go to ``out[slots[j], :lengths[j]]``. ``rows`` is the source viewed as (total_rows, ...).
    """
    total = int(lengths.sum())
    if total == 0:
        return
    bound = out.shape[1]
    before = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    pos = np.arange(total, dtype=np.int64)
    src = np.repeat(starts.astype(np.int64) - before, lengths) + pos
    dst = np.repeat(slots.astype(np.int64) * bound - before, lengths) + pos
    out.reshape((out.shape[0] * bound,) + out.shape[2:])[dst] = rows[src]
