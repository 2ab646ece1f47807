"""formats/reader.py: one reader interface over shards and LMDB, and the batch path reading only through it."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from .corrupt_common import Samples

import fastload
from fastload import _C, Field

ROOT = Path(__file__).resolve().parents[2] / "fastload"
# The modules one batch crosses between the packed files and the caller: they read only through the reader.
BATCH_PATH = ["_fill/batcher.py", "_fill/images.py", "_front/loader.py", "fast/chain.py", "fast/order.py", "fast/fill.py", "fast/producer.py", "fast/collate.py", "fast/position.py", "fast/readahead.py", "fast/device.py", "_ring.py", "_generic/workers.py", "_generic/worker_proc.py"]
# The formats modules that code outside formats/ may import; every other one (shards, lmdb, _cache) is a
# format's own business, reached only through these.
BOUNDARY = {
    "fastload.formats.reader": "reading: PackedReader, and read_manifest/local_segments/verify that dispatch by what is on disk",
    "fastload.formats.registry": "the Format objects, one per on-disk layout (writers included): the packer asks them",
    "fastload.formats._layout": "the logical layout every format stores (columns per field kind, image encodings)",
    "fastload.formats._manifest": "the manifest document (both formats), its atomic write, fsync_dir",
    "fastload.formats.remote": "storage, not a format: URLs, fsspec, the cached-remote dataset and its read plan",
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
    regions, region, offset, row_bytes = reader.row_sources(at, "tokens")  # data, not a callback
    assert row_bytes == 8 * 4 and len(regions) == (len(at.groups) if fmt == "shards" else len(set(idx // 1024)))
    _C.gather_rows(_C.Pool(0), regions, region, offset, row_bytes, out)
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


@pytest.mark.parametrize("fmt", ["shards", "lmdb"])
def test_a_batch_in_one_segment_reuses_its_position_arrays(datasets, fmt):
    """The tiny-record path (issue 32): a batch that lies in one segment (LMDB's one environment, or one shard)
    gets its segment ids, region numbers and positions from arrays made once per batch size, read-only, not
    allocated per batch; the rows it gathers are the same."""
    ds, arrays = datasets[0][fmt], datasets[1]
    reader = ds.reader
    first = int(reader.starts[1]) if fmt == "shards" else len(ds)  # the first segment's samples
    rng = np.random.default_rng(2)
    ats = [reader.locate(rng.permutation(first)[:40].astype(np.int64)) for _ in range(2)]
    for at in ats:
        assert len(at.groups) == 1 and not at.region_of.any() and not at.seg_ids.any()
        assert np.array_equal(at.groups[0][1], np.arange(40))
        for a in (at.region_of, at.groups[0][1]):
            assert not a.flags.writeable  # shared by every batch of this size: nobody may write into it
    assert ats[0].region_of is ats[1].region_of and ats[0].groups[0][1] is ats[1].groups[0][1]
    assert len(reader.locate(np.arange(7, dtype=np.int64)).region_of) == 7  # another size, its own arrays
    for at in ats:
        idx = at.local + (0 if fmt == "lmdb" else int(reader.starts[at.groups[0][0]]))
        out = np.empty((40, 8), np.int32)
        _C.gather_rows(_C.Pool(0), *reader.row_sources(at, "tokens"), out)
        assert np.array_equal(out, arrays["tokens"][idx])
    if fmt == "shards":  # a batch inside the second shard: its segment ids say so, its one region is 0
        at = reader.locate(np.arange(first, first + 5, dtype=np.int64))
        assert at.seg_ids.tolist() == [1] * 5 and at.region_of.tolist() == [0] * 5
        assert at.local.tolist() == [0, 1, 2, 3, 4]
        out = np.empty((5, 8), np.int32)
        _C.gather_rows(_C.Pool(0), *reader.row_sources(at, "tokens"), out)
        assert np.array_equal(out, arrays["tokens"][first:first + 5])


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


def test_ds_getitem_and_fastload_bench_read_through_the_reader(packed_images, monkeypatch):
    """``ds[i]`` and ``fastload bench`` take rows and blobs from ``PackedReader``, never from a segment."""
    from fastload._tools import benchcmd as _benchcmd
    from fastload.formats.reader import PackedReader

    calls = {"row": 0, "blob": 0}
    for name in calls:
        real = getattr(PackedReader, name)

        def counted(*a, _real=real, _name=name):
            calls[_name] += 1
            return _real(*a)
        monkeypatch.setattr(PackedReader, name, counted)
    ds = fastload.open(packed_images)
    ds[3]
    assert calls["row"] >= 2 and calls["blob"] == 1  # the image's meta and the label; the image's bytes
    calls.update(row=0, blob=0)
    _benchcmd.run(packed_images, batch_size=4, preset="val", size=32, max_workers=0, seconds=0.05)
    assert calls["blob"] == 4  # the 'read bytes' timing of one batch


def test_lmdb_rows_come_from_every_chunk_they_lie_in(tmp_path, monkeypatch):
    """LMDB answers row_sources with each chunk a batch touches as a region: the native gather then copies
    exactly what ``take`` reads, across chunk boundaries, in any order."""
    monkeypatch.setattr("fastload.formats.lmdb.DEFAULT_ROWS_PER_CHUNK", 16)
    tokens = np.random.default_rng(3).integers(0, 1 << 30, (100, 5), dtype=np.int64)
    fastload.pack({"tokens": tokens, "label": np.arange(100)}, tmp_path / "ds", format="lmdb", workers=0)
    reader = fastload.open(tmp_path / "ds").reader
    idx = np.random.default_rng(4).permutation(100)[:40]
    at = reader.locate(idx)
    regions, region, offset, row_bytes = reader.row_sources(at, "tokens")
    assert len(regions) == len(set((idx // 16).tolist())) > 1 and row_bytes == 5 * 8
    out = np.zeros((40, 5), np.int64)
    _C.gather_rows(_C.Pool(2), regions, region, offset, row_bytes, out)
    assert np.array_equal(out, tokens[idx])
