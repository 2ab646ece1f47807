"""Damaged and crafted manifests and LMDB environments, fuzzing, and round trips of every non-image
field kind in both formats. See test_corrupt_shards.py for the shard files themselves."""
from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastload
from fastload import DecodeError, FastloadError, Field, FormatError, VersionError
from fastload.cli import main as cli
from fastload.formats import _manifest as manifest_format
from fastload.formats import lmdb as lmdb_format
from fastload.formats._layout import FORMAT_VERSION, section_names
from fastload.formats._manifest import MANIFEST_NAME
from fastload.formats.shards import file_digest

U64_MAX = (1 << 64) - 1
TABLE = 64  # the section table starts right after the 64-byte header
FIELDS = {"var": Field.ndarray("var", "<f4", (None, 2))}  # the rest is inferred from the samples


from .corrupt_common import *  # noqa: F401,F403  (helpers; the fixtures are in conftest.py)
from .corrupt_common import _schema  # noqa: F401


# -- the manifest -------------------------------------------------------------------------------

def _set(path: str, value):
    """A manifest edit: set a dotted path ('shards.0.file') to value."""
    def fn(doc):
        keys = [int(k) if k.isdigit() else k for k in path.split(".")]
        target = doc
        for k in keys[:-1]:
            target = target[k]
        target[keys[-1]] = value
    return fn


def _dup_shard(doc):
    doc["shards"].append(dict(doc["shards"][0]))
    doc["num_samples"] += doc["shards"][0]["num_samples"]


MANIFEST_EDITS = {
    "format": (_set("format", "other"), "not a fastload manifest"),
    "empty object": (lambda d: d.clear(), "not a fastload manifest"),
    "version string": (_set("version", "1"), "version"),
    "version float": (_set("version", 1.0), "version"),
    "version bool": (_set("version", True), "version"),
    "version 0": (_set("version", 0), "version"),
    "layout": (_set("layout", "zip"), "layout"),
    "layout lmdb": (_set("layout", "lmdb"), "layout"),
    "schema not a list": (_set("schema", {"a": 1}), "schema"),
    "schema empty": (_set("schema", []), "schema"),
    "unknown kind": (_set("schema.0.kind", "complex"), "kind"),
    "unknown field key": (_set("schema.0.extra", 1), "unknown keys"),
    "bad field name": (_set("schema.0.name", "../x"), "identifier"),
    "duplicate field": (_set("schema.1.name", "label"), "duplicate"),
    "object dtype": (_set("schema.2.dtype", "|O"), "dtype"),
    "complex dtype": (_set("schema.2.dtype", "<c8"), "dtype"),
    "structured dtype": (_set("schema.2.dtype", [["a", "<f4"]]), "dtype"),
    "nonsense dtype": (_set("schema.2.dtype", "float99"), "dtype"),
    "negative dim": (_set("schema.2.shape", [-4]), "shape"),
    "float dim": (_set("schema.2.shape", [4.0]), "shape"),
    "string shape": (_set("schema.2.shape", "4"), "shape"),
    "huge dims": (_set("schema.2.shape", [1 << 40, 1 << 40]), "bytes per sample"),
    "wrapping dims": (_set("schema.2.shape", [1 << 62, 4]), "bytes per sample"),
    "huge fixed dim of a variable array": (_set("schema.3.shape", [None, 1 << 62]), "bytes per sample"),
    "too many dims": (_set("schema.2.shape", [1] * 9), "dimensions"),
    "negative count": (_set("num_samples", -1), "num_samples"),
    "string count": (_set("num_samples", "90"), "num_samples"),
    "float count": (_set("num_samples", 90.0), "num_samples"),
    "bool count": (_set("num_samples", True), "num_samples"),
    "huge count": (_set("num_samples", 1 << 70), "num_samples"),
    "counts do not sum": (_set("num_samples", 91), "num_samples says 91"),
    "shard count negative": (_set("shards.0.num_samples", -1), "num_samples"),
    "shard count huge": (_set("shards.0.num_samples", 1 << 64), "num_samples"),
    "shard bytes negative": (_set("shards.0.bytes", -1), "bytes"),
    "shard bytes string": (_set("shards.0.bytes", "4096"), "bytes"),
    "shards not a list": (_set("shards", {"a": 1}), "shards"),
    "shard not an object": (_set("shards.0", "shard-00000.fls"), "object"),
    "path traversal": (_set("shards.0.file", "../x.fls"), "shard-NNNNN.fls"),
    "path traversal to a shard name": (_set("shards.0.file", "../ds/shard-00000.fls"), "shard-NNNNN.fls"),
    "absolute path": (_set("shards.0.file", "/tmp/shard-00000.fls"), "shard-NNNNN.fls"),
    "subdirectory": (_set("shards.0.file", "x/shard-00000.fls"), "shard-NNNNN.fls"),
    "trailing newline": (_set("shards.0.file", "shard-00000.fls\n"), "shard-NNNNN.fls"),
    "unicode digits": (_set("shards.0.file", "shard-\u0661\u0662\u0663\u0664\u0665.fls"), "shard-NNNNN.fls"),
    "file not a string": (_set("shards.0.file", 0), "shard-NNNNN.fls"),
    "duplicated shard": (_dup_shard, "listed twice"),
    "checksum not hex": (_set("shards.0.xxh3_64", "zz" * 8), "xxh3_64"),
    "checksum missing": (lambda d: d["shards"][0].pop("xxh3_64"), "xxh3_64"),
    "metadata a list": (_set("metadata", []), "metadata"),
    "skipped an object": (_set("skipped", {}), "skipped"),
}


@pytest.mark.parametrize("case", list(MANIFEST_EDITS))
def test_bad_manifest(ds, case):
    edit, message = MANIFEST_EDITS[case]
    edit_manifest(ds, edit)
    with pytest.raises(FormatError) as info:
        fastload.open(ds)
    assert message in str(info.value) and str(ds) in str(info.value), str(info.value)
    result = verify(ds)
    assert result.exit_code == 2 and "error:" in result.output, result.output


@pytest.mark.parametrize("text", [b"", b"{", b"[]", b"\x00\xff\xfe garbage", b"[" * 200_000, b"{\"format\": NaN}",
                                  b"null", "{\"format\": \"fastload\", \"version\": 1e999}".encode(),
                                  b"{\"format\": \"fastload\", \"version\": " + b"9" * 5000 + b"}"])
def test_unparseable_manifest(ds, text):
    (ds / MANIFEST_NAME).write_bytes(text)
    with pytest.raises(FormatError, match="manifest|version"):
        fastload.open(ds)
    assert verify(ds).exit_code == 2


def test_oversized_manifest_is_refused_before_parsing(ds, monkeypatch):
    size = (ds / MANIFEST_NAME).stat().st_size
    monkeypatch.setattr(manifest_format, "MAX_MANIFEST_BYTES", size - 1)
    with pytest.raises(FormatError, match=f"manifest is {size} bytes, larger than the {size - 1} allowed"):
        fastload.open(ds)


def test_missing_manifest(ds):
    (ds / MANIFEST_NAME).unlink()
    with pytest.raises(FormatError, match="not a fastload dataset"):
        fastload.open(ds)


def test_no_pickle_or_eval_in_the_readers():
    import inspect
    import re

    from fastload._front import dataset as _dataset
    from fastload.formats import _layout, _manifest, shards

    banned = re.compile(r"import pickle|pickle\.load|\beval\(|\bexec\(|allow_pickle|np\.load\(|torch\.load\(|marshal")
    for mod in (_dataset, _layout, _manifest, shards, lmdb_format):
        hit = banned.search(inspect.getsource(mod))
        assert hit is None, f"{mod.__name__} uses {hit.group()}"


# -- LMDB ---------------------------------------------------------------------------------------

ROWS = 16  # rows per column chunk: 90 samples -> 6 chunks


@pytest.fixture(scope="module")
def packed_lmdb(tmp_path_factory) -> tuple[Path, list]:
    root = tmp_path_factory.mktemp("packed_lmdb") / "ds"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lmdb_format, "DEFAULT_ROWS_PER_CHUNK", ROWS)
        fastload.pack(make_samples(90), root, format="lmdb", workers=0, schema=FIELDS)
    m = lmdb_format.read_manifest(root)
    assert m.metadata["lmdb"]["rows_per_chunk"] == ROWS
    return root, read_all(root)


@pytest.fixture
def lm(packed_lmdb, tmp_path) -> Path:
    root = tmp_path / "lm"
    shutil.copytree(packed_lmdb[0], root)
    return root


def lmdb_edit(root: Path, fn) -> None:
    """Run fn(txn) in a write transaction of the environment at root (no reader may be open)."""
    import lmdb

    env = lmdb.open(str(root), subdir=True, map_size=1 << 30)
    try:
        with env.begin(write=True) as txn:
            fn(txn)
    finally:
        env.close()


def _record(txn, i: int) -> bytes:
    return bytes(txn.get(lmdb_format.sample_key(i)))


def _rewrite_record(i: int, fn):
    def edit(txn):
        txn.put(lmdb_format.sample_key(i), fn(_record(txn, i)))
    return edit


NB = 3  # blob fields in the test schema: var, raw, text

LMDB_RECORD_EDITS = {
    "empty record": (lambda r: b"", "shorter than"),
    "truncated header": (lambda r: r[:5], "shorter than"),
    "header only": (lambda r: r[:8 * NB], "does not fit"),
    "truncated payload": (lambda r: r[:-1], "does not fit"),
    "appended byte": (lambda r: r + b"\x00", "does not fit"),
    "var end past the raw end": (lambda r: struct.pack("<Q", struct.unpack_from("<Q", r, 8)[0] + 1) + r[8:],
                                 "field 'var'"),
    "ends huge": (lambda r: struct.pack("<Q", U64_MAX) + r[8:], "does not fit"),
    "last end huge": (lambda r: r[:16] + struct.pack("<Q", U64_MAX - 7) + r[24:], "does not fit"),
    "var blob of the wrong length": (lambda r: struct.pack("<3Q", *(e + 4 for e in struct.unpack_from("<3Q", r)))
                                     + r[24:] + b"\x00" * 4, "field 'var'"),
}


@pytest.mark.parametrize("case", list(LMDB_RECORD_EDITS))
def test_lmdb_bad_records(lm, case):
    edit, message = LMDB_RECORD_EDITS[case]
    i = 37
    lmdb_edit(lm, _rewrite_record(i, edit))
    assert_read_fails(lm, f"sample {i}, field 'var'", message, exc=FormatError)  # var: the first blob read
    result = verify(lm)
    assert result.exit_code == 1 and "BAD chunk 2" in result.output, result.output


@pytest.mark.parametrize("field, col, change", [
    ("label", "values", lambda b: b[:-1]),
    ("label", "values", lambda b: b + b"\x00" * 8),
    ("emb", "values", lambda b: b""),
    ("var", "shape", lambda b: b[:-8]),
])
def test_lmdb_wrong_column_chunk_length(lm, field, col, change):
    key = lmdb_format.chunk_key(field, col, 1)
    lmdb_edit(lm, lambda txn: txn.put(key, change(bytes(txn.get(key)))))
    assert_read_fails(lm, f"field '{field}'", f"samples {ROWS}..{2 * ROWS - 1}", f"{field}/{col}/1",
                      exc=FormatError)
    result = verify(lm)
    assert result.exit_code == 1 and "BAD chunk 1" in result.output, result.output


def test_lmdb_crafted_shape_column(lm):
    key = lmdb_format.chunk_key("var", "shape", 2)

    def edit(txn):
        shapes = np.frombuffer(bytes(txn.get(key)), "<i8").reshape(-1, 2).copy()
        shapes[5] = (1 << 62, 2)  # wraps to a 0-byte blob in int64 arithmetic
        txn.put(key, shapes.tobytes())
    lmdb_edit(lm, edit)
    assert_read_fails(lm, f"sample {2 * ROWS + 5}", "field 'var'", exc=FormatError)
    assert verify(lm).exit_code == 1


def test_lmdb_negative_and_mismatched_shapes(lm):
    key = lmdb_format.chunk_key("var", "shape", 0)

    def edit(txn):
        shapes = np.frombuffer(bytes(txn.get(key)), "<i8").reshape(-1, 2).copy()
        shapes[3] = (1, 3)  # dimension 1 is fixed to 2 by the schema
        txn.put(key, shapes.tobytes())
    lmdb_edit(lm, edit)
    assert_read_fails(lm, "sample 3", "field 'var'", "dimension 1", exc=FormatError)


@pytest.mark.parametrize("key, message", [
    (lmdb_format.sample_key(50), "sample 50"),
    (lmdb_format.chunk_key("score", "values", 3), "field 'score'"),
    (lmdb_format.chunk_key("var", "shape", 5), "field 'var'"),
])
def test_lmdb_missing_keys(lm, key, message):
    lmdb_edit(lm, lambda txn: txn.delete(key))
    assert_read_fails(lm, message, "missing", exc=FormatError)
    result = verify(lm)
    assert result.exit_code == 1 and "missing" in result.output, result.output


def test_lmdb_flipped_column_value_is_found_by_verify(lm, packed_lmdb):
    key = lmdb_format.chunk_key("label", "values", 4)

    def edit(txn):
        b = bytearray(txn.get(key))
        b[3] ^= 0x40
        txn.put(key, bytes(b))
    lmdb_edit(lm, edit)
    got = read_all(lm)  # well-formed, just a different number
    assert got != packed_lmdb[1]
    result = verify(lm)
    assert result.exit_code == 1 and "BAD chunk 4" in result.output and "checksum" in result.output


def test_lmdb_flipped_bytes_payload_is_found_by_verify(lm):
    lmdb_edit(lm, _rewrite_record(70, lambda r: r[:-1] + bytes([r[-1] ^ 1])))
    read_all(lm)
    result = verify(lm)
    assert result.exit_code == 1 and "BAD chunk 4" in result.output


def _lmdb_manifest(fn):
    def edit(txn):
        doc = json.loads(bytes(txn.get(lmdb_format.MANIFEST_KEY)))
        fn(doc)
        txn.put(lmdb_format.MANIFEST_KEY, json.dumps(doc).encode())
    return edit


@pytest.mark.parametrize("edit, exc, message", [
    (_lmdb_manifest(_set("version", FORMAT_VERSION + 6)), VersionError, f"version {FORMAT_VERSION + 6}"),
    (_lmdb_manifest(_set("layout", "zip")), FormatError, "layout"),
    (_lmdb_manifest(_set("metadata.lmdb.rows_per_chunk", 0)), FormatError, "rows_per_chunk"),
    (_lmdb_manifest(_set("metadata.lmdb.rows_per_chunk", "16")), FormatError, "rows_per_chunk"),
    (_lmdb_manifest(_set("metadata.lmdb", None)), FormatError, "rows_per_chunk"),
    (_lmdb_manifest(_set("schema.0.kind", "complex")), FormatError, "kind"),
    (lambda txn: txn.put(lmdb_format.MANIFEST_KEY, b"{not json"), FormatError, "JSON"),
    (lambda txn: txn.delete(lmdb_format.MANIFEST_KEY), FormatError, "no manifest"),
])
def test_lmdb_bad_manifest(lm, edit, exc, message):
    lmdb_edit(lm, edit)
    with pytest.raises(exc, match=message):
        fastload.open(lm)
    result = verify(lm)
    assert result.exit_code in (1, 2) and message in result.output, result.output


def test_lmdb_manifest_with_more_samples_than_stored(lm):
    lmdb_edit(lm, _lmdb_manifest(_set("num_samples", 100)))
    assert_read_fails(lm, "samples 80..95", exc=FormatError)
    assert verify(lm).exit_code == 1


# -- fuzzing ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, list]:
    """One small shard holding every non-image kind."""
    root = tmp_path_factory.mktemp("small") / "ds"
    fastload.pack(make_samples(10, seed=3), root, workers=0, schema=FIELDS)
    assert [p.name for p in root.glob("*.fls")] == ["shard-00000.fls"]
    return root, read_all(root)


def _interesting_u64(size: int):
    return st.sampled_from([0, 1, 7, 63, 64, size, size + 64, 1 << 32, (1 << 63) - 1, 1 << 63, U64_MAX - 63,
                            U64_MAX])


@st.composite
def shard_mutation(draw, orig: bytes, structure_end: int):
    """A damaged copy of ``orig``: byte flips (biased to the header and section table), a crafted
    little-endian u64, a truncation, or appended bytes."""
    data = bytearray(orig)
    kind = draw(st.sampled_from(["flip", "flip", "u64", "truncate", "append"]))
    if kind == "flip":
        for _ in range(draw(st.integers(1, 4))):
            pos = draw(st.one_of(st.integers(0, structure_end - 1), st.integers(0, len(data) - 1)))
            data[pos] ^= draw(st.integers(1, 255))
    elif kind == "u64":
        pos = draw(st.integers(0, len(data) // 8 - 1)) * 8
        data[pos:pos + 8] = struct.pack("<Q", draw(_interesting_u64(len(orig))))
    elif kind == "truncate":
        del data[draw(st.integers(0, len(data) - 1)):]
    else:
        data += draw(st.binary(min_size=1, max_size=100))
    return bytes(data)


def free_bytes(path: Path) -> np.ndarray:
    """Mask of the shard bytes whose damage the format cannot see (``verify`` does): fixed-size column
    values, blob data, the inner offsets of bytes/str fields (their lengths are free), and padding."""
    secs = sections(path)
    schema = _schema(path)
    free = np.ones(path.stat().st_size, bool)
    free[:TABLE + 16 * len(secs)] = False
    for (field, part), (off, n) in secs.items():
        if part == "shape" or (part == "offsets" and schema[field].kind not in ("bytes", "str")):
            free[off:off + n] = False
        elif part == "offsets":
            free[off:off + 8] = free[off + n - 8:off + n] = False
    return free


def silent_change_allowed(orig: bytes, damaged: bytes, free: np.ndarray) -> bool:
    if len(orig) != len(damaged):
        return False
    changed = np.nonzero(np.frombuffer(orig, np.uint8) != np.frombuffer(damaged, np.uint8))[0]
    return bool(free[changed].all())


def test_fuzz_shard_bytes(small, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(small[0], root)
    expected = small[1]
    path = root / "shard-00000.fls"
    orig = path.read_bytes()
    manifest = (root / MANIFEST_NAME).read_bytes()
    structure_end = min(o for o, _ in sections(path).values())
    free = free_bytes(path)
    seen = {"raised": 0, "read": 0}

    @settings(max_examples=400, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.data())
    def run(data):
        damaged = data.draw(shard_mutation(orig, structure_end))
        if damaged == orig:
            return
        path.write_bytes(damaged)
        (root / MANIFEST_NAME).write_bytes(manifest)
        if data.draw(st.booleans()):
            # a manifest that agrees on the size (not the checksum) reaches the structural checks
            edit_manifest(root, _set("shards.0.bytes", len(damaged)))
        allowed = silent_change_allowed(orig, damaged, free)
        raised = read_fails_or_matches(root, None if allowed else expected, "shard-00000.fls")
        seen["raised" if raised else "read"] += 1
        assert_verify_flags(root, "shard-00000.fls")

    run()
    assert seen["raised"] > 100, seen


@st.composite
def record_mutation(draw, orig: bytes):
    data = bytearray(orig)
    kind = draw(st.sampled_from(["flip", "u64", "truncate", "append"]))
    if kind == "flip":
        for _ in range(draw(st.integers(1, 3))):
            pos = draw(st.one_of(st.integers(0, min(len(data), 8 * NB) - 1), st.integers(0, len(data) - 1)))
            data[pos] ^= draw(st.integers(1, 255))
    elif kind == "u64":
        pos = draw(st.integers(0, NB - 1)) * 8
        data[pos:pos + 8] = struct.pack("<Q", draw(_interesting_u64(len(orig))))
    elif kind == "truncate":
        del data[draw(st.integers(0, len(data) - 1)):]
    else:
        data += draw(st.binary(min_size=1, max_size=20))
    return bytes(data)


def test_fuzz_lmdb_records(packed_lmdb, tmp_path):
    root = tmp_path / "lm"
    shutil.copytree(packed_lmdb[0], root)
    expected = packed_lmdb[1]
    import lmdb

    env = lmdb.open(str(root), subdir=True, map_size=1 << 30)
    with env.begin() as txn:
        originals = {i: _record(txn, i) for i in range(90)}
    env.close()

    @settings(max_examples=120, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.integers(0, 89), st.data())
    def run(i, data):
        damaged = data.draw(record_mutation(originals[i]))
        if damaged == originals[i]:
            return
        lmdb_edit(root, lambda txn: txn.put(lmdb_format.sample_key(i), damaged))
        free = np.zeros(len(originals[i]), bool)
        free[8:16] = True  # ends[1]: where the raw blob stops and the text starts (both free lengths)
        free[8 * NB:] = True  # the blobs themselves
        allowed = silent_change_allowed(originals[i], damaged, free)
        try:
            read_fails_or_matches(root, None if allowed else expected, f"sample {i}")
            # only blob bytes can change unseen (the ends still fit): verify's digest sees them
            assert verify(root).exit_code == 1
        finally:
            lmdb_edit(root, lambda txn: txn.put(lmdb_format.sample_key(i), originals[i]))

    run()


def test_fuzz_manifest_text(ds, expected):
    orig = (ds / MANIFEST_NAME).read_bytes()

    @settings(max_examples=150, deadline=None, derandomize=True, database=None)
    @given(st.lists(st.tuples(st.integers(0, len(orig) - 1), st.integers(0, 255)), min_size=1, max_size=4))
    def run(edits):
        b = bytearray(orig)
        for pos, value in edits:
            b[pos] = value
        (ds / MANIFEST_NAME).write_bytes(bytes(b))
        try:
            read_all(ds)
        except FastloadError:
            pass  # anything else fails the test

    run()


# -- round trips --------------------------------------------------------------------------------

EDGE_FIELDS = {
    "i": Field.int("i"),
    "f": Field.float("f"),
    "fixed": Field.ndarray("fixed", "<f4", (3,)),
    "empty_fixed": Field.ndarray("empty_fixed", "<i8", (2, 0)),
    "u64": Field.ndarray("u64", "<u8", (2,)),
    "flags": Field.ndarray("flags", "|b1", (2,)),
    "half": Field.ndarray("half", "<f2", (2,)),
    "v1": Field.ndarray("v1", "<f8", (None,)),
    "v2": Field.ndarray("v2", "<i2", (None, None)),
    "v3": Field.ndarray("v3", "|u1", (None, 3)),
    "b": Field.bytes("b"),
    "s": Field.str("s"),
}

INTS = [0, -1, 1, (1 << 63) - 1, -(1 << 63), 12345678901234]
FLOATS = [0.0, -0.0, math.nan, math.inf, -math.inf, 5e-324, 1.7976931348623157e308]
STRINGS = ["", "a", "héllo wörld", "日本語テキスト", "🎉🐍", "nul\x00inside", "e\u0301", "\U0010ffff"]
BYTES = [b"", b"\x00", bytes(range(256)), b"\xff" * 7, b"x"]
V2_SHAPES = [(0, 5), (3, 0), (0, 0), (2, 3), (1, 1)]


def edge_samples(n: int = 40) -> Samples:
    rng = np.random.default_rng(7)
    out = Samples()
    for i in range(n):
        out.append({
            "i": INTS[i % len(INTS)],
            "f": FLOATS[i % len(FLOATS)],
            "fixed": np.array([math.nan, -0.0, i], "<f4"),
            "empty_fixed": np.zeros((2, 0), "<i8"),
            "u64": np.array([U64_MAX, i], "<u8"),
            "flags": np.array([i % 2, 1], bool),
            "half": np.array([65504.0, -i], "<f2"),
            "v1": rng.standard_normal(i % 3),
            "v2": rng.integers(-(1 << 15), 1 << 15, V2_SHAPES[i % len(V2_SHAPES)]).astype("<i2"),
            "v3": rng.integers(0, 256, (i % 4, 3)).astype("u1"),
            "b": BYTES[i % len(BYTES)],
            "s": STRINGS[i % len(STRINGS)],
        })
    return out


def expected_value(field: Field, v):
    if field.kind == "ndarray":
        return canon(torch.from_numpy(np.ascontiguousarray(v, dtype=field.dtype)))
    return canon(v)


@pytest.mark.parametrize("fmt", ["shards", "lmdb"])
def test_round_trip_every_non_image_kind(tmp_path, fmt, monkeypatch):
    monkeypatch.setattr(lmdb_format, "DEFAULT_ROWS_PER_CHUNK", 16)
    data = edge_samples()
    root = tmp_path / "ds"
    fastload.pack(data, root, format=fmt, workers=0, schema=EDGE_FIELDS, shard_size="4K")
    ds = fastload.open(root, as_dict=True)
    assert len(ds) == len(data)
    assert ds.schema.names == tuple(EDGE_FIELDS)
    for i, sample in enumerate(data):
        got = ds[i]
        for name, field in EDGE_FIELDS.items():
            assert canon(got[name]) == expected_value(field, sample[name]), (i, name)
        assert type(got["i"]) is int and type(got["f"]) is float
        assert type(got["b"]) is bytes and type(got["s"]) is str
    ds.close()
    assert_verify_ok(root)


@pytest.mark.parametrize("fmt", ["shards", "lmdb"])
def test_round_trip_all_blobs_empty(tmp_path, fmt):
    # every data section is empty: the last one starts exactly at the end of the file
    data = Samples({"b": b"", "s": "", "v": np.zeros((0,), "<f4")} for _ in range(5))
    root = tmp_path / "ds"
    fastload.pack(data, root, format=fmt, workers=0, schema={"v": Field.ndarray("v", "<f4", (None,))})
    assert read_all(root) == [canon({"b": b"", "s": "", "v": torch.zeros(0)})] * 5
    assert_verify_ok(root)


@pytest.mark.parametrize("fmt", ["shards", "lmdb"])
def test_round_trip_numpy_arrays(tmp_path, fmt):
    ints = np.array([0, -1, (1 << 63) - 1, -(1 << 63)] * 50, np.int64)
    floats = np.array([math.nan, math.inf, -math.inf, -0.0] * 50)
    grid = np.arange(200 * 6, dtype="<u2").reshape(200, 2, 3)
    root = tmp_path / "ds"
    fastload.pack({"a": ints, "b": floats, "c": grid}, root, format=fmt, workers=0, shard_size="4K")
    got = read_all(root)
    for i in range(200):
        assert got[i] == canon({"a": int(ints[i]), "b": float(floats[i]), "c": torch.from_numpy(grid[i].copy())})
    assert_verify_ok(root)
