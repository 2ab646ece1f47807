"""What fuzzing found, kept as tests: each was a crash, a foreign exception or an unbounded claim before
its fix (fastload/formats/, fastload/pack/_encode.py). Reads that used to crash run in a forked child."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

import fastload
from fastload import FormatError, SourceError
from fastload import transforms as T
from fastload.formats import lmdb as lmdb_format
from forking import in_child


@pytest.fixture
def images(tmp_path):
    rng = np.random.default_rng(0)
    samples = [{"image": rng.integers(0, 256, (6 + i, 5, 3), dtype=np.uint8), "label": i} for i in range(8)]
    fastload.pack(samples, tmp_path / "shards", workers=0, schema={"image": fastload.Field.image("image")})
    fastload.pack(samples, tmp_path / "lmdb", format="lmdb", workers=0,
                  schema={"image": fastload.Field.image("image")})
    return tmp_path


def _epoch(path):
    ds = fastload.open(path, transforms={"image": [T.RandomResizedCrop(4)]})
    try:
        for _ in fastload.DataLoader(ds, batch_size=4, num_workers=2, on_error="skip"):
            pass
    finally:
        ds.close()


def test_zero_sized_image_is_a_format_error(images):
    # was: a bare ValueError from transform planning in the loader's thread, naming no dataset or sample
    shard = images / "shards" / "shard-00000.fls"
    data = bytearray(shard.read_bytes())
    meta_offset = struct.unpack_from("<Q", data, 64)[0]  # the image meta column is the first section
    struct.pack_into("<I", data, meta_offset + 12 * 3 + 4, 0)  # sample 3: width 0
    shard.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=r"shard-00000.fls.*sample 3: raw image size 9x0 is impossible"):
        _epoch(images / "shards")


def test_an_empty_image_is_refused_when_packing(tmp_path):
    with pytest.raises(SourceError, match=r"\[1\].*image is empty \(height 0, width 4\)"):
        fastload.pack([{"image": np.zeros((4, 4, 3), np.uint8)}, {"image": np.zeros((0, 4, 3), np.uint8)}],
                      tmp_path / "out", workers=0, schema={"image": fastload.Field.image("image")})


def test_truncated_lmdb_is_a_format_error_not_sigbus(images):
    # was: SIGBUS inside liblmdb (the file is mapped, pages past its end fault) for most truncations
    data = images / "lmdb" / "data.mdb"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])

    def read():
        with pytest.raises(FormatError, match="truncated"):
            fastload.open(images / "lmdb")

    assert in_child(read) == 0


def test_lmdb_detected_corruption_is_a_format_error(images):
    # was: lmdb.CorruptedError / lmdb.PageNotFoundError escaping from ds[i]
    ds = fastload.open(images / "lmdb")
    seg = ds.reader.segments[0].open()

    class Damaged:
        def get(self, key):
            raise lmdb_format._lmdb().CorruptedError("mdb_get: MDB_CORRUPTED: Located page was wrong type")

        def abort(self):
            pass

    real = seg._txn
    seg._txn = Damaged()
    with pytest.raises(FormatError, match=r"\(lmdb\): samples 0\.\.7.*MDB_CORRUPTED"):
        ds[2]
    assert seg._txn is not real and ds[2][1] == 2  # a fresh transaction: the other reads go on
    real.abort()
    ds.close()


def test_sample_count_is_bounded_by_the_bytes_on_disk(images):
    # was: a manifest claiming 2^40-byte rows made the loader size a batch from the claim before any
    # shard was checked (a RuntimeError from torch's allocator); counts bounded nothing
    doc = json.loads((images / "shards" / "manifest.json").read_text())
    doc["schema"].append({"name": "big", "kind": "ndarray", "dtype": "<f4", "shape": [1 << 18, 1 << 18]})
    (images / "shards" / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=r"shard-00000.fls.*8 samples.*need \d+ bytes"):
        fastload.open(images / "shards")
    lm = images / "lmdb"
    env = lmdb_format._lmdb().open(str(lm), map_size=1 << 30)
    with env.begin(write=True) as txn:
        m = json.loads(bytes(txn.get(lmdb_format.MANIFEST_KEY)))
        m["num_samples"] = 1 << 40
        txn.put(lmdb_format.MANIFEST_KEY, json.dumps(m).encode())
    env.close()
    with pytest.raises(FormatError, match=r"claims 1099511627776 samples.*data.mdb is \d+ bytes"):
        fastload.open(lm)


@pytest.mark.parametrize("dtype", [",f8", "<,f4", "(2,)f4", "f4,f4", "O", "U8", "V4", 4, ["f4"], {"names": []}])
def test_manifest_dtype_is_a_format_error(images, dtype):
    # was: numpy's dtype parser raising SyntaxError (it runs ast.literal_eval on '(2,)f4'-like strings)
    doc = json.loads((images / "shards" / "manifest.json").read_text())
    doc["schema"].append({"name": "x", "kind": "ndarray", "dtype": dtype, "shape": [1]})
    (images / "shards" / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError, match="bad schema"):
        fastload.open(images / "shards")
