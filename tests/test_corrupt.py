"""Damaged and crafted datasets, both formats.

Every offset and length read from disk is checked before use, so a damaged dataset raises a
``FastloadError`` that names the shard (and the sample and field where one is involved): never another
exception, never a crash, never silently different data where the structure can tell. Damage the
structure cannot reveal (a flipped bit inside an int column) is what ``fastload verify`` is for: it
exits 1 naming every bad shard. Only non-image fields are used, so no native code is needed.
"""

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


class Samples(list):
    """A map-style dataset of dict samples (a list already has ``__getitem__`` and ``__len__``)."""


def make_samples(n: int, seed: int = 0) -> Samples:
    rng = np.random.default_rng(seed)
    out = Samples()
    for i in range(n):
        out.append({
            "label": int(rng.integers(-(1 << 63), (1 << 63) - 1, dtype=np.int64)),
            "score": float(rng.standard_normal()),
            "emb": rng.standard_normal(4).astype("<f4"),
            "var": rng.standard_normal((i % 4, 2)).astype("<f4"),
            "raw": rng.bytes(int(rng.integers(1, 40))),
            "text": "ünïcødé " * (i % 4) + str(i),
        })
    return out


# -- helpers ------------------------------------------------------------------------------------

def canon(v):
    """A value in a form where == is exact: tensors as (dtype, shape, bytes), floats bit for bit."""
    if isinstance(v, torch.Tensor):
        return (str(v.dtype), tuple(v.shape), v.contiguous().numpy().tobytes())
    if isinstance(v, float):
        return ("float", struct.pack("<d", v))
    if isinstance(v, dict):
        return {k: canon(x) for k, x in v.items()}
    return (type(v).__name__, v)


def read_all(path: Path) -> list:
    ds = fastload.open(path, as_dict=True)
    try:
        return [canon(ds[i]) for i in range(len(ds))]
    finally:
        ds.close()


def assert_read_fails(path: Path, *names: str, exc: type = FastloadError) -> str:
    """open + read every sample raises ``exc`` whose message contains every one of ``names``."""
    with pytest.raises(exc) as info:
        read_all(path)
    msg = str(info.value)
    for name in names:
        assert name in msg, f"{name!r} is not named in: {msg}"
    return msg


def read_fails_or_matches(path: Path, expected: list | None, *names: str) -> bool:
    """Reading either raises a FastloadError naming ``names`` or returns exactly ``expected``.

    ``expected=None`` accepts any data (for damage the format cannot see, left to verify). Returns
    True when it raised. Any other exception propagates and fails the test.
    """
    try:
        got = read_all(path)
    except FastloadError as e:
        for name in names:
            assert name in str(e), f"{name!r} is not named in: {e}"
        return True
    assert expected is None or got == expected, "a damaged dataset silently returned different data"
    return False


def verify(path: Path):
    result = CliRunner().invoke(cli, ["verify", str(path)])
    # a clean exit (sys.exit) and never a traceback
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def assert_verify_flags(path: Path, *shards: str) -> None:
    result = verify(path)
    assert result.exit_code == 1, result.output
    for s in shards:
        assert f"BAD {s}" in result.output, result.output


def assert_verify_ok(path: Path) -> None:
    result = verify(path)
    assert result.exit_code == 0, result.output


def sections(path: Path) -> dict[tuple[str, str], tuple[int, int]]:
    """(field, part) -> (offset, length) for a shard of the test schema, read with plain struct."""
    raw = path.read_bytes()
    names = section_names(_schema(path))
    table = struct.unpack_from(f"<{2 * len(names)}Q", raw, TABLE)
    return {name: (table[2 * k], table[2 * k + 1]) for k, name in enumerate(names)}


def table_entry(path: Path, name: tuple[str, str]) -> int:
    """File offset of the section table entry of section ``name``."""
    return TABLE + 16 * section_names(_schema(path)).index(name)


def _schema(shard: Path):
    return manifest_format.Manifest.parse((shard.parent / MANIFEST_NAME).read_bytes(), "test").schema


def put(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def put_u64(path: Path, offset: int, value: int) -> None:
    put(path, offset, struct.pack("<Q", value))


def edit_manifest(root: Path, fn) -> None:
    doc = json.loads((root / MANIFEST_NAME).read_text())
    fn(doc)
    (root / MANIFEST_NAME).write_text(json.dumps(doc))


def rehash(root: Path, *names: str) -> None:
    """Make the manifest agree with the shard files' current size and checksum (a crafted dataset)."""
    def fn(doc):
        for s in doc["shards"]:
            if s["file"] in names:
                s["bytes"], s["xxh3_64"] = file_digest(root / s["file"])
    edit_manifest(root, fn)


class Shard:
    """One shard file whose bytes a test rewrites and then restores, many times over."""

    def __init__(self, path: Path):
        self.path = path
        self.orig = path.read_bytes()

    def write(self, data: bytes) -> None:
        self.path.write_bytes(data)

    def flipped(self, i: int, mask: int = 0xFF) -> bytes:
        b = bytearray(self.orig)
        b[i] ^= mask
        return bytes(b)

    def restore(self) -> None:
        self.path.write_bytes(self.orig)


# -- fixtures -----------------------------------------------------------------------------------

SHARD = "shard-00001.fls"  # the shard most tests damage: the middle one, so sample numbers are global
FIRST = "shard-00000.fls"  # damaged by the loops over every byte: reading stops at once


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> tuple[Path, list]:
    root = tmp_path_factory.mktemp("packed") / "ds"
    fastload.pack(make_samples(90), root, shard_size="4K", workers=0, schema=FIELDS)
    shards = sorted(p.name for p in root.glob("shard-*.fls"))
    assert len(shards) >= 3, shards
    return root, read_all(root)


@pytest.fixture
def ds(packed, tmp_path) -> Path:
    root = tmp_path / "ds"
    shutil.copytree(packed[0], root)
    return root


@pytest.fixture
def expected(packed) -> list:
    return packed[1]


@pytest.fixture
def shard1_start(ds) -> int:
    doc = json.loads((ds / MANIFEST_NAME).read_text())
    return doc["shards"][0]["num_samples"]


# -- shards: the header -------------------------------------------------------------------------

def test_intact_dataset_reads_and_verifies(ds, expected):
    assert read_all(ds) == expected
    result = verify(ds)
    assert result.exit_code == 0 and "OK" in result.output


def test_every_header_byte_flip_is_refused(ds):
    shard = Shard(ds / FIRST)
    for i in range(64):
        for mask in (0x01, 0x80):
            shard.write(shard.flipped(i, mask))
            assert_read_fails(ds, FIRST)
    assert_verify_flags(ds, FIRST)


@pytest.mark.parametrize("offset, value, message", [
    (0, b"FLSHARD2", "magic"),
    (8, struct.pack("<I", 0), "version 0"),
    (12, struct.pack("<I", 3), "3 sections"),
    (12, struct.pack("<I", 0xFFFFFFFF), "sections"),
    (16, struct.pack("<Q", U64_MAX), "samples"),
    (24, struct.pack("<Q", 0), "shard 0"),
    (40, b"\x01", "reserved"),
])
def test_crafted_header_fields(ds, offset, value, message):
    put(ds / SHARD, offset, value)
    assert_read_fails(ds, SHARD, message, exc=FormatError)
    rehash(ds, SHARD)  # even when the manifest's checksum agrees, the structure is refused
    assert_read_fails(ds, SHARD, message, exc=FormatError)


def test_newer_shard_version_is_refused_naming_both_versions(ds):
    put(ds / SHARD, 8, struct.pack("<I", FORMAT_VERSION + 6))
    msg = assert_read_fails(ds, SHARD, f"version {FORMAT_VERSION + 6}", f"version {FORMAT_VERSION}",
                            exc=VersionError)
    assert "upgrade" in msg
    assert_verify_flags(ds, SHARD)


def test_newer_manifest_version_is_refused_naming_both_versions(ds):
    edit_manifest(ds, lambda d: d.update(version=FORMAT_VERSION + 6))
    with pytest.raises(VersionError) as info:
        fastload.open(ds)
    msg = str(info.value)
    assert f"version {FORMAT_VERSION + 6}" in msg and f"version {FORMAT_VERSION}" in msg and str(ds) in msg
    result = verify(ds)
    assert result.exit_code != 0 and f"version {FORMAT_VERSION + 6}" in result.output


# -- shards: the section table ------------------------------------------------------------------

def test_every_section_table_byte_flip_is_refused(ds):
    shard = Shard(ds / FIRST)
    nsec = len(sections(ds / FIRST))
    for i in range(TABLE, TABLE + 16 * nsec):
        for mask in (0x01, 0x40, 0x80):
            shard.write(shard.flipped(i, mask))
            assert_read_fails(ds, FIRST, exc=FormatError)
    assert_verify_flags(ds, FIRST)


def _table_cases():
    # (section, offset or a function of (offset, length, file size, previous section), length or function)
    return {
        "offset+length overflows": (("raw", "data"), lambda o, n, s, p: U64_MAX - 63, lambda o, n, s, p: 128),
        "offset near 2**64": (("raw", "data"), lambda o, n, s, p: (1 << 64) - 64, None),
        "length near 2**64": (("raw", "data"), None, lambda o, n, s, p: U64_MAX),
        "length past the end": (("raw", "data"), None, lambda o, n, s, p: s - o + 1),
        "offset past the end": (("text", "data"), lambda o, n, s, p: s + 64, None),
        "unaligned": (("emb", "values"), lambda o, n, s, p: o + 8, None),
        "overlaps the header": (("label", "values"), lambda o, n, s, p: 0, None),
        "overlaps the table": (("label", "values"), lambda o, n, s, p: TABLE, None),
        "overlaps the previous section": (("raw", "offsets"), lambda o, n, s, p: p[0], None),
        "before the previous section": (("text", "data"), lambda o, n, s, p: p[0] - 64, None),
    }


@pytest.mark.parametrize("case", list(_table_cases()))
def test_crafted_section_table_entries(ds, case):
    name, new_off, new_len = _table_cases()[case]
    path = ds / SHARD
    secs = sections(path)
    names = list(secs)
    off, length = secs[name]
    prev = secs[names[names.index(name) - 1]]
    size = path.stat().st_size
    at = table_entry(path, name)
    if new_off:
        put_u64(path, at, new_off(off, length, size, prev))
    if new_len:
        put_u64(path, at + 8, new_len(off, length, size, prev))
    rehash(ds, SHARD)
    assert_read_fails(ds, SHARD, f"{name[0]}.{name[1]}", exc=FormatError)


# -- shards: offsets, shape columns, data -------------------------------------------------------

def test_every_flip_in_variable_array_offsets_and_shapes_is_refused(ds):
    # a variable-shape array's blob length is fixed by its recorded shape: any change shows
    shard = Shard(ds / FIRST)
    secs = sections(ds / FIRST)
    for part in ("offsets", "shape"):
        off, length = secs[("var", part)]
        for i in range(off, off + length):
            shard.write(shard.flipped(i, 0x01 if i % 2 else 0x80))
            assert_read_fails(ds, FIRST, "field 'var'", exc=FormatError)
    assert_verify_flags(ds, FIRST)


@pytest.mark.parametrize("field", ["raw", "text"])
def test_flips_in_bytes_and_str_offsets(ds, expected, field):
    # bytes/str blobs have free lengths: a flip that keeps offsets increasing moves a boundary unseen
    # by the reader; the first and last offsets and every high byte are still checked. verify sees all.
    shard = Shard(ds / FIRST)
    off, length = sections(ds / FIRST)[(field, "offsets")]
    for i in range(off, off + length):
        for mask in (0x01, 0x80):
            shard.write(shard.flipped(i, mask))
            raised = read_fails_or_matches(ds, None, FIRST)
            k = i - off
            # the first and last offsets are pinned; a flip at 2**15 or above passes the data size (< 4K)
            if k < 8 or k >= length - 8 or k % 8 >= 2 or (k % 8 == 1 and mask == 0x80):
                assert raised, f"flip {mask:#x} of byte {k} of the {field} offsets was not detected"
            if k % 8 == 0:
                assert_verify_flags(ds, FIRST)


@pytest.mark.parametrize("field, part", [("label", "values"), ("score", "values"), ("emb", "values"),
                                         ("var", "data"), ("raw", "data")])
def test_flipped_data_is_found_by_verify(ds, expected, field, part):
    # no per-read checksum: a flipped bit in column data reads back as a different value. That is what
    # `fastload verify` is for.
    off, length = sections(ds / SHARD)[(field, part)]
    shard = Shard(ds / SHARD)
    shard.write(shard.flipped(off + length // 2, 0x10))
    read_all(ds)  # still well-formed
    assert_verify_flags(ds, SHARD)


def test_invalid_utf8_names_shard_sample_and_field(ds, shard1_start):
    off, _ = sections(ds / SHARD)[("text", "data")]
    offsets_at, _ = sections(ds / SHARD)[("text", "offsets")]
    k = 3
    start = struct.unpack_from("<Q", (ds / SHARD).read_bytes(), offsets_at + 8 * k)[0]
    put(ds / SHARD, off + start, b"\xff")
    assert_read_fails(ds, f"shard '{SHARD}'", f"sample {shard1_start + k}", "field 'text'", exc=DecodeError)
    assert_verify_flags(ds, SHARD)


def test_padding_flip_reads_the_same_and_verify_flags_it(ds, expected):
    path = ds / SHARD
    secs = sections(path)
    off, length = secs[("label", "values")]
    gap = [i for i in range(off + length, secs[("score", "values")][0])]
    end = max(o + n for o, n in secs.values())
    pads = gap or list(range(end, path.stat().st_size))
    assert pads, "the test dataset has no padding"
    put(path, pads[0], b"\x5a")
    assert read_all(ds) == expected
    assert_verify_flags(ds, SHARD)


# -- shards: crafted offsets and shapes ---------------------------------------------------------

def _offsets(path: Path, field: str) -> tuple[int, list[int], int]:
    off, length = sections(path)[(field, "offsets")]
    raw = path.read_bytes()
    return off, list(struct.unpack_from(f"<{length // 8}Q", raw, off)), sections(path)[(field, "data")][1]


def _increasing_at(values: list[int]) -> int:
    return next(k for k in range(1, len(values) - 2) if values[k] < values[k + 1])


@pytest.mark.parametrize("case", ["decreasing", "beyond the data", "last short", "last long", "first not 0",
                                  "middle 2**64-1", "tail 2**64-1", "last 2**64-8", "all huge"])
@pytest.mark.parametrize("field", ["raw", "var"])
def test_crafted_offsets(ds, shard1_start, case, field):
    path = ds / SHARD
    at, offs, dlen = _offsets(path, field)
    k = _increasing_at(offs)
    new = list(offs)
    if case == "decreasing":
        new[k], new[k + 1] = offs[k + 1], offs[k]
    elif case == "beyond the data":
        new[k] = dlen + 1000
    elif case == "last short":
        new[-1] = dlen - 1
    elif case == "last long":
        new[-1] = dlen + 1
    elif case == "first not 0":
        new[0] = 1
    elif case == "middle 2**64-1":
        new[k] = U64_MAX
    elif case == "tail 2**64-1":
        new[k:] = [U64_MAX] * (len(new) - k)
    elif case == "last 2**64-8":
        new[-1] = U64_MAX - 7
    else:
        new = [0] + [U64_MAX - 7] * (len(new) - 1)
    put(path, at, struct.pack(f"<{len(new)}Q", *new))
    rehash(ds, SHARD)
    msg = assert_read_fails(ds, SHARD, f"field '{field}'", exc=FormatError)
    if case == "decreasing":
        assert f"sample {shard1_start + k}" in msg, msg


def test_variable_array_offsets_all_on_the_last_sample_are_refused(ds):
    path = ds / SHARD
    at, offs, dlen = _offsets(path, "var")
    put(path, at, struct.pack(f"<{len(offs)}Q", *([0] * (len(offs) - 1) + [dlen])))
    rehash(ds, SHARD)
    assert_read_fails(ds, SHARD, "field 'var'", exc=FormatError)


@pytest.mark.parametrize("dims", [
    (-1, 2),
    (1 << 62, 2),  # 2**62 x 2 x 4 bytes wraps to 0 in int64
    (1 << 61, 2),
    (U64_MAX >> 1, 2),
    (0, 3),  # the schema fixes dimension 1 to 2
])
def test_crafted_shapes(ds, shard1_start, dims):
    path = ds / SHARD
    off, _ = sections(path)[("var", "shape")]
    at, offs, _ = _offsets(path, "var")
    k = next(k for k in range(len(offs) - 1) if offs[k] == offs[k + 1])  # a (0, 2) sample: 0 bytes of data
    put(path, off + 16 * k, struct.pack("<2q", *dims))
    rehash(ds, SHARD)
    assert_read_fails(ds, SHARD, "field 'var'", f"sample {shard1_start + k}", exc=FormatError)


def test_overflowing_shape_with_a_zero_dimension_is_refused(tmp_path):
    root = tmp_path / "ds"
    data = Samples({"a": np.zeros((i % 2, 3), "<f4")} for i in range(4))
    fastload.pack(data, root, workers=0, schema={"a": Field.ndarray("a", "<f4", (None, None))})
    path = root / "shard-00000.fls"
    off, _ = sections(path)[("a", "shape")]
    put(path, off, struct.pack("<2q", 0, 1 << 62))  # 0 elements, but numpy refuses the shape
    rehash(root, path.name)
    assert_read_fails(root, path.name, "field 'a'", "sample 0", exc=FormatError)


# -- shards: truncated, extended, swapped, missing files ----------------------------------------

@pytest.mark.parametrize("where", ["empty", "in the header", "after the header", "in the table",
                                   "after the table", "in the offsets", "in the data", "last data byte",
                                   "last byte"])
@pytest.mark.parametrize("crafted", [False, True], ids=["manifest as packed", "manifest rewritten"])
def test_truncated_shard(ds, expected, where, crafted):
    path = ds / SHARD
    secs = sections(path)
    size = path.stat().st_size
    cut = {
        "empty": 0, "in the header": 10, "after the header": 64, "in the table": 64 + 20,
        "after the table": min(o for o, _ in secs.values()), "in the offsets": secs[("raw", "offsets")][0] + 12,
        "in the data": secs[("raw", "data")][0] + 5,
        "last data byte": max(o + n for o, n in secs.values()) - 1, "last byte": size - 1,
    }[where]
    path.write_bytes(path.read_bytes()[:cut])
    if crafted and where == "last byte":  # only padding lost: the manifest agrees, the data is all there
        rehash(ds, SHARD)
        assert read_all(ds) == expected
        return
    if crafted:
        rehash(ds, SHARD)
    assert_read_fails(ds, SHARD, exc=FormatError)
    assert_verify_flags(ds, SHARD)


@pytest.mark.parametrize("extra", [1, 64, 4096])
def test_appended_bytes(ds, expected, extra):
    path = ds / SHARD
    path.write_bytes(path.read_bytes() + b"\x00" * extra)
    assert_read_fails(ds, SHARD, "bytes", exc=FormatError)
    assert_verify_flags(ds, SHARD)
    rehash(ds, SHARD)  # a manifest that agrees: trailing bytes are never read, the data is unchanged
    assert read_all(ds) == expected


def test_shard_replaced_by_another_of_a_different_size(ds):
    shutil.copy(ds / "shard-00002.fls", ds / SHARD)
    assert_read_fails(ds, SHARD, exc=FormatError)
    rehash(ds, SHARD)
    assert_read_fails(ds, SHARD, exc=FormatError)
    assert_verify_flags(ds, SHARD)


@pytest.fixture
def uniform(tmp_path) -> tuple[Path, list]:
    """Fixed-size fields only: every full shard has the same size and sample count."""
    rng = np.random.default_rng(1)
    root = tmp_path / "uniform"
    fastload.pack({"x": rng.integers(0, 1000, 600), "y": rng.standard_normal((600, 3))}, root,
                  shard_size="4K", workers=0)
    doc = json.loads((root / MANIFEST_NAME).read_text())
    first, second = doc["shards"][:2]
    assert (first["bytes"], first["num_samples"]) == (second["bytes"], second["num_samples"])
    return root, read_all(root)


@pytest.mark.parametrize("crafted", [False, True], ids=["manifest as packed", "manifest rewritten"])
def test_swapped_shards_of_equal_size(uniform, crafted):
    root, _ = uniform
    a, b = root / "shard-00000.fls", root / "shard-00001.fls"
    a_bytes = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(a_bytes)
    if crafted:
        rehash(root, a.name, b.name)
    assert_read_fails(root, "shard-00000.fls", "swapped", exc=FormatError)
    if not crafted:
        assert_verify_flags(root, "shard-00000.fls", "shard-00001.fls")


def test_shard_overwritten_by_an_equal_sized_sibling(uniform):
    root, _ = uniform
    shutil.copy(root / "shard-00000.fls", root / "shard-00001.fls")
    assert_read_fails(root, "shard-00001.fls", exc=FormatError)
    assert_verify_flags(root, "shard-00001.fls")


def test_missing_shard(ds):
    (ds / SHARD).unlink()
    assert_read_fails(ds, SHARD, "missing", exc=FormatError)
    assert_verify_flags(ds, SHARD)


def test_shard_replaced_by_a_directory(ds):
    (ds / SHARD).unlink()
    (ds / SHARD).mkdir()
    assert_read_fails(ds, SHARD, exc=FormatError)
    assert_verify_flags(ds, SHARD)


def test_verify_names_every_bad_shard(ds):
    shard = Shard(ds / "shard-00000.fls")
    shard.write(shard.flipped(100))
    (ds / "shard-00002.fls").unlink()
    result = verify(ds)
    assert result.exit_code == 1
    assert "BAD shard-00000.fls" in result.output and "BAD shard-00002.fls" in result.output
    assert "BAD shard-00001.fls" not in result.output
    assert "2 problem(s)" in result.output


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

    from fastload import _dataset
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
