"""``int`` and ``float`` fields: one value per sample in a fixed-size column (int64, float64).

``ds[i]`` gives a Python int/float; a batch a 1-D tensor (``default_collate``'s), ``__getitems__`` Python
numbers again.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._errors import SchemaError
from ._codec import Codec, Column, FixedPart, as_array

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


class NumberPart(FixedPart):
    def split(self, value: Any, n: int) -> list:
        return value.tolist()


class NumberCodec(Codec):
    """A scalar: ``dtype`` its stored type, ``convert`` turns a checked source value into a Python one."""

    def __init__(self, kind: str, dtype: str, convert: type):
        self.kind, self.dtype, self.convert = kind, np.dtype(dtype), convert

    def fixed_size(self, field: Any) -> bool:
        return True

    def np_dtype(self, field: Any) -> np.dtype:
        return self.dtype

    def columns(self, field: Any) -> tuple[Column, ...]:
        return (Column("values", self.dtype, ()),)

    def read(self, field: Any, reader: Any, at: Any, ctx: Any) -> Any:
        return self.convert(reader.row(at, field.name, "values", 0))

    def batch(self, field: Any, dataset: Any) -> NumberPart:
        return NumberPart(field, self.columns(field)[0])


class IntCodec(NumberCodec):
    def __init__(self) -> None:
        super().__init__("int", "<i8", int)

    def encode(self, field: Any, value: Any, opts: Any) -> tuple[tuple, None]:
        arr = as_array(value)
        if arr is not None:
            if arr.size != 1 or arr.dtype.kind not in "biu":
                raise SchemaError(f"expected an integer, got an array of shape {arr.shape} dtype {arr.dtype}")
            value = arr.reshape(()).item()
        if isinstance(value, (bool, np.bool_)):
            value = int(value)
        if not isinstance(value, (int, np.integer)):
            raise SchemaError(f"expected an integer, got {type(value).__name__} {value!r}")
        value = int(value)
        if not INT64_MIN <= value <= INT64_MAX:
            raise SchemaError(f"integer {value} does not fit in 64 bits")
        return (value,), None


class FloatCodec(NumberCodec):
    def __init__(self) -> None:
        super().__init__("float", "<f8", float)

    def encode(self, field: Any, value: Any, opts: Any) -> tuple[tuple, None]:
        arr = as_array(value)
        if arr is not None:
            if arr.size != 1 or arr.dtype.kind not in "biuf":
                raise SchemaError(f"expected a number, got an array of shape {arr.shape} dtype {arr.dtype}")
            value = arr.reshape(()).item()
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise SchemaError(f"expected a float, got {type(value).__name__} {value!r}")
        return (float(value),), None


INT = IntCodec()
FLOAT = FloatCodec()
