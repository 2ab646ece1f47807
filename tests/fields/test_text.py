"""fields/text.py: bytes and str fields, a blob each, read into Python objects."""

from __future__ import annotations

import numpy as np
import pytest

import fastload
from fastload import Field, SchemaError
from fastload.fields import ObjectPart
from fastload.fields.text import BYTES, STR

from .conftest import batches


def test_layout_blob_only():
    for codec, f in ((BYTES, Field.bytes("b")), (STR, Field.str("s"))):
        assert codec.columns(f) == () and codec.has_blob(f) and not f.fixed_size
        assert codec.check_columns(f, {}) is None and codec.expected_blob_length(f, {}) is None
    with pytest.raises(SchemaError, match="has no fixed dtype"):
        Field.str("s").np_dtype


def test_encode_refuses_the_other_kind():
    assert BYTES.encode(Field.bytes("b"), bytearray(b"ab"), None) == ((), b"ab")
    assert STR.encode(Field.str("s"), "é", None) == ((), "é".encode())
    with pytest.raises(SchemaError, match="expected bytes, got str"):
        BYTES.encode(Field.bytes("b"), "ab", None)
    with pytest.raises(SchemaError, match="expected str, got bytes"):
        STR.encode(Field.str("s"), b"ab", None)
    with pytest.raises(SchemaError, match="string is not valid unicode"):
        STR.encode(Field.str("s"), "\ud800", None)


def test_ds_i_and_batches_give_python_objects(pack_samples):
    samples = [{"b": bytes([i]) * i, "s": "é" * i} for i in range(6)]
    ds = fastload.open(pack_samples(samples), as_dict=True)
    assert ds[3] == {"b": b"\x03\x03\x03", "s": "ééé"}
    got = batches(ds, 4)
    assert got[0]["b"] == [b"", b"\x01", b"\x02\x02", b"\x03\x03\x03"] and got[1]["s"] == ["éééé", "ééééé"]
    assert ds.__getitems__([2, 0]) == [{"b": b"\x02\x02", "s": "éé"}, {"b": b"", "s": ""}]


class _Reader:
    def __init__(self, blobs):
        self.blobs = blobs

    def blob(self, at, name, k):
        return memoryview(self.blobs[k])


class _Batcher:
    def __init__(self, blobs):
        self.reader = _Reader(blobs)


def test_a_bad_utf8_sample_is_marked_failed_naming_the_field_and_replaced():
    part = STR.batch(Field.str("s"), None)
    assert isinstance(part, ObjectPart)
    failed: dict = {}
    got = part.fill(_Batcher([b"ok", b"\xff", b"yes"]), None, [0, 1, 2], np.arange(3), None, None, failed)
    assert got == ["ok", "", "yes"] and list(failed) == [1]
    assert failed[1].startswith("field 's': 'utf-8' codec can't decode byte 0xff")
    part.replace(None, None, 3, got, [1], [2])
    assert got == ["ok", "yes", "yes"]
