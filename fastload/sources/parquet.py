"""Parquet: a file, a folder of them (recursively, sorted; one split only), a glob, or a brace pattern, local
or at a URL fsspec reads (``pip install 'torch-fastload[parquet]'``). One row per sample, one field per column.

Columns to fields:

======================================  ===========================================================
Hugging Face ``Image`` (``{bytes, path}``)  ``image``: the encoded bytes as they are (a JPEG is stored byte
                                        for byte under ``--image-mode auto``)
Hugging Face ``Audio``, other ``{bytes, path}``  ``bytes``: the encoded bytes untouched
binary                                  ``image`` when its first value is a picture PIL knows (and no
                                        Hugging Face feature says otherwise), else ``bytes``
string                                  ``str``
integer, bool                           ``int`` (the label ``ClassLabel``'s names: the dataset's ``classes``)
float                                   ``float``
list / fixed-size list of numbers       ``ndarray``: fixed-size lists give fixed dimensions, others vary
======================================  ===========================================================

Hugging Face keeps a dataset's features as JSON under the ``huggingface`` key of the Arrow schema's metadata;
they decide the image/audio/ClassLabel cases where present. Any other column type is refused at open, naming
the column. Rows are read a row group at a time (a worker keeps one decoded row group), so a file of any
size streams. A null in any column fails at open when the row groups' statistics show it (naming the file and
row), else when its row is packed. Rows are named ``file row N``, counted from 0 within the file.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import json
import os
from typing import Any

import numpy as np

from .._errors import SourceError
from .._install import pil, pip_extra
from .._schema import Field, Schema
from ._base import Source, class_metadata
from ._files import Files, warn_one_process

SUFFIXES = (".parquet", ".pq")
NUMERIC = "int, float or bool"


def _pq() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(f"reading Parquet needs pyarrow: {pip_extra('parquet')}") from None
    return pq


def is_image(data: bytes | None) -> bool:
    """Whether ``data`` is an encoded picture PIL knows (by its header; nothing is decoded)."""
    if not data:
        return False
    Image = pil("telling a Parquet column's pictures from other bytes")

    try:
        with Image.open(io.BytesIO(data)):
            return True
    except (OSError, ValueError):  # UnidentifiedImageError is an OSError
        return False


def _safe(name: str) -> str:
    safe = name if name.isidentifier() else "_" + "".join(ch if ch.isalnum() else "_" for ch in name)
    return safe + "_" if safe in ("False", "None", "True") or not safe.isidentifier() else safe


class _Column:
    """How one Parquet column becomes one field: ``kind`` 'media' (a {bytes, path} struct), 'value', 'list'."""

    def __init__(self, name: str, kind: str, field: Field):
        self.name, self.kind, self.field = name, kind, field


class ParquetSource(Source):
    """Rows of Parquet files (the module docstring)."""

    def __init__(self, spec: str | os.PathLike, storage_options: dict | None = None):
        pq = _pq()
        self.files = Files(spec, SUFFIXES, "Parquet", storage_options)
        self.root = self.files.spec
        self.parallel = not self.files.url
        if self.files.url:
            warn_one_process(self.files, "each pack worker would download every row group")
        self.starts: list[int] = []  # global row where each row group starts
        self.groups: list[tuple[int, int, int]] = []  # (file, row group, first row within the file)
        first = None
        total = 0
        for k, path in enumerate(self.files.paths):
            with self.files.open(path) as fh:
                try:
                    meta = pq.ParquetFile(fh).metadata
                except Exception as e:  # pyarrow's ArrowInvalid, OSError...: not a Parquet file
                    raise SourceError(f"cannot read Parquet file {self.files.name(path)}: {e}") from None
            schema = meta.schema.to_arrow_schema()
            if first is None:
                first = schema
            elif not schema.remove_metadata().equals(first.remove_metadata()):
                raise SourceError(
                    f"Parquet file {self.files.name(path)} has columns {_describe(schema)}, but "
                    f"{self.files.name(self.files.paths[0])} has {_describe(first)}: a source's "
                    f"files must share their columns"
                )
            elif _class_names(_hf_features(schema)) != _class_names(_hf_features(first)):
                raise SourceError(
                    f"Parquet file {self.files.name(path)} names its classes "
                    f"{_shown(_class_names(_hf_features(schema)))}, but {self.files.name(self.files.paths[0])} "
                    f"{_shown(_class_names(_hf_features(first)))}: one dataset has one list of class names"
                )
            within = 0
            for g in range(meta.num_row_groups):
                rows = meta.row_group(g).num_rows
                if rows:
                    self.starts.append(total)
                    self.groups.append((k, g, within))
                total += rows
                within += rows
        self.n = total
        if not total:
            raise SourceError(f"Parquet source {self.files.spec} has no rows")
        self.arrow_schema = first
        features = _hf_features(first)
        self.columns = [self._column(name, first.field(name).type, features.get(name) or {}) for name in first.names]
        names = [c.field.name for c in self.columns]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise SourceError(
                f"Parquet source {self.files.spec}: columns {[c.name for c in self.columns]} give "
                f"the same field name(s) {dup} once made Python identifiers"
            )
        self.schema = Schema(c.field for c in self.columns)
        self.metadata = {"source": "parquet", "spec": self.files.spec}
        self.metadata.update(_class_names(features))
        self._cached: tuple[Any, list[list]] | None = None
        self._file: tuple[int, int, Any, Any] | None = None  # (pid, file, ParquetFile, file handle)
        self._check_nulls()

    # -- schema ---------------------------------------------------------------------------------
    def _column(self, name: str, t: Any, feature: dict) -> _Column:
        import pyarrow as pa

        safe, hf = _safe(name), feature.get("_type")
        if pa.types.is_dictionary(t):
            t = t.value_type
        if pa.types.is_struct(t) and {t.field(i).name for i in range(t.num_fields)} >= {"bytes"}:
            if hf == "Image" or (hf is None and is_image(self._first_value(name, "bytes"))):
                return _Column(name, "media", Field.image(safe))
            return _Column(name, "media", Field.bytes(safe))
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
            if hf == "Image" or (hf is None and is_image(self._first_value(name))):
                return _Column(name, "value", Field.image(safe))
            return _Column(name, "value", Field.bytes(safe))
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return _Column(name, "value", Field.str(safe))
        if pa.types.is_integer(t) or pa.types.is_boolean(t):
            return _Column(name, "value", Field.int(safe))
        if pa.types.is_floating(t):
            return _Column(name, "value", Field.float(safe))
        shape: list[int | None] = []
        leaf = t
        while pa.types.is_list(leaf) or pa.types.is_large_list(leaf) or pa.types.is_fixed_size_list(leaf):
            shape.append(leaf.list_size if pa.types.is_fixed_size_list(leaf) else None)
            leaf = leaf.value_type
        if shape and (pa.types.is_integer(leaf) or pa.types.is_floating(leaf) or pa.types.is_boolean(leaf)):
            fixed = feature.get("shape") if hf in ("Array2D", "Array3D", "Array4D", "Array5D") else None
            if isinstance(fixed, list) and len(fixed) == len(shape):
                shape = [d if isinstance(d, int) and d >= 0 else None for d in fixed]
            dtype = np.bool_ if pa.types.is_boolean(leaf) else leaf.to_pandas_dtype()
            return _Column(name, "list", Field.ndarray(safe, dtype, shape))
        raise SourceError(
            f"Parquet source {self.files.spec}: column '{name}' is of type {t}, which fastload has "
            f"no field for (it stores images, bytes, strings, numbers and lists of numbers); "
            f"write the files without it, or convert it to one of those"
        )

    def _first_value(self, name: str, child: str | None = None) -> bytes | None:
        """The first non-null value of a binary column (or struct child), to tell pictures from other bytes."""
        pq = _pq()
        for k, g, _ in self.groups:
            with self.files.open(self.files.paths[k]) as fh:
                col = pq.ParquetFile(fh).read_row_group(g, columns=[name]).column(0).combine_chunks()
            if child is not None:
                col = dict(zip((f.name for f in col.type), col.flatten()))[child]
            for v in col.to_pylist():
                if v is not None:
                    return v
        return None

    # -- nulls ----------------------------------------------------------------------------------
    def _check_nulls(self) -> None:
        """Any null the row groups' statistics show fails now, naming its file and row."""
        pq = _pq()
        by_file: dict[int, list[int]] = {}
        for idx, (k, _g, _) in enumerate(self.groups):
            by_file.setdefault(k, []).append(idx)
        for k, idxs in by_file.items():
            with self.files.open(self.files.paths[k]) as fh:
                pf = pq.ParquetFile(fh)
                meta = pf.metadata
                for idx in idxs:
                    _, g, _ = self.groups[idx]
                    rg = meta.row_group(g)
                    for c in self.columns:
                        if any(self._leaf_nulls(rg, j, c) for j in range(rg.num_columns)):
                            rows = _columns_as_lists(pf.read_row_group(g, columns=[c.name]), [c])[0]
                            bad = next((r for r, v in enumerate(rows) if v is None), None)
                            if bad is not None:
                                raise SourceError(f"{self._row_name(idx, bad)}: {self._null(c)}")

    @staticmethod
    def _leaf_nulls(rg: Any, j: int, c: _Column) -> bool:
        col = rg.column(j)
        path = col.path_in_schema
        if path != c.name and not path.startswith(c.name + "."):
            return False
        if c.kind == "media" and path != f"{c.name}.bytes":
            return False  # a {bytes, path} struct's path is often null: only the bytes matter
        stats = col.statistics
        return stats is not None and stats.has_null_count and stats.null_count > 0

    def _null(self, c: _Column) -> str:
        what = "no image bytes" if c.field.kind == "image" else "no value"
        return f"column '{c.name}' is null ({what}); fastload does not guess a value: fill it in or remove the row"

    # -- rows -----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.n

    def _locate(self, i: int) -> tuple[int, int]:
        if not 0 <= i < self.n:
            raise IndexError(f"row {i} of a Parquet source of {self.n} rows")
        idx = bisect.bisect_right(self.starts, i) - 1
        return idx, i - self.starts[idx]

    def _group(self, idx: int) -> list[list]:
        if self._cached is not None and self._cached[0] == (os.getpid(), idx):
            return self._cached[1]
        pq = _pq()
        k, g, _ = self.groups[idx]
        pid = os.getpid()
        if self._file is None or self._file[:2] != (pid, k):
            if self._file is not None and self._file[0] == pid and self._file[3] is not None:
                self._file[3].close()
            path = self.files.paths[k]
            fh = self.files.open(path) if self.files.url else None  # a local file: pyarrow's own reader
            try:
                self._file = (pid, k, pq.ParquetFile(fh if fh is not None else path), fh)
            except Exception as e:
                if fh is not None:
                    fh.close()
                raise SourceError(f"cannot read Parquet file {self.files.name(path)}: {e}") from None
        table = self._file[2].read_row_group(g, columns=[c.name for c in self.columns])
        self._cached = None  # the old group is freed before the next is kept
        self._cached = ((pid, idx), _columns_as_lists(table, self.columns))
        return self._cached[1]

    def load(self, i: int) -> list:
        idx, r = self._locate(i)
        out = []
        for c, values in zip(self.columns, self._group(idx)):
            v = values[r]
            if v is None:
                raise ValueError(self._null(c))
            if c.kind == "list":
                try:
                    v = np.asarray(v, dtype=np.dtype(c.field.dtype))
                except ValueError:
                    raise ValueError(
                        f"column '{c.name}' holds nested lists of different lengths (a ragged "
                        f"array), which an ndarray field cannot store"
                    ) from None
            out.append(v)
        return out

    def _row_name(self, idx: int, r: int) -> str:
        k, _, within = self.groups[idx]
        return f"{self.files.name(self.files.paths[k])} row {within + r}"

    def describe(self, i: int) -> str:
        return self._row_name(*self._locate(i))

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for p in self.files.paths:
            h.update(self.files.identity(p).encode() + b"\n")
        return "parquet:" + h.hexdigest()

    def cache_key(self) -> str:
        return self.fingerprint()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_cached": None, "_file": None}


def _columns_as_lists(table: Any, columns: list[_Column]) -> list[list]:
    """Each column of a row group as one Python list (a media struct: its bytes; None where null)."""
    out = []
    for c in columns:
        col = table.column(c.name).combine_chunks()
        if c.kind == "media":
            # flatten(): the children with the struct's offset and its nulls applied (field() gives neither)
            children = dict(zip((f.name for f in col.type), col.flatten()))
            out.append(children["bytes"].to_pylist())
        else:
            values = col.to_pylist()
            for r in _rows_holding_nulls(col) if c.kind == "list" else ():
                values[r] = None  # a list with a null in it is no array: refused as a null
            out.append(values)
    return out


def _rows_holding_nulls(col: Any) -> np.ndarray:
    """The rows of a (nested) list array with a null element at any depth."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = np.arange(len(col))
    bad = [np.nonzero(col.is_null().to_numpy(zero_copy_only=False))[0]]
    arr = col
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        parents = pc.list_parent_indices(arr).to_numpy()
        arr = arr.flatten()
        rows = rows[parents]
        bad.append(rows[arr.is_null().to_numpy(zero_copy_only=False)])
    return np.unique(np.concatenate(bad))


def _describe(schema: Any) -> str:
    return "[" + ", ".join(f"{f.name}: {f.type}" for f in schema) + "]"


def _hf_features(schema: Any) -> dict:
    """Hugging Face's features (column -> {'_type': ...}) from the Arrow schema's metadata, or {}."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw:
        return {}
    try:
        features = (json.loads(raw).get("info") or {}).get("features") or {}
    except (ValueError, AttributeError):
        return {}
    return features if isinstance(features, dict) else {}


def _class_names(features: dict) -> dict:
    """The ``ClassLabel`` columns of Hugging Face's schema metadata, as ``_base.class_metadata`` names them."""
    labels = {
        name: f["names"]
        for name, f in features.items()
        if isinstance(f, dict)
        and f.get("_type") == "ClassLabel"
        and isinstance(f.get("names"), list)
        and all(isinstance(n, str) for n in f["names"])
    }
    return class_metadata(labels)


def _shown(names: dict) -> Any:
    return names.get("classes", names.get("class_names"))
