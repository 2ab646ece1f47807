"""Source adapters: what ``fastload.pack`` can read.

========================  =======================================================
``imagefolder.py``        class-per-subdirectory image trees (torchvision layout)
``arrays.py``             numpy arrays in memory, ``.npy``, ``.npz``
``manifest.py``           CSV / JSONL manifests of file paths plus columns
``dataset.py``            any map-style ``torch.utils.data.Dataset``
``parquet.py``            Parquet files (Hugging Face's too): a file, folder, glob; local or a URL
``webdataset.py``         WebDataset tar shards: a file, folder, glob or brace pattern; local or a URL
========================  =======================================================

``_files.py`` turns a Parquet or WebDataset spec into its files (local or fsspec).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .._errors import SourceError
from .._schema import Field
from ._base import Source
from .arrays import ArraySource
from .dataset import DatasetSource
from .imagefolder import ImageFolderSource
from .manifest import ManifestSource
from . import _files, parquet, webdataset
from ._files import is_pattern
from .parquet import ParquetSource
from .webdataset import WebDatasetSource

__all__ = [
    "Source",
    "ArraySource",
    "DatasetSource",
    "ImageFolderSource",
    "ManifestSource",
    "ParquetSource",
    "WebDatasetSource",
    "as_source",
    "is_pattern",
    "local_source",
]

# Sources named by a path, a URL, a glob or a brace pattern of their files (the files' suffixes pick the kind)
FILE_KINDS = ((parquet.SUFFIXES, ParquetSource), (webdataset.SUFFIXES + (".tar.gz", ".tgz"), WebDatasetSource))


def _file_kind(spec: str, deep: bool = False) -> type[Source] | None:
    """The adapter of FILE_KINDS for ``spec``: by its suffix, else (a local folder) by the files it holds, at its
    top level or (``deep``) anywhere; a folder holding both kinds is refused."""
    for suffixes, kind in FILE_KINDS:
        if spec.lower().rstrip("/").endswith(suffixes):
            return kind
    if _files.is_url(spec) or _files.is_pattern(spec) or not os.path.isdir(spec):
        return None
    held = [kind for suffixes, kind in FILE_KINDS if _files.folder_holds(Path(spec), suffixes, deep)]
    if len(held) > 1:
        raise SourceError(
            f"the folder {spec} holds both Parquet files and tar shards: name the ones to pack with a "
            f"glob such as '{spec.rstrip('/')}/*.parquet'"
        )
    return held[0] if held else None


def local_source(path: Path) -> Source | None:
    """What ``fastload.open`` packs once into its cache for a local path that holds no dataset: an ImageFolder,
    Parquet files or WebDataset shards (a file, folder, glob or brace pattern). None for a file or pattern of
    another kind; a SourceError for a folder none of these reads, or files of these kinds that cannot be read."""
    kind = _file_kind(os.fspath(path))
    if kind is not None:
        return kind(path)
    if not path.is_dir():
        return None
    try:
        with warnings.catch_warnings(record=True) as said:  # the ImageFolder's own, once it is one
            warnings.simplefilter("always")
            folder = ImageFolderSource(path)
    except SourceError:
        kind = _file_kind(os.fspath(path), deep=True)
        if kind is None:
            raise
        return kind(path)
    for w in said:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return folder


def as_source(
    obj: Any,
    *,
    schema: Mapping[str, Field] | None = None,
    root: str | os.PathLike | None = None,
    path_column: str = "path",
    missing: Mapping[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Source:
    """Pick the adapter for ``obj``: a path (folder, .npy/.npz, .csv/.jsonl, Parquet, tar shards; those two also
    as a glob, a brace pattern or a URL, read with ``storage_options``), arrays, or a Dataset."""
    if isinstance(obj, Source):
        return obj
    if isinstance(obj, (str, os.PathLike)):
        kind = _file_kind(os.fspath(obj))
        if kind is None and _files.is_url(os.fspath(obj)):
            names = _files.url_folder_files(os.fspath(obj), dict(storage_options or {}))
            held = [k for suffixes, k in FILE_KINDS if any(n.lower().endswith(suffixes) for n in names)]
            if len(held) != 1:
                raise SourceError(
                    f"source {os.fspath(obj)}: a URL source names Parquet files (.parquet) or "
                    f"WebDataset shards (.tar): a file, a folder holding one of the two, a glob or a "
                    f"brace pattern"
                )
            kind = held[0]
        if kind is not None:
            if schema or missing:
                raise SourceError(
                    f"schema= and missing= are not supported for {kind.__name__} sources: their "
                    f"fields come from the files"
                )
            return kind(obj, storage_options=dict(storage_options or {}))
    manifest = isinstance(obj, (str, os.PathLike)) and Path(obj).suffix.lower() in (".csv", ".jsonl", ".ndjson")
    if missing and not manifest:
        raise SourceError(
            "missing= declares what blank cells of a CSV/JSONL manifest's columns stand for; this "
            "source is not a manifest"
        )
    if isinstance(obj, (str, os.PathLike)):
        path = Path(obj)
        if not path.exists():
            raise SourceError(f"source {path} does not exist")
        suffix = path.suffix.lower()
        if path.is_dir():
            if schema:
                raise SourceError("schema overrides are not supported for ImageFolder sources")
            return local_source(path)
        if suffix in (".npy", ".npz"):
            return ArraySource(path, schema)
        if suffix in (".csv", ".jsonl", ".ndjson"):
            if schema:
                raise SourceError("schema overrides are not supported for manifest sources")
            return ManifestSource(path, root=root, path_column=path_column, missing=missing)
        raise SourceError(
            f"source {path}: expected a folder, .npy, .npz, .csv or .jsonl file, Parquet files "
            f"(.parquet) or WebDataset shards (.tar)"
        )
    if isinstance(obj, np.ndarray) or (
        isinstance(obj, Mapping) and obj and all(isinstance(v, np.ndarray) for v in obj.values())
    ):
        return ArraySource(obj, schema)
    if isinstance(obj, (tuple, list)) and obj and all(isinstance(v, np.ndarray) for v in obj):
        return ArraySource(obj, schema)
    if hasattr(obj, "__getitem__") and hasattr(obj, "__len__"):
        return DatasetSource(obj, schema)
    raise SourceError(
        f"cannot pack a {type(obj).__name__}: expected a folder, a numpy file or arrays, a CSV/JSONL "
        f"manifest, or a map-style torch Dataset"
    )
