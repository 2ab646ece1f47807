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


from .corrupt_common import *  # noqa: F401,F403  (helpers; the fixtures are in conftest.py)
from .corrupt_common import _schema  # noqa: F401


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
