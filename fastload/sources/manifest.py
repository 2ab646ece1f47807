"""CSV or JSONL manifests: one row per sample, a column of file paths plus label/other columns.

Paths are relative to ``root`` (default: the manifest's directory). Files with an image extension
become an ``image`` field named ``image``; other files a ``bytes`` field named ``data``. Other
columns become ``int``, ``float`` or ``str`` fields: a CSV column is ``int`` when every value parses
as an integer, else ``float`` when every value parses as a number, else ``str``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from .._encode import FileImage
from .._errors import SourceError
from .._schema import Field, Schema
from ._base import Source
from .imagefolder import IMG_EXTENSIONS


def _read_rows(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SourceError(f"cannot read manifest {path}: {e}") from None
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise SourceError(f"{path}, line {n}: not valid JSON ({e})") from None
            if not isinstance(row, dict):
                raise SourceError(f"{path}, line {n}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
        return rows
    return list(csv.DictReader(text.splitlines()))


def _parse_int(v: str) -> int | None:
    try:
        return int(v)
    except ValueError:
        return None


def _parse_float(v: str) -> float | None:
    try:
        return float(v)
    except ValueError:
        return None


class ManifestSource(Source):
    files_only = True

    def __init__(self, manifest: str | os.PathLike, root: str | os.PathLike | None = None, path_column: str = "path"):
        self.manifest = Path(manifest)
        self.root = Path(root) if root is not None else self.manifest.parent
        rows = _read_rows(self.manifest)
        if not rows:
            raise SourceError(f"manifest {self.manifest} has no rows")
        columns = list(rows[0].keys())
        if path_column not in columns:
            raise SourceError(f"manifest {self.manifest} has no '{path_column}' column (columns: {columns}); "
                              f"name the path column with path_column= / --path-column")
        for n, row in enumerate(rows):
            if list(row.keys()) != columns:
                raise SourceError(f"manifest {self.manifest}, row {n}: columns {list(row.keys())} differ from "
                                  f"the first row's {columns}")
        self.paths = [str(r[path_column]) for r in rows]
        images = all(p.lower().endswith(IMG_EXTENSIONS) for p in self.paths)
        file_field = Field.image("image") if images else Field.bytes("data")
        others = [c for c in columns if c != path_column]
        self.values: list[list[Any]] = [[] for _ in rows]
        fields = [file_field]
        for c in others:
            field, vals = self._column(c, [r[c] for r in rows])
            fields.append(field)
            for row_vals, v in zip(self.values, vals):
                row_vals.append(v)
        self.schema = Schema(fields)
        self.metadata = {"source": "manifest", "manifest": str(self.manifest)}

    def _column(self, name: str, vals: list[Any]) -> tuple[Field, list[Any]]:
        safe = name if name.isidentifier() else "_" + "".join(ch if ch.isalnum() else "_" for ch in name)
        for n, v in enumerate(vals):
            if v is None or isinstance(v, (list, dict)):
                raise SourceError(f"manifest {self.manifest}, row {n}, column '{name}': {v!r} is not a number "
                                  f"or string")
        if all(isinstance(v, str) for v in vals):  # CSV, or JSON strings
            ints = [_parse_int(v) for v in vals]
            if all(i is not None for i in ints):
                return Field.int(safe), ints
            floats = [_parse_float(v) for v in vals]
            if all(f is not None for f in floats):
                return Field.float(safe), floats
            return Field.str(safe), vals
        if all(isinstance(v, (int, bool)) for v in vals):
            return Field.int(safe), [int(v) for v in vals]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            return Field.float(safe), [float(v) for v in vals]
        kinds = sorted({type(v).__name__ for v in vals})
        raise SourceError(f"manifest {self.manifest}, column '{name}' mixes value types {kinds}")

    def __len__(self) -> int:
        return len(self.paths)

    def _path(self, i: int) -> str:
        return os.path.join(self.root, self.paths[i])

    def load(self, i: int) -> list:
        path = self._path(i)
        if self.schema.fields[0].kind == "image":
            first: Any = FileImage(path)
        else:
            with open(path, "rb") as fh:
                first = fh.read()
        return [first] + self.values[i]

    def describe(self, i: int) -> str:
        return f"{self._path(i)} (manifest {self.manifest}, row {i})"

    def fingerprint(self) -> str:
        h = hashlib.sha256(self.manifest.read_bytes())
        h.update(str(self.root.resolve()).encode())
        return "manifest:" + h.hexdigest()
