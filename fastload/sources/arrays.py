"""Numpy arrays: in memory (a dict or tuple of equally long arrays, or one array), ``.npy``, ``.npz``.

Row ``i`` of every array is sample ``i``. 1-D integer/bool arrays become ``int`` fields, 1-D float
arrays ``float`` fields, higher-dimensional arrays fixed-shape ``ndarray`` fields.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .._errors import SourceError
from .._schema import Field, Schema
from ..fields._codec import as_array
from ._base import Source


def _field_for(name: str, arr: np.ndarray, override: Field | None) -> Field:
    if override is not None:
        return override
    if arr.dtype.kind not in "biuf":
        raise SourceError(f"array '{name}' has dtype {arr.dtype}; only bool, integer and float arrays can be packed")
    if arr.ndim == 1:
        return Field.float(name) if arr.dtype.kind == "f" else Field.int(name)
    return Field.ndarray(name, arr.dtype, arr.shape[1:])


class ArraySource(Source):
    parallel = False

    def __init__(self, arrays: Any, schema: Mapping[str, Field] | None = None):
        self.origin = None
        if isinstance(arrays, (str, os.PathLike)):
            self.origin = Path(arrays)
            arrays = _load_file(self.origin)
        if isinstance(arrays, Mapping):
            named = {str(k): v for k, v in arrays.items()}
        elif isinstance(arrays, (tuple, list)):
            named = {("x", "y")[i] if len(arrays) == 2 else f"f{i}": a for i, a in enumerate(arrays)}
        else:
            named = {"x": arrays}
        self.arrays = {}
        for k, v in named.items():
            arr = as_array(v)
            if arr is None:
                arr = np.asarray(v)
            if arr.ndim == 0:
                raise SourceError(f"array '{k}' is a scalar; every array needs one row per sample")
            self.arrays[k] = arr
        lengths = {k: len(a) for k, a in self.arrays.items()}
        if len(set(lengths.values())) != 1:
            raise SourceError(f"arrays have different lengths: {lengths}")
        overrides = dict(schema or {})
        self.schema = Schema(_field_for(k, a, overrides.pop(k, None)) for k, a in self.arrays.items())
        if overrides:
            raise SourceError(f"schema overrides name unknown arrays {sorted(overrides)}")
        self.n = next(iter(lengths.values()))
        self.metadata = {"source": "arrays"}

    def __len__(self) -> int:
        return self.n

    def load(self, i: int) -> list:
        return [a[i] for a in self.arrays.values()]

    def describe(self, i: int) -> str:
        return f"{self.origin or 'arrays'} row {i}"

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for k, a in self.arrays.items():
            h.update(f"{k}:{a.dtype.str}:{a.shape}\n".encode())
            h.update(np.ascontiguousarray(a[: min(len(a), 64)]).tobytes())
        return "arrays:" + h.hexdigest()


def _load_file(path: Path) -> Any:
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise SourceError(f"cannot read numpy file {path}: {e}") from None
