"""Source adapters: what ``fastload.pack`` can read.

========================  =======================================================
``imagefolder.py``        class-per-subdirectory image trees (torchvision layout)
``arrays.py``             numpy arrays in memory, ``.npy``, ``.npz``
``manifest.py``           CSV / JSONL manifests of file paths plus columns
``dataset.py``            any map-style ``torch.utils.data.Dataset``
========================  =======================================================
"""

from __future__ import annotations

import os
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

__all__ = ["Source", "ArraySource", "DatasetSource", "ImageFolderSource", "ManifestSource", "as_source"]


def as_source(obj: Any, *, schema: Mapping[str, Field] | None = None, root: str | os.PathLike | None = None,
              path_column: str = "path", missing: Mapping[str, Any] | None = None) -> Source:
    """Pick the adapter for ``obj``: a path (folder, .npy/.npz, .csv/.jsonl), arrays, or a Dataset."""
    if isinstance(obj, Source):
        return obj
    manifest = isinstance(obj, (str, os.PathLike)) and Path(obj).suffix.lower() in (".csv", ".jsonl", ".ndjson")
    if missing and not manifest:
        raise SourceError("missing= declares what blank cells of a CSV/JSONL manifest's columns stand for; this "
                          "source is not a manifest")
    if isinstance(obj, (str, os.PathLike)):
        path = Path(obj)
        if not path.exists():
            raise SourceError(f"source {path} does not exist")
        suffix = path.suffix.lower()
        if path.is_dir():
            if schema:
                raise SourceError("schema overrides are not supported for ImageFolder sources")
            return ImageFolderSource(path)
        if suffix in (".npy", ".npz"):
            return ArraySource(path, schema)
        if suffix in (".csv", ".jsonl", ".ndjson"):
            if schema:
                raise SourceError("schema overrides are not supported for manifest sources")
            return ManifestSource(path, root=root, path_column=path_column, missing=missing)
        raise SourceError(f"source {path}: expected a folder, .npy, .npz, .csv or .jsonl file")
    if isinstance(obj, np.ndarray) or (isinstance(obj, Mapping) and obj and
                                        all(isinstance(v, np.ndarray) for v in obj.values())):
        return ArraySource(obj, schema)
    if isinstance(obj, (tuple, list)) and obj and all(isinstance(v, np.ndarray) for v in obj):
        return ArraySource(obj, schema)
    if hasattr(obj, "__getitem__") and hasattr(obj, "__len__"):
        return DatasetSource(obj, schema)
    raise SourceError(f"cannot pack a {type(obj).__name__}: expected a folder, a numpy file or arrays, a CSV/JSONL "
                      f"manifest, or a map-style torch Dataset")
