import numpy as np
import pytest
import torch

import fastload
from fastload import Field, Schema, SchemaError
from fastload._schema import infer_schema


def test_field_constructors_and_json_round_trip():
    s = Schema([Field.image("image"), Field.int("label"), Field.float("w"),
                Field.ndarray("x", np.float32, (3, None)), Field.bytes("raw"), Field.str("caption")])
    assert Schema.from_json(s.to_json()) == s
    assert s["x"].dtype == "<f4" and s["x"].shape == (3, None) and not s["x"].fixed_size
    assert s["label"].fixed_size and not s["image"].fixed_size
    assert s.names == ("image", "label", "w", "x", "raw", "caption")


@pytest.mark.parametrize("bad", [
    lambda: Field("1abc", "int"),
    lambda: Field("x", "complex"),
    lambda: Field.ndarray("x", object, (3,)),
    lambda: Field.ndarray("x", np.float32, (-1,)),
    lambda: Field("x", "int", dtype="<i8"),
    lambda: Schema([Field.int("a"), Field.float("a")]),
    lambda: Schema([]),
])
def test_invalid_schemas_are_refused(bad):
    with pytest.raises(SchemaError):
        bad()


def test_infer_schema_from_tuples_and_dicts():
    from PIL import Image

    img = Image.new("RGB", (4, 4))
    schema, as_dict = infer_schema([(img, 1), (img, 2)])
    assert not as_dict and schema.names == ("image", "label")
    assert [f.kind for f in schema] == ["image", "int"]

    samples = [{"tokens": np.arange(n, dtype=np.int32), "y": 0.5, "t": torch.zeros(2, 2), "s": "a", "b": b"x"}
               for n in (3, 5)]
    schema, as_dict = infer_schema(samples)
    assert as_dict
    assert schema["tokens"] == Field.ndarray("tokens", np.int32, (None,))
    assert schema["t"] == Field.ndarray("t", np.float32, (2, 2))
    assert [schema[n].kind for n in ("y", "s", "b")] == ["float", "str", "bytes"]


def test_infer_schema_override_and_errors():
    schema, _ = infer_schema([(np.zeros(3), 1)], overrides={"f0": Field.ndarray("f0", np.float64, (None,))})
    assert schema["f0"].shape == (None,)
    with pytest.raises(SchemaError, match="unknown fields"):
        infer_schema([(1, 2)], overrides={"nope": Field.int("nope")})
    with pytest.raises(SchemaError, match="mixed kinds"):
        infer_schema([(1,), ("a",)])
    with pytest.raises(SchemaError, match="cannot store"):
        infer_schema([(object(),)])


def test_public_api_is_deliberate():
    assert sorted(fastload.__all__) == sorted([
        "DataLoader", "Dataset", "DecodeError", "FastPathWarning", "FastloadError", "Field", "FormatError",
        "PackSummary", "RemoteError", "Schema", "SchemaError", "SourceError", "VersionError", "__version__", "doctor",
        "merge", "mix", "open", "pack", "to_device", "transforms",
    ])
    for name in fastload.__all__:
        assert hasattr(fastload, name)
