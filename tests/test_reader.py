"""formats/reader.py: one reader interface over shards and LMDB, and the batch path reading only through it."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from corrupt_common import Samples

import fastload
from fastload import _C, Field

ROOT = Path(__file__).resolve().parent.parent / "fastload"
# The modules one batch crosses between the packed files and the caller: they read only through the reader.
BATCH_PATH = ["_batcher.py", "_images.py", "_loader.py", "fast/chain.py", "fast/order.py", "fast/fill.py", "fast/producer.py", "fast/collate.py", "fast/position.py", "fast/readahead.py", "_prefetch.py", "_ring.py", "_workers.py", "_worker_proc.py"]
# The formats modules that code outside formats/ may import; every other one (shards, lmdb, _cache) is a
# format's own business, reached only through these.
BOUNDARY = {
    "fastload.formats.reader": "reading: PackedReader, and read_manifest/local_segments/verify that dispatch by what is on disk",
    "fastload.formats.sinks": "writing: the pack's writers, sink_for choosing the format, the destination's resume state",
    "fastload.formats._layout": "the logical layout every format stores (columns per field kind, image encodings)",
    "fastload.formats._manifest": "the manifest document (both formats), its atomic write, fsync_dir",
    "fastload.formats.remote": "storage, not a format: URLs, fsspec, the cached-remote dataset and its read plan",
    "fastload.formats.upload": "storage, not a format: a pack staged locally and uploaded to a URL",
}


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


FORMAT_FILES = ("data.mdb", "lock.mdb", ".fls")  # the files of one format: LMDB's environment, a shard


def _imported(path: Path, node: ast.AST) -> list[str]:
    """The absolute module names an import statement in ``path`` (under fastload/) names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    package = ["fastload", *path.parent.relative_to(ROOT).parts]
    base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else [])) \
        if node.level else node.module
    return [f"{base}.{a.name}" if base == "fastload.formats" else base for a in node.names]  # `from .formats import lmdb`


def _boundary_breaches(path: Path, allowed: set[str], text: str | None = None) -> list[str]:
    """Imports of a formats module outside ``allowed``, reads of a segment list's private fields, and
    names of a segment class in ``path`` (or ``text`` as if it were there), as ``file:line what``."""
    name = path.relative_to(ROOT)
    found = []
    for node in ast.walk(ast.parse(path.read_text() if text is None else text)):
        if isinstance(node, ast.Attribute) and node.attr in ("_segments", "_starts"):
            found.append(f"{name}:{node.lineno} reads {node.attr}")
        names = [node.id] if isinstance(node, ast.Name) else [node.attr] if isinstance(node, ast.Attribute) else \
            [a.asname or a.name for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
        found += [f"{name}:{node.lineno} names {n}" for n in names if n.split(".")[-1].endswith("Segment")]
        found += [f"{name}:{node.lineno} imports {m}" for m in _imported(path, node)
                  if m.startswith("fastload.formats.") and m not in allowed]
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and any(
                f in node.value for f in FORMAT_FILES):  # a format's file by name: `dst / "data.mdb"`
            found.append(f"{name}:{node.lineno} names the file {node.value!r}")
    return found


def test_nothing_outside_formats_knows_which_format_it_has():
    """Every module outside formats/ reaches the packed files only through the boundary modules."""
    modules = [p for p in sorted(ROOT.rglob("*.py")) if "formats" not in p.relative_to(ROOT).parts]
    assert len(modules) > 40 and ROOT / "cli.py" in modules and ROOT / "decoders" / "hybrid.py" in modules
    assert [b for p in modules for b in _boundary_breaches(p, set(BOUNDARY))] == []


@pytest.mark.parametrize("line", ["from .formats.shards import fsync_dir", "from .formats import lmdb as lmdb_format",
                                  "from ..formats.lmdb import verify_lmdb", "import fastload.formats.shards",
                                  "x = ds._segments", "from .formats.shards import ShardSegment",
                                  "size = (dst / 'data.mdb').stat().st_size"])
def test_the_boundary_check_catches_each_breach(line):
    probe = ROOT / "decoders" / "probe.py" if line.startswith("from ..") else ROOT / "probe.py"
    assert _boundary_breaches(probe, set(BOUNDARY), line)
    assert not _boundary_breaches(probe, set(BOUNDARY), "from .formats.reader import PackedReader")


def test_the_batch_path_reads_packed_files_only_through_the_reader():
    """No module a batch crosses reads a segment's private fields or names a segment class."""
    for name in BATCH_PATH:
        assert _boundary_breaches(ROOT / name, {"fastload.formats._layout", "fastload.formats.reader"}) == []
