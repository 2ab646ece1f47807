"""CSV or JSONL manifests: one row per sample, a column of file paths plus label/other columns.

Paths are relative to ``root`` (default: the manifest's directory). Files with an image extension
become an ``image`` field named ``image``; other files a ``bytes`` field named ``data``. Other
columns become ``int``, ``float`` or ``str`` fields: a CSV column is ``int`` when every value is an integer
as a CSV writes one, else ``float`` when every value is a number, else ``str``. Zero-padded integers ("007")
make a column of ids text, kept as written; "1_000", "+5" are not numbers (Python's int() would read them). A column is
never quietly turned into text by a bad cell: a blank cell among numbers, or a value that is not a number in
a column whose values mostly are, stops the pack naming its line and column.

Rows are named by their line in the file, counted from 1 as an editor does: in a CSV the header is
line 1 and the first sample line 2; in a JSONL file the first object is line 1.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

from ..fields.image import FileImage
from .._errors import SourceError
from .._schema import Field, Schema
from ._base import Source
from .imagefolder import IMG_EXTENSIONS


def _read_rows(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The rows and the line each starts on (1-based, as an editor counts; a CSV's header is line 1)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SourceError(f"cannot read manifest {path}: {e}") from None
    rows, lines = [], []
    if path.suffix.lower() in (".jsonl", ".ndjson"):
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
            lines.append(n)
        return rows, lines
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        for row in reader:
            rows.append(row)
            lines.append(reader.line_num)  # the row's last line: its only one, unless a quoted value spans lines
    except csv.Error as e:
        raise SourceError(f"{path}, line {reader.line_num}: not valid CSV ({e})") from None
    return rows, lines


def _blank(v: Any) -> bool:
    return v is None or (isinstance(v, str) and not v.strip())


# Numbers as a CSV writes them. Python's int()/float() also take "1_000", "+5", full-width digits and "007";
# reading such a cell as a number would change it ("007" -> 7 loses the zeros of an id), so they are not numbers.
_INT = re.compile(r"\s*-?(0|[1-9][0-9]*)\s*")
_FLOAT = re.compile(r"\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\s*|\s*[-+]?(nan|inf|infinity)\s*", re.I)
_PADDED = re.compile(r"\s*[-+]?0[0-9]+\s*")  # "007", "0042": zero-padded ids, kept as text


def _parse_int(v: str) -> int | None:
    return int(v) if _INT.fullmatch(v) else None


def _parse_float(v: str) -> float | None:
    if _PADDED.fullmatch(v):
        return None
    return float(v) if _FLOAT.fullmatch(v) else None


class ManifestSource(Source):
    files_only = True

    def __init__(
        self,
        manifest: str | os.PathLike,
        root: str | os.PathLike | None = None,
        path_column: str = "path",
        missing: Mapping[str, Any] | None = None,
    ):
        """``missing``: column -> the value a blank (CSV) or null (JSONL) cell of that column stands for;
        without it such a cell stops the pack."""
        self.manifest = Path(manifest)
        self.root = Path(root) if root is not None else self.manifest.parent
        self.missing = dict(missing or {})
        rows, self.lines = _read_rows(self.manifest)
        if not rows:
            raise SourceError(f"manifest {self.manifest} has no rows")
        columns = list(rows[0].keys())
        if path_column not in columns:
            raise SourceError(
                f"manifest {self.manifest} has no '{path_column}' column (columns: {columns}); "
                f"name the path column with path_column= / --path-column"
            )
        unknown = sorted(set(self.missing) - set(columns) | ({path_column} & set(self.missing)))
        if unknown:
            raise SourceError(
                f"missing= names {unknown}, not a value column of manifest {self.manifest} (value "
                f"columns: {[c for c in columns if c != path_column]})"
            )
        for line, row in zip(self.lines, rows):
            if list(row.keys()) != columns:
                got = [k for k in row if k is not None]
                raise SourceError(
                    f"manifest {self.manifest}, line {line}: columns {got}"
                    f"{' and values past the last column' if None in row else ''} differ from "
                    f"the first row's {columns}"
                )
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
        where = f"manifest {self.manifest}"
        if name in self.missing:  # declared: a blank or null cell stands for this value
            fill = self.missing[name]
            text = all(isinstance(v, str) for v in vals if not _blank(v))  # CSV: the fill is parsed as its cells are
            token = (fill if isinstance(fill, str) else json.dumps(fill)) if text else fill
            vals = [token if _blank(v) else v for v in vals]
        for line, v in zip(self.lines, vals):
            if v is None or isinstance(v, (list, dict)):
                what = (
                    (
                        f"is missing (null or absent; declare what that means with missing={{'{name}': VALUE}}, "
                        f"--missing {name}=VALUE)"
                    )
                    if v is None
                    else f"holds {v!r}, not a number or string"
                )
                raise SourceError(f"{where}, line {line}, column '{name}' {what}")
        if all(isinstance(v, str) for v in vals):  # CSV, or JSON strings
            return self._text_column(name, safe, vals)
        if all(isinstance(v, (int, bool)) for v in vals):
            return Field.int(safe), [int(v) for v in vals]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            return Field.float(safe), [float(v) for v in vals]
        first = type(vals[0])
        line, odd = next((ln, v) for ln, v in zip(self.lines, vals) if not isinstance(v, first))
        kinds = sorted({type(v).__name__ for v in vals})
        raise SourceError(
            f"{where}, column '{name}' mixes value types {kinds}: line {line} holds {odd!r}, line "
            f"{self.lines[0]} {vals[0]!r}"
        )

    def _text_column(self, name: str, safe: str, vals: list[str]) -> tuple[Field, list[Any]]:
        """int, float or str, never a type chosen because of one bad cell (see the module docstring)."""
        where = f"manifest {self.manifest}"
        filled = [(ln, v) for ln, v in zip(self.lines, vals) if v.strip()]
        padded = [bool(_PADDED.fullmatch(v)) for _, v in filled]
        if any(padded) and all(p or _parse_int(v) is not None for p, (_, v) in zip(padded, filled)):
            return Field.str(safe), vals  # ids such as "007", "0042": as written, never 7 and 42
        numbers = [p or _parse_float(v) is not None for p, (_, v) in zip(padded, filled)]
        if filled and all(numbers):
            blank = next((ln for ln, v in zip(self.lines, vals) if not v.strip()), None)
            if blank is not None:
                raise SourceError(
                    f"{where}, line {blank}, column '{name}' is blank, in a column of numbers: fill "
                    f"it in, remove the line, or declare what a blank means with "
                    f"missing={{'{name}': VALUE}} (--missing {name}=VALUE); fastload does not guess one"
                )
            ints = [_parse_int(v) for v in vals]
            if all(i is not None for i in ints):
                return Field.int(safe), ints
            return Field.float(safe), [_parse_float(v) for v in vals]
        if sum(numbers) * 2 > len(numbers):
            line, bad = next(c for c, num in zip(filled, numbers) if not num)
            raise SourceError(
                f"{where}, line {line}, column '{name}': {bad!r} is not a number, though "
                f"{sum(numbers)} of the column's {len(filled)} values are: fix the cell (a column is "
                f"text only when most of its values are)"
            )
        return Field.str(safe), vals

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
        return f"{self._path(i)} (manifest {self.manifest}, line {self.lines[i]})"

    def fingerprint(self) -> str:
        h = hashlib.sha256(self.manifest.read_bytes())
        h.update(str(self.root.resolve()).encode())
        if self.missing:
            h.update(json.dumps(self.missing, sort_keys=True, default=str).encode())
        return "manifest:" + h.hexdigest()
