"""fields/number.py: int and float fields, one fixed-size column each, at every stage."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
from fastload import Field, SchemaError
from fastload.fields import Column, codec_of
from fastload.fields.number import FLOAT, INT

from .conftest import batches


def test_layout_one_column_no_blob():
    assert INT.columns(Field.int("x")) == (Column("values", np.dtype("<i8"), ()),)
    assert FLOAT.columns(Field.float("x")) == (Column("values", np.dtype("<f8"), ()),)
    for f in (Field.int("x"), Field.float("y")):
        assert f.fixed_size and not codec_of(f).has_blob(f) and codec_of(f).expected_blob_length(f, {}) is None
    assert Field.int("x").np_dtype == np.dtype("<i8") and Field.float("x").np_dtype == np.dtype("<f8")
    assert Field.int("x").to_json() == {"name": "x", "kind": "int"} and repr(Field.float("y")) == "Field.float('y')"


def test_encode_accepts_numbers_and_one_element_arrays_and_names_what_it_refuses():
    f, g = Field.int("x"), Field.float("y")
    assert INT.encode(f, np.array([7], dtype=np.int32), None) == ((7,), None)
    assert INT.encode(f, True, None) == ((1,), None)
    assert FLOAT.encode(g, torch.tensor(2), None) == ((2.0,), None)
    with pytest.raises(SchemaError, match="integer 9223372036854775808 does not fit in 64 bits"):
        INT.encode(f, 1 << 63, None)
    with pytest.raises(SchemaError, match=r"expected an integer, got an array of shape \(2,\) dtype int64"):
        INT.encode(f, np.array([1, 2]), None)
    with pytest.raises(SchemaError, match="expected a float, got bool True"):
        FLOAT.encode(g, True, None)
    with pytest.raises(SchemaError, match="dtype/shape only apply to ndarray fields"):
        Field("x", "int", "<i8", ())


def test_ds_i_gives_python_numbers_a_batch_tensors(pack_samples):
    samples = [{"n": i - 3, "x": i / 4} for i in range(7)]
    ds = fastload.open(pack_samples(samples))
    assert ds[0] == (-3, 0.0) and type(ds[0][0]) is int and type(ds[6][1]) is float
    got = batches(ds, 4)
    assert got[0][0].dtype == torch.int64 and got[0][1].dtype == torch.float64
    assert torch.cat([b[0] for b in got]).tolist() == [i - 3 for i in range(7)]
    assert torch.cat([b[1] for b in got]).tolist() == [i / 4 for i in range(7)]
    items = ds.__getitems__([5, 1])
    assert items == [(2, 1.25), (-2, 0.25)] and type(items[0][0]) is int
