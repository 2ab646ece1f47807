"""fastload/sources/arrays.py: arrays, .npy and .npz as a source -- packed and read back in both formats, fields
named, and what they cannot store refused."""

from __future__ import annotations

import numpy as np
import pytest

import fastload
from fastload import Field, SourceError
from fastload.sources import ArraySource

from conftest import FORMATS


@pytest.mark.parametrize("fmt", FORMATS)
def test_arrays_npy_npz_round_trip(tmp_path, fmt):
    x = np.random.default_rng(0).random((50, 3, 4), dtype=np.float32)
    y = np.arange(50, dtype=np.int16)
    for src in ({"x": x, "y": y}, (x, y)):
        dst = tmp_path / f"d{len(list(tmp_path.iterdir()))}"
        fastload.pack(src, dst, format=fmt, shard_size="1K")
        ds = fastload.open(dst, as_dict=True)
        names = list(ds[0].keys())
        assert len(ds) == 50 and ds.schema[names[0]].shape == (3, 4)
        for i in (0, 17, 49):
            assert np.array_equal(ds[i][names[0]].numpy(), x[i]) and ds[i][names[1]] == int(y[i])
    np.save(tmp_path / "a.npy", x)
    np.savez(tmp_path / "b.npz", feats=x, labels=y)
    fastload.pack(tmp_path / "a.npy", tmp_path / "npy", format=fmt)
    fastload.pack(tmp_path / "b.npz", tmp_path / "npz", format=fmt)
    assert np.array_equal(fastload.open(tmp_path / "npy")[3][0].numpy(), x[3])
    assert fastload.open(tmp_path / "npz").schema.names == ("feats", "labels")


def test_array_sources_name_fields_and_refuse_what_they_cannot_store(tmp_path):
    x, y = np.zeros((5, 3), np.uint8), np.arange(5)
    assert ArraySource((x, y)).schema.names == ("x", "y")
    assert ArraySource((x, y, y)).schema.names == ("f0", "f1", "f2")
    src = ArraySource({"img": x, "w": np.ones(5, np.float16), "ok": np.ones(5, bool)})
    assert [(f.kind, f.shape) for f in src.schema] == [("ndarray", (3,)), ("float", None), ("int", None)]
    assert src.describe(2) == "arrays row 2" and len(src) == 5
    assert ArraySource(x).fingerprint() != ArraySource(x + 1).fingerprint()
    with pytest.raises(SourceError, match="array 'x' is a scalar"):
        ArraySource(np.float32(1))
    with pytest.raises(SourceError, match="array 's' has dtype <U1; only bool, integer and float arrays"):
        ArraySource({"s": np.array(list("abcde"))})
    with pytest.raises(SourceError, match=r"schema overrides name unknown arrays \['nope'\]"):
        ArraySource({"x": x}, schema={"nope": Field.int("nope")})
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    with pytest.raises(SourceError, match="cannot read numpy file .*bad.npy"):
        ArraySource(tmp_path / "bad.npy")
