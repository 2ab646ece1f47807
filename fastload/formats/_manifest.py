"""The manifest: the JSON document describing a packed dataset (both formats).

It is plain JSON, parsed with ``json.loads`` and validated field by field: opening a dataset never
executes anything. See docs/FORMAT.md for an example. ``write_manifest`` writes a shards dataset's
``manifest.json`` last and atomically (the packer and ``merge``); ``fsync_dir`` makes a rename durable.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import FormatError, SchemaError, VersionError
from .._schema import Schema
from ._layout import FORMAT_VERSION

MAGIC = "fastload"
MANIFEST_NAME = "manifest.json"
STATE_NAME = "pack_state.json"  # an unfinished pack's resume state, beside the files it writes (shards)
MAX_MANIFEST_BYTES = 256 << 20  # refuse absurd manifests before parsing them
LAYOUT = re.compile(r"[a-z][a-z0-9_]{0,31}")  # a format's name (fullmatch); the registry says which exist
SHARD_NAME = re.compile(r"shard-[0-9]{5,9}\.fls")  # always fullmatch: no "/", "..", or trailing newline
DTYPE = re.compile(r"[<>|=]?(b1|[iuf][1248])")  # what Field.to_json writes ('<f4', '|u1', '|b1'); fullmatch
MAX_COUNT = (1 << 63) - 1  # sample counts and byte sizes must fit the int64 arithmetic of readers
MAX_ROW_BYTES = 1 << 40  # a fixed-size field's per-sample bytes (numpy refuses shapes much past this)


@dataclass
class ShardEntry:
    file: str
    num_samples: int
    bytes: int
    xxh3_64: str

    def to_json(self) -> dict:
        return {"file": self.file, "num_samples": self.num_samples, "bytes": self.bytes, "xxh3_64": self.xxh3_64}


@dataclass
class Manifest:
    layout: str  # the name of its Format (formats/registry.py)
    schema: Schema
    num_samples: int
    shards: list[ShardEntry] = field(default_factory=list)
    image_mode: str | None = None
    skipped: list[dict] = field(default_factory=list)
    metadata: dict = field(default_factory=dict)
    version: int = FORMAT_VERSION
    created_by: str = ""

    def to_json(self) -> str:
        doc = {
            "format": MAGIC,
            "version": self.version,
            "layout": self.layout,
            "created_by": self.created_by,
            "num_samples": self.num_samples,
            "schema": self.schema.to_json(),
            "image_mode": self.image_mode,
            "shards": [s.to_json() for s in self.shards],
            "skipped": self.skipped,
            "metadata": self.metadata,
        }
        return json.dumps(doc, indent=1, sort_keys=False) + "\n"

    @classmethod
    def parse(cls, raw: bytes | str, where: str) -> "Manifest":
        """Parse and validate manifest text; ``where`` names it in errors."""
        if len(raw) > MAX_MANIFEST_BYTES:
            raise FormatError(f"{where}: manifest is {len(raw)} bytes, larger than the {MAX_MANIFEST_BYTES} allowed")
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: "[[[[..." nesting
            raise FormatError(f"{where}: manifest is not valid JSON ({type(e).__name__}: {e})") from None
        if not isinstance(doc, dict) or doc.get("format") != MAGIC:
            raise FormatError(f'{where}: not a fastload manifest (expected "format": "{MAGIC}")')
        version = doc.get("version")
        if not _is_int(version) or version < 1:
            raise FormatError(f"{where}: bad format version {version!r}")
        if version > FORMAT_VERSION:
            raise VersionError(
                f"{where}: written with format version {version}, this fastload reads up to version "
                f"{FORMAT_VERSION}; upgrade fastload to open it"
            )
        layout = doc.get("layout")  # which format: the reader asks that Format (formats/registry.py)
        if not (isinstance(layout, str) and LAYOUT.fullmatch(layout)):
            raise FormatError(f"{where}: layout {layout!r} is not a format's name")
        raw_schema = doc.get("schema")
        for k, f in enumerate(raw_schema if isinstance(raw_schema, list) else []):
            # numpy parses dtype strings with a grammar of its own (ast.literal_eval included): it only
            # ever sees the few strings a writer produces
            dtype = f.get("dtype") if isinstance(f, dict) else None
            if dtype is not None and not (isinstance(dtype, str) and DTYPE.fullmatch(dtype)):
                raise FormatError(
                    f"{where}: bad schema: field {k} has dtype {dtype!r}, expected one of "
                    f"b1 i1 i2 i4 i8 u1 u2 u4 u8 f2 f4 f8 with an optional byte order, e.g. '<f4'"
                )
        try:
            schema = Schema.from_json(raw_schema)
        except (SchemaError, ValueError, TypeError, OverflowError) as e:
            raise FormatError(f"{where}: bad schema: {e}") from None
        for f in schema:  # exact sizes of the fixed dimensions: numpy would refuse (or wrap) larger ones
            row = (
                math.prod(d for d in f.shape if d is not None) * np.dtype(f.dtype).itemsize
                if f.kind == "ndarray"
                else 0
            )
            if row > MAX_ROW_BYTES:
                raise FormatError(
                    f"{where}: field '{f.name}' shape {f.shape} needs {row} bytes per sample, "
                    f"more than the {MAX_ROW_BYTES} allowed"
                )
        num = doc.get("num_samples")
        if not _is_int(num) or not 0 <= num <= MAX_COUNT:
            raise FormatError(f"{where}: num_samples {num!r} is not an integer in 0..{MAX_COUNT}")
        shards = []
        raw_shards = doc.get("shards", [])
        if not isinstance(raw_shards, list):
            raise FormatError(f"{where}: 'shards' must be a list")
        for k, s in enumerate(raw_shards):
            shards.append(_parse_shard(s, f"{where}: shards[{k}]"))
        names = [s.file for s in shards]
        if len(set(names)) != len(names):
            raise FormatError(f"{where}: a shard file is listed twice")
        skipped = doc.get("skipped", [])
        metadata = doc.get("metadata", {})
        if not isinstance(skipped, list) or not isinstance(metadata, dict):
            raise FormatError(f"{where}: 'skipped' must be a list and 'metadata' an object")
        image_mode = doc.get("image_mode")
        return cls(layout, schema, num, shards, image_mode, skipped, metadata, version, str(doc.get("created_by", "")))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse_shard(s: Any, where: str) -> ShardEntry:
    if not isinstance(s, dict):
        raise FormatError(f"{where}: must be an object")
    file, n, size, digest = s.get("file"), s.get("num_samples"), s.get("bytes"), s.get("xxh3_64")
    if not isinstance(file, str) or not SHARD_NAME.fullmatch(file):
        raise FormatError(f"{where}: file name {file!r} is not of the form shard-NNNNN.fls")
    if not _is_int(n) or not 0 <= n <= MAX_COUNT or not _is_int(size) or not 0 <= size <= MAX_COUNT:
        raise FormatError(f"{where}: num_samples {n!r} and bytes {size!r} must be integers in 0..{MAX_COUNT}")
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{16}", digest):
        raise FormatError(f"{where}: xxh3_64 {digest!r} is not 16 hex digits")
    return ShardEntry(file, n, size, digest)


def write_manifest(root: Path, manifest: Manifest) -> None:
    """Write the manifest last and atomically: a dataset is complete exactly when it exists."""
    tmp = root / (MANIFEST_NAME + ".tmp")
    try:
        with open(tmp, "w") as fh:
            fh.write(manifest.to_json())
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(tmp)) from e
    os.replace(tmp, root / MANIFEST_NAME)
    fsync_dir(root)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest_file(path: Path) -> Manifest:
    """``path/manifest.json``, read (bounded) and validated; FormatError otherwise."""
    try:
        with open(path / MANIFEST_NAME, "rb") as fh:
            raw = fh.read(MAX_MANIFEST_BYTES + 1)  # Manifest.parse refuses anything longer
    except OSError as e:
        raise FormatError(f"dataset '{path}': cannot read {MANIFEST_NAME}: {e}") from None
    return Manifest.parse(raw, f"dataset '{path}'")
