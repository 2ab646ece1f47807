"""``ndarray`` fields: a numeric array with a fixed dtype and number of dimensions.

Fixed shape: one column ``values`` (dtype, shape), gathered by the native row copy. Variable shape (``None``
dimensions): a ``shape`` column (int64, ndim) and the array's bytes (C order) as the blob; batched only
through a Pad/Bucket transform (``_transforms/sequences.py``), whose batches this module fills (``SequencePart``);
PackSequences batches are the batcher's (``fast/packing.py`` plans them, ``gather_pieces`` copies them).
"""

from __future__ import annotations

import numbers
from typing import Any, Callable

import numpy as np
import torch

from .._errors import DecodeError, SchemaError, where
from .._native import native
from ._codec import Codec, Column, FixedPart, NotFastPath, Part, as_array, exact_or_bad, torch_dtype

# Numeric dtypes an ndarray field may have (numpy kind + size); always stored little-endian.
_ALLOWED_DTYPES = {"b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8"}
MAX_NDIM = 8


def dtype_key(dt: np.dtype) -> str:
    return f"{dt.kind}{dt.itemsize}"


def normalize_dtype(dtype: Any) -> str:
    """Return the little-endian numpy dtype string for ``dtype`` ('<f4', '|u1', ...)."""
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise SchemaError(f"dtype {dtype!r} is not a numpy dtype") from e
    if dtype_key(dt) not in _ALLOWED_DTYPES:
        raise SchemaError(
            f"dtype {dt} is not supported for ndarray fields; expected one of "
            f"bool, int8..int64, uint8..uint64, float16..float64"
        )
    return dt.newbyteorder("<").str


class ArrayCodec(Codec):
    kind = "ndarray"

    # -- schema ---------------------------------------------------------------------------------
    def normalize(self, field: Any) -> tuple[str, tuple]:
        if field.dtype is None or field.shape is None:
            raise SchemaError(f"field '{field.name}': ndarray fields need a dtype and a shape")
        dtype = normalize_dtype(field.dtype)
        shape = tuple(field.shape)
        if len(shape) > MAX_NDIM:
            raise SchemaError(f"field '{field.name}': {len(shape)} dimensions, at most {MAX_NDIM}")
        for d in shape:
            if d is not None and (not isinstance(d, numbers.Integral) or isinstance(d, bool) or d < 0):
                raise SchemaError(f"field '{field.name}': shape {shape} must hold non-negative ints or None")
        return dtype, tuple(None if d is None else int(d) for d in shape)

    def fixed_size(self, field: Any) -> bool:
        return None not in field.shape

    def np_dtype(self, field: Any) -> np.dtype:
        return np.dtype(field.dtype)

    def to_json(self, field: Any) -> dict:
        return {"dtype": field.dtype, "shape": list(field.shape)}

    def repr(self, field: Any) -> str:
        return f"Field.ndarray({field.name!r}, {field.dtype!r}, {field.shape})"

    def describe(self, field: Any) -> str:
        return f" {field.dtype} {list(field.shape)}"

    # -- layout ---------------------------------------------------------------------------------
    def columns(self, field: Any) -> tuple[Column, ...]:
        if self.fixed_size(field):
            return (Column("values", np.dtype(field.dtype), tuple(field.shape)),)
        return (Column("shape", np.dtype("<i8"), (len(field.shape),)),)

    def expected_blob_length(self, field: Any, columns: dict) -> np.ndarray | None:
        if self.fixed_size(field):
            return None
        shape = columns["shape"]
        if shape.size and shape.min() < 0:
            return np.full(len(shape), -2, dtype=np.int64)  # negative dims can never match
        return exact_or_bad(shape, np.dtype(field.dtype).itemsize)

    def check_columns(self, field: Any, columns: dict, first: int = 0) -> str | None:
        if self.fixed_size(field):
            return None
        shape = columns["shape"]
        for j, d in enumerate(field.shape):
            if d is not None:
                bad = np.nonzero(shape[:, j] != d)[0]
                if bad.size:
                    return (
                        f"sample {first + int(bad[0])}: dimension {j} is {int(shape[bad[0], j])}, "
                        f"the schema fixes it to {d}"
                    )
        bad = np.nonzero((shape < 0).any(axis=1))[0] if shape.size else np.array([], dtype=np.int64)
        if bad.size:
            return f"sample {first + int(bad[0])}: negative array shape {shape[bad[0]].tolist()}"
        return None

    # -- pack -----------------------------------------------------------------------------------
    def encode(self, field: Any, value: Any, opts: Any) -> tuple[tuple, bytes | None]:
        arr = as_array(value)
        if arr is None:
            arr = np.asarray(value)
        dt = np.dtype(field.dtype)
        if arr.dtype != dt:
            if not np.can_cast(arr.dtype, dt, "safe"):
                raise SchemaError(f"array of dtype {arr.dtype} cannot be stored as {dt} without loss")
            arr = arr.astype(dt)
        if arr.ndim != len(field.shape) or any(d is not None and d != a for d, a in zip(field.shape, arr.shape)):
            want = tuple("*" if d is None else d for d in field.shape)
            raise SchemaError(
                f"array of shape {arr.shape} does not match the schema's shape {want} "
                f"(give an explicit schema with None for dimensions that vary)"
            )
        if self.fixed_size(field):
            return (arr,), None
        return (np.array(arr.shape, dtype="<i8"),), np.ascontiguousarray(arr, dtype=dt.newbyteorder("<")).tobytes()

    # -- ds[i] ----------------------------------------------------------------------------------
    def read(self, field: Any, reader: Any, at: Any, ctx: Any) -> Any:
        if self.fixed_size(field):
            return torch.from_numpy(np.array(reader.row(at, field.name, "values", 0)))
        shape = tuple(int(d) for d in reader.row(at, field.name, "shape", 0))
        arr = np.frombuffer(reader.blob(at, field.name, 0), dtype=field.dtype).reshape(shape)
        seq = ctx.padding.get(field.name)
        if seq is None:
            return torch.from_numpy(arr.copy())
        seq.check(np.array(shape[:1]), lambda k: "the sample")
        bound = int(seq.bounds(np.array(shape[:1]))[0])
        n = min(shape[0], bound)
        out = np.full((bound,) + shape[1:], seq.value, dtype=arr.dtype)
        out[:n] = arr[:n]
        return torch.from_numpy(out), n

    # -- batches --------------------------------------------------------------------------------
    def batch(self, field: Any, dataset: Any) -> Part:
        if self.fixed_size(field):
            return FixedPart(field, self.columns(field)[0])
        seq = dataset.sequences.get(field.name)
        if seq is None:
            raise NotFastPath(
                f"ndarray field '{field.name}' has a variable shape {field.shape} and no Pad/Bucket "
                f"transform to batch it to a fixed shape"
            )
        return SequencePart(field, seq, dataset.path)


def gather_pieces(
    reader: Any,
    path: Any,
    field: Any,
    out: np.ndarray,
    at: Any,
    indices: np.ndarray,
    skip: np.ndarray,
    nbytes: np.ndarray,
    dst: np.ndarray,
    pool: Any,
) -> None:
    """One native copy of variable-length pieces: piece j is ``nbytes[j]`` bytes of batch position j's
    value of ``field`` (``at`` locates them), from byte ``skip[j]`` of that value, to byte ``dst[j]`` of ``out``
    (padding is the caller's). A piece past the end of its value (an LMDB record shorter than its recorded
    length; shard offsets are checked at open) is refused naming the sample (``path``: the dataset's)."""
    regions, region, offset, length = reader.blob_sources(at, field.name)
    short = np.flatnonzero(skip + nbytes > length)
    if short.size:
        p = int(short[0])
        raise DecodeError(
            f"{where(path, None, int(indices[p]), field.name)}: the value is "
            f"{int(length[p])} bytes, its recorded length needs {int(skip[p] + nbytes[p])}"
        )
    native().gather_pieces(
        pool, regions, region, offset + skip, nbytes.astype(np.int64, copy=False), dst.astype(np.int64, copy=False), out
    )


class SequencePart(Part):
    """A variable-length array padded (Pad) or bucketed (Bucket) to the batch's bound: the flat buffer holds
    ``(n, bound, *rest)``, ``name:len`` each sample's kept length; the fill's object is the bound."""

    def __init__(self, field: Any, seq: Any, path: Any):
        super().__init__(field)
        self.seq, self.path = seq, path
        self.rest = tuple(field.shape[1:])
        self.rest_items = int(np.prod(self.rest, dtype=np.int64))
        self.row_bytes = np.dtype(field.dtype).itemsize * self.rest_items

    def buffers(self, batcher: Any, b: int, alloc: Callable) -> dict:
        size = b * self.seq.max_length * self.rest_items
        return {
            self.name: alloc((size,), torch_dtype(np.dtype(self.field.dtype))),
            self.name + ":len": alloc((b,), torch.int64),
        }

    def _view(self, flat: Any, n: int, bound: int) -> Any:
        shape = (n, bound) + self.rest
        return flat[: int(np.prod(shape, dtype=np.int64))].reshape(shape)

    def fill(self, batcher: Any, slot: Any, at: Any, indices: np.ndarray, rng: Any, pool: Any, failed: dict) -> int:
        """Pad/bucket the field into the slot; returns the batch's padded length."""
        seq, reader, n = self.seq, batcher.reader, len(at)
        lengths = reader.take(at, self.name, "shape")[:, 0].astype(np.int64)

        def describe(k: int) -> str:
            return where(self.path, reader.shard(at.seg_ids[k]), int(indices[k]), self.name)

        try:
            seq.check(lengths, describe)
        except ValueError as e:
            raise DecodeError(str(e)) from None
        bound = int(seq.bounds(lengths).max()) if n else seq.max_length
        cut = np.minimum(lengths, bound)
        out = self._view(slot.arrays[self.name], n, bound)
        out[...] = seq.value
        gather_pieces(
            reader,
            self.path,
            self.field,
            out,
            at,
            indices,
            np.zeros(n, np.int64),
            cut * self.row_bytes,
            np.arange(n, dtype=np.int64) * (bound * self.row_bytes),
            pool,
        )
        slot.arrays[self.name + ":len"][:n] = cut
        return bound

    def replace(self, batcher: Any, slot: Any, n: int, obj: Any, bad: list, sources: list) -> None:
        for arr in (self._view(slot.arrays[self.name], n, obj), slot.arrays[self.name + ":len"]):
            for k, src in zip(bad, sources):
                arr[k] = arr[src]

    def collate(self, tensors: dict, n: int, obj: Any, tensor_transforms: bool, cpu_output: Callable) -> Any:
        return [self._view(tensors[self.name], n, obj), tensors[self.name + ":len"][:n]]

    def split(self, value: Any, n: int) -> list:
        # [padded (n, bound, ...), lengths]: each sample padded to its own bound, as ds[i]
        padded, lengths = value
        cut = lengths.numpy()
        return [(padded[k, :b], int(c)) for k, (b, c) in enumerate(zip(self.seq.bounds(cut).tolist(), cut))]


NDARRAY = ArrayCodec()
