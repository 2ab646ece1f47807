"""fields/array.py: ndarray fields, fixed shape (a column) or variable (shape column + blob, Pad/Bucket)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
from fastload import Field, SchemaError
from fastload.fields import Column, NotFastPath
from fastload.fields.array import NDARRAY, SequencePart
from fastload.transforms import Pad

from .conftest import batches


def test_schema_rules():
    f = Field.ndarray("a", ">f4", [2, None])
    assert (f.dtype, f.shape) == ("<f4", (2, None)) and f.to_json() == {"name": "a", "kind": "ndarray", "dtype": "<f4",
                                                                           "shape": [2, None]}
    assert repr(f) == "Field.ndarray('a', '<f4', (2, None))" and NDARRAY.describe(f) == " <f4 [2, None]"
    with pytest.raises(SchemaError, match="field 'a': ndarray fields need a dtype and a shape"):
        Field("a", "ndarray")
    with pytest.raises(SchemaError, match="dtype complex64 is not supported for ndarray fields"):
        Field.ndarray("a", np.complex64, (2,))
    with pytest.raises(SchemaError, match="field 'a': 9 dimensions, at most 8"):
        Field.ndarray("a", "u1", (1,) * 9)
    with pytest.raises(SchemaError, match=r"field 'a': shape \(-1,\) must hold non-negative ints or None"):
        Field.ndarray("a", "u1", (-1,))


def test_layout_and_column_checks():
    fixed, var = Field.ndarray("a", "<i2", (2, 3)), Field.ndarray("v", "<f4", (None, 2))
    assert NDARRAY.columns(fixed) == (Column("values", np.dtype("<i2"), (2, 3)),) and not NDARRAY.has_blob(fixed)
    assert NDARRAY.columns(var) == (Column("shape", np.dtype("<i8"), (2,)),) and NDARRAY.has_blob(var)
    shape = np.array([[3, 2], [0, 2]])
    assert NDARRAY.expected_blob_length(var, {"shape": shape}).tolist() == [24, 0]
    assert NDARRAY.check_columns(var, {"shape": shape}) is None
    assert NDARRAY.check_columns(var, {"shape": np.array([[1, 2], [1, 5]])}, first=10) == \
        "sample 11: dimension 1 is 5, the schema fixes it to 2"
    assert NDARRAY.check_columns(var, {"shape": np.array([[-1, 2]])}) == "sample 0: negative array shape [-1, 2]"
    assert NDARRAY.expected_blob_length(var, {"shape": np.array([[-1, 2]])}).tolist() == [-2]
    assert NDARRAY.expected_blob_length(var, {"shape": np.array([[1 << 62, 2]])}).tolist() == [-2]  # no wrap-around


def test_encode_casts_safely_and_names_shape_mismatches():
    var = Field.ndarray("v", "<f4", (None, 2))
    (shape,), blob = NDARRAY.encode(var, np.ones((3, 2), dtype=np.int16), None)
    assert shape.tolist() == [3, 2] and np.frombuffer(blob, "<f4").tolist() == [1.0] * 6
    with pytest.raises(SchemaError, match="array of dtype float64 cannot be stored as float32 without loss"):
        NDARRAY.encode(var, np.ones((3, 2)), None)
    with pytest.raises(SchemaError, match=r"array of shape \(3, 3\) does not match the schema's shape \('\*', 2\)"):
        NDARRAY.encode(var, np.ones((3, 3), dtype=np.float32), None)


def test_fixed_and_padded_arrays_through_ds_i_and_the_loader(pack_samples):
    samples = [{"a": np.full((2, 3), i, np.int16), "v": np.arange(i * 2, dtype=np.float32).reshape(i, 2)}
               for i in range(1, 6)]
    path = pack_samples(samples, schema={"v": Field.ndarray("v", "<f4", (None, 2))})
    ds = fastload.open(path, transforms={"v": Pad(4, value=-1, truncate=True)})
    a, (v, n) = ds[1]
    assert a.tolist() == [[2] * 3] * 2 and n == 2 and v.tolist() == [[0, 1], [2, 3], [-1, -1], [-1, -1]]
    (a, (padded, lengths)), = batches(ds, 5)
    assert a.shape == (5, 2, 3) and padded.shape == (5, 4, 2) and lengths.tolist() == [1, 2, 3, 4, 4]
    assert padded[4].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]] and padded[0, 1].tolist() == [-1, -1]
    items = ds.__getitems__([4, 0])
    assert items[0][1][1] == 4 and torch.equal(items[1][1][0], ds[0][1][0]) and torch.equal(items[1][0], ds[0][0])


def test_a_variable_array_without_pad_has_no_batch_part():
    f = Field.ndarray("v", "<f4", (None,))

    class Plain:
        sequences: dict = {}
    with pytest.raises(NotFastPath, match=r"ndarray field 'v' has a variable shape \(None,\) and no Pad/Bucket"):
        NDARRAY.batch(f, Plain())

    class Padded:
        sequences = {"v": Pad(3)}
        path = "ds"
    assert isinstance(NDARRAY.batch(f, Padded()), SequencePart)
