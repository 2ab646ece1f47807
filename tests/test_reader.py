"""formats/reader.py: one reader interface over shards and LMDB, and the batch path reading only through it."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload import Field, _C
from corrupt_common import Samples

ROOT = Path(__file__).resolve().parent.parent / "fastload"
# The modules one batch crosses between the packed files and the caller (issue 13 extends this to every
# module outside formats/ once the packer's writers and the manifest reader live in formats/).
BATCH_PATH = ["_batcher.py", "_images.py", "_loader.py", "_fastiter.py", "_prefetch.py", "_ring.py", "_workers.py"]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("reader")
    rng = np.random.default_rng(0)
    n = 300
    arrays = {"tokens": rng.integers(0, 1000, (n, 8), dtype=np.int32), "label": np.arange(n, dtype=np.int64),
              "blob": [rng.bytes(int(rng.integers(1, 40))) for _ in range(n)],
              "var": [rng.standard_normal((int(rng.integers(0, 5)), 2)).astype("<f4") for _ in range(n)]}
    samples = Samples({k: v[i] for k, v in arrays.items()} for i in range(n))
    schema = {"var": Field.ndarray("var", "<f4", (None, 2))}
    fastload.pack(samples, root / "shards", schema=schema, shard_size=4096, workers=0)  # several shards
    fastload.pack(samples, root / "lmdb", schema=schema, format="lmdb", workers=0)
    return {"shards": fastload.open(root / "shards", decode=False), "lmdb": fastload.open(root / "lmdb", decode=False)}, arrays


@pytest.mark.parametrize("fmt", ["shards", "lmdb"])
def test_the_reader_gives_the_same_rows_for_every_format(datasets, fmt):
    ds, arrays = datasets[0][fmt], datasets[1]
    reader = ds.reader
    assert sum(reader.sizes) == len(ds)
    idx = np.random.default_rng(1).permutation(len(ds))[:77]
    at = reader.locate(idx)
    assert len(at) == 77 and sorted(np.concatenate([p for _, p in at.groups]).tolist()) == list(range(77))
    out = np.empty((77, 8), np.int32)
    reader.gather_rows(at, "tokens", out, lambda regions, region, offset, rb, o: _C.gather_rows(
        _C.Pool(0), regions, region, offset, rb, o))
    assert np.array_equal(out, arrays["tokens"][idx])
    regions, region, offset, length = reader.blob_sources(at, "blob")
    got = [bytes(memoryview(regions[r])[o:o + n]) for r, o, n in zip(region, offset, length)]
    assert got == [arrays["blob"][i] for i in idx]
    assert [bytes(reader.blob(at, "blob", k)) for k in range(5)] == [arrays["blob"][i] for i in idx[:5]]
    assert np.array_equal(reader.first_dims("var"), [len(v) for v in arrays["var"]])
    names = {reader.shard(s) for s, _ in at.groups}
    assert (names == {None}) if fmt == "lmdb" else all(n and n.endswith(".fls") for n in names)
    if fmt == "shards":
        assert len(reader.sizes) > 1


def test_the_batch_path_reads_packed_files_only_through_the_reader():
    """No module a batch crosses reads a segment's private fields or names a segment class."""
    for name in BATCH_PATH:
        tree = ast.parse((ROOT / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("_segments", "_starts"), f"{name}:{node.lineno} reads {node.attr}"
            if isinstance(node, ast.Name):
                assert not node.id.endswith("Segment"), f"{name}:{node.lineno} names {node.id}"
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("formats"):
                assert node.module in ("formats._layout", "formats.reader"), \
                    f"{name}:{node.lineno} imports {node.module}"
