"""Shared helpers of the corruption tests (test_corrupt_*.py): small datasets of every non-image field kind,
byte-level editing, and assertions that reads fail with a named error. Their fixtures: conftest.py."""
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

from conftest import Samples

U64_MAX = (1 << 64) - 1
TABLE = 64  # the section table starts right after the 64-byte header
FIELDS = {"var": Field.ndarray("var", "<f4", (None, 2))}  # the rest is inferred from the samples


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
