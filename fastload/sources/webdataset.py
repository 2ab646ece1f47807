"""WebDataset tar shards: a ``.tar`` file, a folder of them (recursively, sorted; one split only), a glob or a
brace pattern (``shard-{000..009}.tar``), local or at a URL fsspec reads. Read with Python's ``tarfile``.

Members are grouped into samples by webdataset's rule: a member's key is its path up to the first dot of its
last component, its extension the rest, lower-cased (``a/b/0001.seg.png``: key ``a/b/0001``, extension
``seg.png``); consecutive members with one key are one sample. Directories and webdataset's ``__*__`` metadata
members are not samples. Every sample must have the same extensions, each once. Extensions to fields:

==================================================  ===============================================
``jpg jpeg png webp`` (and torchvision's others)    ``image``: the encoded bytes as they are
``cls cls2 class count index inx id``               ``int`` (the member's text, e.g. ``3``)
``txt text``                                        ``str`` (UTF-8)
``json jsn``                                        ``str``: the JSON text, checked to parse
``npy``                                             ``ndarray`` (dtype and shape from every member's
                                                    header, read at open; dimensions that differ vary)
anything else (``seg.png``, ``mp3``, ``pth``, ...)  ``bytes``, untouched (never unpickled)
==================================================  ===============================================

A field is named by its extension, dots made underscores (``jpg``, ``cls``, ``seg_png``). The shards' headers
are read at open (a seek per member; a URL's are read through fsspec's read-ahead), so a corrupt or truncated
shard, a sample missing a field another has, a sample split across two shards (which webdataset joins), or a
repeated extension fails there, naming the shard and key.
Samples are named ``shard key``. Compressed shards (``.tar.gz``) are refused: members cannot be read by offset.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
from typing import Any

import numpy as np

from .._errors import SchemaError, SourceError
from .._schema import Field, Schema
from ._base import Source
from ._files import Files, warn_one_process
from .imagefolder import IMG_EXTENSIONS

SUFFIXES = (".tar",)
IMAGE_EXTS = tuple(e.lstrip(".") for e in IMG_EXTENSIONS)
INT_EXTS = ("cls", "cls2", "class", "count", "index", "inx", "id")
TEXT_EXTS = ("txt", "text")
JSON_EXTS = ("json", "jsn")
_KEY = re.compile(r"^((?:.*/|)[^./]+)[.]([^/]*)$")  # webdataset's base_plus_ext


def split_key(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member name by webdataset's rule, or None when its last component has no dot."""
    m = _KEY.match(name)
    return (m.group(1), m.group(2).lower()) if m else None


def _field_name(ext: str) -> str:
    safe = re.sub(r"\W", "_", ext)
    return "_" + safe if not safe.isidentifier() or safe in ("None", "True", "False") else safe


class WebDatasetSource(Source):
    """Samples of WebDataset tar shards (the module docstring)."""

    def __init__(self, spec: str | os.PathLike, storage_options: dict | None = None):
        spec = os.fspath(spec)
        if spec.lower().endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")):
            raise SourceError(
                f"WebDataset source {spec}: compressed shards cannot be read member by member; "
                f"decompress them to .tar first (gunzip, xz -d, zstd -d)"
            )
        self.files = Files(spec, SUFFIXES, "WebDataset", storage_options)
        self.root = self.files.spec
        self.parallel = not self.files.url
        if self.files.url:
            warn_one_process(
                self.files, "each pack worker would download the blocks around its samples, most of every shard"
            )
        self.shard: list[int] = []  # per sample
        self.keys: list[str] = []
        self.members: dict[str, list[tuple[int, int]]] = {}  # extension -> (offset, size) per sample
        self.npy: dict[str, tuple[np.dtype, list[int | None], str]] = {}
        # a shard's last sample, added once the next shard's first member shows it does not continue there
        self._pending: tuple[int, str, str, dict[str, tuple[int, int]]] | None = None
        for k, path in enumerate(self.files.paths):
            self._scan(k, path)
        if self._pending is not None:
            self._add(*self._pending)
        del self._pending
        if not self.keys:
            raise SourceError(f"WebDataset source {self.files.spec} holds no sample (no member named key.extension)")
        fields = []
        for ext in self.members:
            name = _field_name(ext)
            if name in [f.name for f in fields]:
                other = next(e for e in self.members if _field_name(e) == name)
                raise SourceError(
                    f"WebDataset source {self.files.spec}: extensions '{other}' and '{ext}' both give "
                    f"the field name '{name}'"
                )
            fields.append(self._field(ext, name))
        self.exts = list(self.members)
        # numpy, not lists of tuples: a pack worker forked from this process reads them without copying pages
        self.offsets = {e: np.array(v, dtype=np.int64).reshape(-1, 2) for e, v in self.members.items()}
        self.shard_of = np.array(self.shard, dtype=np.int32)
        del self.members, self.shard
        self.schema = Schema(fields)
        self.metadata = {"source": "webdataset", "spec": self.files.spec}
        self._file: tuple[int, int, Any] | None = None  # (pid, shard, open file)

    # -- the index ------------------------------------------------------------------------------
    def _scan(self, k: int, path: str) -> None:
        name = self.files.name(path)
        last = None
        seen: set[str] = set()
        current: dict[str, tuple[int, int]] | None = None
        key = None
        with self.files.open(path) as fh:
            try:
                with tarfile.open(fileobj=fh, mode="r:") as tf:
                    for m in tf:
                        where = m.name
                        if not m.isreg():
                            if m.isdir():
                                continue
                            raise SourceError(
                                f"WebDataset shard {name}: member '{m.name}' is not a regular file "
                                f"(a link or device); shards hold files only"
                            )
                        base = m.name.rsplit("/", 1)[-1]
                        if "/" not in m.name and base.startswith("__") and base.endswith("__"):
                            continue  # webdataset's metadata members
                        parts = split_key(m.name)
                        if parts is None:
                            raise SourceError(
                                f"WebDataset shard {name}: member '{m.name}' has no extension, so it "
                                f"belongs to no sample's field (members are named key.extension)"
                            )
                        mkey, ext = parts
                        if mkey != key:
                            if current is not None:
                                self._add(k, name, key, current)
                            else:
                                self._continues(name, mkey, ext)
                            if mkey in seen:
                                raise SourceError(
                                    f"WebDataset shard {name}: key '{mkey}' appears again after other "
                                    f"keys (member '{m.name}'); a sample's members must be "
                                    f"consecutive"
                                )
                            seen.add(mkey)
                            key, current = mkey, {}
                        if ext in current:
                            raise SourceError(
                                f"WebDataset shard {name}, key '{key}': extension '{ext}' appears "
                                f"twice (member '{m.name}')"
                            )
                        current[ext] = (m.offset_data, m.size)
                        if ext == "npy":
                            self._npy_header(name, key, tf.extractfile(m))
                        last = where
                    end = tf.offset
                # tarfile ends quietly at a garbled header past the first: the archive must end there
                fh.seek(end)
                tail = fh.read(512)
            except (tarfile.TarError, EOFError, OSError) as e:
                after = f" after member '{last}'" if last else ""
                raise SourceError(f"WebDataset shard {name} is corrupt or truncated{after}: {e}") from None
        if len(tail) < 512 or tail.count(0) != 512:
            after = f" after member '{last}'" if last else " at its start"
            raise SourceError(
                f"WebDataset shard {name} is corrupt or truncated{after} (offset {end}): what follows "
                f"is neither a member header nor the end-of-archive marker"
            )
        if current is not None:
            self._pending = (k, name, key, current)

    def _continues(self, name: str, key: str, ext: str) -> None:
        """At a shard's first member: refuse the shard before's last sample going on here (webdataset's
        ``group_by_keys`` joins one key's consecutive members across shards; a sample here lies in one shard),
        else add that sample. The same key with an extension it already has starts a new sample, as there."""
        if self._pending is None:
            return
        k, before, pkey, members = self._pending
        self._pending = None
        if pkey == key and ext not in members:
            raise SourceError(
                f"WebDataset key '{key}' is split across shards: {before} holds its {', '.join(members)} "
                f"members, {name} its {ext} member (and any that follow); fastload reads each sample from one "
                f"shard: write each sample's members into one shard (webdataset's ShardWriter does)"
            )
        self._add(k, before, pkey, members)

    def _add(self, k: int, name: str, key: str, members: dict[str, tuple[int, int]]) -> None:
        if self.keys:
            missing = [e for e in self.members if e not in members]
            extra = [e for e in members if e not in self.members]
            if missing or extra:
                what = f"has no '{missing[0]}' member" if missing else f"has a '{extra[0]}' member"
                first = f"{self.files.name(self.files.paths[self.shard[0]])}, key '{self.keys[0]}'"
                raise SourceError(
                    f"WebDataset shard {name}, key '{key}' {what}, unlike the first sample ({first}: "
                    f"{', '.join(self.members)}); every sample needs the same fields"
                )
        else:
            self.members = {e: [] for e in members}
        for e, at in members.items():
            self.members[e].append(at)
        self.shard.append(k)
        self.keys.append(key)

    def _npy_header(self, name: str, key: str, f: Any) -> None:
        try:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
        except (ValueError, OSError, EOFError) as e:
            raise SourceError(
                f"WebDataset shard {name}, key '{key}': the .npy member is not a numpy file ({e})"
            ) from None
        seen = self.npy.get("npy")
        if seen is None:
            self.npy["npy"] = (dtype, list(shape), f"{name}, key '{key}'")
            return
        dt, dims, first = seen
        if dtype != dt or len(shape) != len(dims):
            raise SourceError(
                f"WebDataset shard {name}, key '{key}': the .npy member is {dtype} of shape {shape}, "
                f"but the first ({first}) is {dt} with {len(dims)} dimensions; an ndarray field has "
                f"one dtype and one number of dimensions"
            )
        self.npy["npy"] = (dt, [d if d == s else None for d, s in zip(dims, shape)], first)

    def _field(self, ext: str, name: str) -> Field:
        if ext in IMAGE_EXTS:
            return Field.image(name)
        if ext in INT_EXTS:
            return Field.int(name)
        if ext in TEXT_EXTS or ext in JSON_EXTS:
            return Field.str(name)
        if ext == "npy":
            dtype, shape, first = self.npy["npy"]
            try:
                return Field.ndarray(name, dtype, shape)
            except SchemaError as e:
                raise SourceError(
                    f"WebDataset source {self.files.spec}: the .npy members ({first}) cannot be stored: {e}"
                ) from None
        return Field.bytes(name)

    # -- samples --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.keys)

    def _read(self, k: int, offset: int, size: int) -> bytes:
        pid = os.getpid()
        if self._file is None or self._file[:2] != (pid, k):
            if self._file is not None and self._file[0] == pid:
                self._file[2].close()
            self._file = (pid, k, self.files.open(self.files.paths[k]))
        fh = self._file[2]
        fh.seek(offset)
        data = fh.read(size)
        if len(data) != size:
            raise ValueError(f"the shard ends {size - len(data)} bytes early (it changed after it was opened?)")
        return data

    def load(self, i: int) -> list:
        out: list[Any] = []
        for ext, f in zip(self.exts, self.schema):
            offset, size = (int(v) for v in self.offsets[ext][i])
            data = self._read(int(self.shard_of[i]), offset, size)
            try:
                out.append(_value(f, ext, data))
            except (ValueError, UnicodeDecodeError) as e:
                raise ValueError(f"member '{self.keys[i]}.{ext}': {e}") from None
        return out

    def describe(self, i: int) -> str:
        return f"{self.files.name(self.files.paths[self.shard_of[i]])} key '{self.keys[i]}'"

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for p in self.files.paths:
            h.update(self.files.identity(p).encode() + b"\n")
        return "webdataset:" + h.hexdigest()

    def cache_key(self) -> str:
        return self.fingerprint()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_file": None}


def _value(field: Field, ext: str, data: bytes) -> Any:
    if field.kind in ("image", "bytes"):
        return data
    if field.kind == "int":
        text = data.decode("utf-8").strip()
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{text[:40]!r} is not an integer class") from None
    if field.kind == "ndarray":
        return np.load(io.BytesIO(data), allow_pickle=False)
    text = data.decode("utf-8")
    if ext in JSON_EXTS:
        try:
            json.loads(text)
        except ValueError as e:
            raise ValueError(f"not valid JSON ({e})") from None
    return text
