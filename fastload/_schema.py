"""Schema: the named, typed fields every sample of a packed dataset has.

A schema is plain data (it round-trips through JSON in the manifest) and knows nothing of storage.
Field kinds (each one codec in ``fields/``, which also holds its dtype/shape rules):

===========  ===============================================================================
``image``    an RGB picture; stored as JPEG bytes or raw uint8 HxWx3 (see ``--image-mode``)
``int``      a signed 64-bit integer
``float``    a 64-bit float
``ndarray``  a numeric array with a fixed dtype; ``shape`` is fixed, or has ``None`` for
             dimensions that vary per sample (the number of dimensions is always fixed)
``bytes``    an opaque byte string
``str``      a unicode string (stored as UTF-8)
``mask``     a segmentation mask: (H, W) uint8 class ids, stored as an 8-bit grayscale PNG; follows its
             image's geometry (nearest, fill 255) and skips pixel operations
===========  ===============================================================================
"""

from __future__ import annotations

import keyword
import numbers
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ._errors import SchemaError
from .fields import codec_of
from .fields._codec import as_array, is_pil_image
from .fields.array import normalize_dtype


@dataclass(frozen=True)
class Field:
    """One named field of a sample. Use the constructors ``Field.image(name)`` and friends."""

    name: str
    kind: str
    dtype: str | None = None
    shape: tuple[int | None, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier() or keyword.iskeyword(self.name):
            raise SchemaError(f"field name {self.name!r} must be a Python identifier")
        dtype, shape = codec_of(self).normalize(self)  # the kind's own rules (fields/)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "shape", shape)

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def image(cls, name: str) -> "Field":
        return cls(name, "image")

    @classmethod
    def mask(cls, name: str) -> "Field":
        return cls(name, "mask")

    @classmethod
    def int(cls, name: str) -> "Field":
        return cls(name, "int")

    @classmethod
    def float(cls, name: str) -> "Field":
        return cls(name, "float")

    @classmethod
    def ndarray(cls, name: str, dtype: Any, shape: Sequence[int | None]) -> "Field":
        return cls(name, "ndarray", dtype, tuple(shape))

    @classmethod
    def bytes(cls, name: str) -> "Field":
        return cls(name, "bytes")

    @classmethod
    def str(cls, name: str) -> "Field":
        return cls(name, "str")

    # -- properties ---------------------------------------------------------------------------
    @property
    def fixed_size(self) -> bool:
        """True when every sample of this field has the same byte size (stored column-wise)."""
        return codec_of(self).fixed_size(self)

    @property
    def np_dtype(self) -> np.dtype:
        """The dtype of the stored values of a fixed-size field (int64, float64 or the array's)."""
        dt = codec_of(self).np_dtype(self)
        if dt is None:
            raise SchemaError(f"field '{self.name}' of kind {self.kind} has no fixed dtype")
        return dt

    def to_json(self) -> dict:
        d: dict[str, Any] = {"name": self.name, "kind": self.kind}
        d.update(codec_of(self).to_json(self))
        return d

    @classmethod
    def from_json(cls, d: Any) -> "Field":
        if not isinstance(d, Mapping):
            raise SchemaError(f"a field must be a JSON object, got {type(d).__name__}")
        unknown = set(d) - {"name", "kind", "dtype", "shape"}
        if unknown:
            raise SchemaError(f"field {d.get('name')!r}: unknown keys {sorted(unknown)}")
        shape = d.get("shape")
        if shape is not None and not isinstance(shape, list):
            raise SchemaError(f"field {d.get('name')!r}: shape must be a list, got {shape!r}")
        return cls(d.get("name"), d.get("kind"), d.get("dtype"), None if shape is None else tuple(shape))

    def __repr__(self) -> str:
        return codec_of(self).repr(self)


class Schema:
    """An ordered collection of uniquely named fields."""

    def __init__(self, fields: Iterable[Field]):
        self.fields: tuple[Field, ...] = tuple(fields)
        if not self.fields:
            raise SchemaError("a schema needs at least one field")
        for f in self.fields:
            if not isinstance(f, Field):
                raise SchemaError(f"schema entries must be Field objects, got {f!r}")
        names = [f.name for f in self.fields]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise SchemaError(f"duplicate field names in schema: {dup}")
        self._by_name = {f.name: f for f in self.fields}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def __getitem__(self, name: str) -> Field:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no field {name!r}; the schema has {list(self.names)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self):
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.fields == other.fields

    def __repr__(self) -> str:
        return "Schema([" + ", ".join(repr(f) for f in self.fields) + "])"

    def to_json(self) -> list:
        return [f.to_json() for f in self.fields]

    @classmethod
    def from_json(cls, data: Any) -> "Schema":
        if not isinstance(data, list):
            raise SchemaError(f"schema must be a JSON list of fields, got {type(data).__name__}")
        return cls(Field.from_json(d) for d in data)


# -- inference ----------------------------------------------------------------------------------


def infer_kind(value: Any) -> tuple[str, str | None, tuple | None]:
    """Return (kind, dtype, shape) for one value, or raise SchemaError naming the type."""
    if is_pil_image(value):
        return "image", None, None
    if isinstance(value, (bool, np.bool_)):
        return "int", None, None
    if isinstance(value, (numbers.Integral, np.integer)):
        return "int", None, None
    if isinstance(value, (numbers.Real, np.floating)):
        return "float", None, None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes", None, None
    if isinstance(value, str):
        return "str", None, None
    arr = as_array(value)
    if arr is not None:
        if arr.ndim == 0:
            return ("float" if arr.dtype.kind == "f" else "int"), None, None
        return "ndarray", normalize_dtype(arr.dtype), tuple(arr.shape)
    raise SchemaError(
        f"cannot store a value of type {type(value).__name__}; supported: PIL images, numbers, "
        f"numpy arrays, torch tensors, bytes, str (or give an explicit schema)"
    )


def default_names(values: Sequence[Any]) -> list[str]:
    """Names for the fields of a tuple sample: ``(image, label)`` for an (image, int) pair,
    like torchvision datasets, else ``f0, f1, ...``."""
    if len(values) == 2 and is_pil_image(values[0]) and infer_kind(values[1])[0] == "int":
        return ["image", "label"]
    return [f"f{i}" for i in range(len(values))]


def infer_schema(samples: Sequence[Any], overrides: Mapping[str, Field] | None = None) -> tuple[Schema, bool]:
    """Infer a schema from a few samples (tuples or dicts). Returns (schema, samples_are_dicts).

    An ndarray whose shape differs between the given samples gets ``None`` in those dimensions.
    ``overrides`` replaces the inferred field of the same name.
    """
    if not samples:
        raise SchemaError("cannot infer a schema from an empty source")
    first = samples[0]
    as_dict = isinstance(first, Mapping)
    if as_dict:
        names = [str(k) for k in first.keys()]
    elif isinstance(first, (tuple, list)):
        names = default_names(first)
    else:
        raise SchemaError(f"samples must be tuples or dicts, got {type(first).__name__}")
    overrides = dict(overrides or {})
    fields = []
    for pos, name in enumerate(names):
        if name in overrides:
            fields.append(overrides.pop(name))
            continue
        kinds = set()
        dtypes = set()
        shapes = []
        for i, s in enumerate(samples):
            vals = list(s.values()) if as_dict else list(s)
            if len(vals) != len(names):
                raise SchemaError(f"sample {i} has {len(vals)} fields, sample 0 has {len(names)}")
            kind, dtype, shape = infer_kind(vals[pos])
            kinds.add(kind)
            dtypes.add(dtype)
            shapes.append(shape)
        if kinds == {"int", "float"}:
            kinds = {"float"}
        if len(kinds) != 1:
            raise SchemaError(f"field '{name}' has mixed kinds {sorted(kinds)} across samples")
        kind = kinds.pop()
        if kind == "ndarray":
            if len(dtypes) != 1:
                raise SchemaError(f"field '{name}' has mixed dtypes {sorted(dtypes)}; give an explicit schema")
            ndims = {len(s) for s in shapes}
            if len(ndims) != 1:
                raise SchemaError(f"field '{name}' has arrays of different ndim {sorted(ndims)}")
            shape = tuple(d if all(s[j] == d for s in shapes) else None for j, d in enumerate(shapes[0]))
            fields.append(Field(name, "ndarray", dtypes.pop(), shape))
        else:
            fields.append(Field(name, kind))
    if overrides:
        raise SchemaError(f"schema overrides name unknown fields {sorted(overrides)}; fields are {names}")
    return Schema(fields), as_dict
