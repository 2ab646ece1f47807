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

This module declares the transforms (and checks them against a field) and ``PackJob``, the packed batch
that the order plans and the batcher fills (``cu_seqlens``: its segment boundaries); which samples form a
batch is the order's business: ``fast.packing.BucketOrder`` keeps a batch within a bucket,
``fast.packing.PackedOrder`` cuts the token stream into ``PackJob`` batches. Both sides import it from here,
below them: the chain (``fast/``) drives the batcher and the batcher imports nothing of the chain.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._schema import Field, Schema


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
            raise ValueError(
                f"{describe(k)}: length {int(lengths[k])} exceeds {self!r}; {self._way_out(int(lengths[k]))}"
            )

    def check_all(self, lengths: np.ndarray, field: str) -> None:
        """Every sample's length (first dimension) of ``field`` at once, before any batch is read: a sample
        longer than ``max_length`` would otherwise stop an epoch at whichever batch holds it. Raises
        ValueError with how many are too long, the longest, an example and the way out."""
        if self.truncate or not len(lengths):
            return
        bad = np.flatnonzero(lengths > self.max_length)
        if bad.size:
            longest = int(np.argmax(lengths))
            examples = ", ".join(str(int(k)) for k in bad[:3])
            raise ValueError(
                f"field '{field}': {bad.size} of {len(lengths)} samples are longer than {self!r} "
                f"allows ({self.max_length}): the longest is sample {longest}, of length "
                f"{int(lengths[longest])}; too long are e.g. samples {examples}. "
                f"P{self._way_out(int(lengths[longest]))[1:]}"
            )

    def _way_out(self, longest: int | None = None) -> str:
        """What to do about too long samples: truncate, or make room (for ``longest`` when it is known)."""
        room = self._make_room(longest) if longest is not None else "allow longer samples"
        return f"pass truncate=True ({self._with_truncate()}) to cut such samples to {self.max_length}, or {room}"

    def _with_truncate(self) -> str:
        raise NotImplementedError

    def _make_room(self, longest: int) -> str:
        raise NotImplementedError

    def field_check(self, field: Field) -> None:
        if field.kind != "ndarray" or field.fixed_size or field.shape[0] is not None or None in field.shape[1:]:
            raise ValueError(
                f"{type(self).__name__} applies to ndarray fields whose first dimension alone "
                f"varies (shape (None, ...)); field '{field.name}' is {field!r}"
            )


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

    def _with_truncate(self) -> str:
        return f"T.Pad({self.length}, truncate=True)"

    def _make_room(self, longest: int) -> str:
        return f"pad to a length of at least {longest}"


class Bucket(_Sequence):
    """Pad each sample to the smallest of ``boundaries`` that holds it; batches stay within a bucket."""

    def __init__(self, boundaries, value: float = 0, truncate: bool = False):
        b = (
            boundaries.tolist()
            if isinstance(boundaries, np.ndarray)
            else list(boundaries)
            if isinstance(boundaries, (list, tuple, range))
            else None
        )
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

    def _with_truncate(self) -> str:
        return f"T.Bucket({list(self.boundaries)}, truncate=True)"

    def _make_room(self, longest: int) -> str:
        return f"add a boundary of at least {longest}"


def is_sequence_transform(t) -> bool:
    return isinstance(t, _Sequence)


class PackSequences(_Sequence):
    """Concatenate token sequences into ``batch_size`` rows of ``row_length`` (pretraining-style packing).

    The loader then yields ``{field: (B, row_length) tensor, "cu_seqlens": int32 (K+1,),
    "sample_ids": int64 (K,)}``: the K segments (a sample's tokens within one row; a sample that
    crosses a row boundary becomes two segments) in row-major order, as variable-length attention
    kernels expect, and the dataset index of each segment (to look up other fields). Samples follow
    the loader's order; the stream of this rank is cut into batches of ``batch_size * row_length``
    tokens, so batch ``b`` depends only on (seed, epoch, rank, world size) and resumes exactly. Every
    rank gets the same number of batches (the smallest any rank's stream fills); without
    ``drop_last`` the last batch is padded with ``value`` and the padding is in no segment.
    ``ds[i]`` returns a sample's tokens unpacked (and its other fields).

    A packed batch carries no other per-sample field (a ``label``, a ``text``): name each one in
    ``drop_fields`` to say the batches leave it out (``ds[sample_ids[k]]`` still has it). A dataset with a
    field that is neither packed nor dropped is refused when opened, so nothing disappears unnoticed.
    """

    def __init__(self, row_length: int, value: float = 0, drop_fields: Sequence[str] = ()):
        if not isinstance(row_length, int) or isinstance(row_length, bool) or row_length < 1:
            raise ValueError(f"row_length={row_length!r} should be a positive int")
        self.row_length = row_length
        self._check_common(value, False)
        if not isinstance(drop_fields, (list, tuple)) or not all(isinstance(n, str) for n in drop_fields):
            raise TypeError(f"drop_fields={drop_fields!r} should be a list of field names, e.g. drop_fields=['label']")
        self.drop_fields = tuple(drop_fields)

    @property
    def max_length(self) -> int:
        return self.row_length

    def check(self, lengths, describe) -> None:  # any length packs
        return

    def field_check(self, field: Field) -> None:
        if field.kind != "ndarray" or len(field.shape) != 1 or field.shape[0] is not None:
            raise ValueError(
                f"PackSequences applies to 1-d ndarray fields of variable length (shape (None,)); "
                f"field '{field.name}' is {field!r}"
            )

    def schema_check(self, name: str, schema: Schema) -> None:
        """Every field besides the packed one ``name`` must be named in ``drop_fields``, and only those."""
        others = [f.name for f in schema if f.name != name]
        unknown = [n for n in self.drop_fields if n not in others]
        if unknown:
            raise ValueError(
                f"{self!r} on field '{name}': drop_fields names {unknown}, which are not other fields "
                f"of this dataset; its other fields are {others}"
            )
        kept = [n for n in others if n not in self.drop_fields]
        if kept:
            raise ValueError(
                f"PackSequences on field '{name}': the dataset also has the per-sample field(s) {kept}, which a "
                f"packed batch cannot carry (it holds '{name}' rows, 'cu_seqlens' and 'sample_ids'; "
                f"ds[sample_ids[k]] gives segment k's sample with all its fields). Pass "
                f"T.PackSequences({self.row_length}, drop_fields={list(self.drop_fields) + kept}) to leave them "
                f"out of the batches"
            )

    def __repr__(self) -> str:
        drop = f", drop_fields={list(self.drop_fields)}" if self.drop_fields else ""
        return f"PackSequences(row_length={self.row_length}, value={self.value}{drop})"


class PackJob:
    """One packed batch (``fast.packing.PackedOrder`` plans it): the pieces of samples that fill its token range,
    in stream order; the batcher copies the pieces (``_C.gather_pieces``) and writes ``cu_seqlens``."""

    __slots__ = ("samples", "starts", "lengths", "dst", "real")

    def __init__(self, samples, starts, lengths, dst, real):
        self.samples = samples  # int64 dataset index of each piece
        self.starts = starts  # int64 first token of the piece within its sample
        self.lengths = lengths  # int64 tokens in the piece
        self.dst = dst  # int64 position of the piece in the flattened batch
        self.real = real  # tokens of real data in the batch (the rest is padding)

    def __len__(self) -> int:
        return len(self.samples)


def cu_seqlens(job: PackJob, row_length: int) -> np.ndarray:
    """Segment boundaries in the flattened batch: piece starts and row starts, up to the real tokens."""
    cuts = np.concatenate([job.dst, np.arange(0, job.real, row_length), [job.real]])
    return np.unique(cuts).astype(np.int32)
