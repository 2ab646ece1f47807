"""``bytes`` and ``str`` fields: a blob per sample (str as UTF-8), no column.

``ds[i]`` and a batch give Python objects (a batch: a list, as ``default_collate`` leaves strings); a
stored str that is not UTF-8 is a bad sample (raised, or replaced with on_error='skip').
"""

from __future__ import annotations

from typing import Any

from .._errors import SchemaError
from ._codec import Codec, ObjectPart


def _utf8(blob: Any) -> str:
    return str(blob, "utf-8")


class BytesCodec(Codec):
    kind = "bytes"

    def encode(self, field: Any, value: Any, opts: Any) -> tuple[tuple, bytes]:
        if isinstance(value, str) or not isinstance(value, (bytes, bytearray, memoryview)):
            raise SchemaError(f"expected bytes, got {type(value).__name__}")
        return (), bytes(value)

    def read(self, field: Any, reader: Any, at: Any, ctx: Any) -> bytes:
        return bytes(reader.blob(at, field.name, 0))

    def batch(self, field: Any, dataset: Any) -> ObjectPart:
        return ObjectPart(field, bytes, b"")


class StrCodec(Codec):
    kind = "str"

    def encode(self, field: Any, value: Any, opts: Any) -> tuple[tuple, bytes]:
        if not isinstance(value, str):
            raise SchemaError(f"expected str, got {type(value).__name__}")
        try:
            return (), value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise SchemaError(f"string is not valid unicode ({e})") from None

    def read(self, field: Any, reader: Any, at: Any, ctx: Any) -> str:
        return _utf8(reader.blob(at, field.name, 0))

    def batch(self, field: Any, dataset: Any) -> ObjectPart:
        return ObjectPart(field, _utf8, "")


BYTES = BytesCodec()
STR = StrCodec()
