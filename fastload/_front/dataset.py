"""``fastload.open``: a packed dataset (shards or LMDB) as a map-style torch Dataset."""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from .._errors import DecodeError, FormatError, where
from .._native import native
from .._schema import Field, Schema
from ..fields import ReadContext, codec_of
from ..formats._layout import IMAGE_JPEG
from ..formats.reader import (
    Located,
    PackedReader,
    local_segments,  # noqa: F401  (read_manifest: re-exported)
    read_manifest,
)
from ..formats.remote import Remote, is_url, warn_local_options
from .._augment.pipeline import reference as augment_reference
from .._augment.masks import moved_mask
from .._augment.mix import resolve_batch
from . import getitems_shm as _getitems_shm  # noqa: F401  (registers its rows in default_collate_fn_map before any copy of it)
from .._transforms.fields import check_lengths, check_sizes, resolve as resolve_transforms
from .._transforms.sequences import PackSequences


class Dataset(torch.utils.data.Dataset):
    """A packed dataset. ``ds[i]`` is a tuple in field order (or a dict with ``as_dict=True``).

    Field values come back as: image -> uint8 tensor (3, H, W) (a channels-last view of the decoded
    HxWx3 pixels), int -> int, float -> float, ndarray -> tensor (a copy), bytes -> bytes, str -> str.
    With ``decode=False`` images come back as their stored bytes (JPEG or raw) instead.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        transforms: Mapping[str, Any] | None = None,
        as_dict: bool = False,
        decode: bool = True,
        cache_dir: str | os.PathLike | None = None,
        cache_limit: int | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        batch_transforms: Any = None,
    ):
        self._remote: Remote | None = None
        self._lease = None  # fastload.open's lock on a folder's cached pack (_front/folder_cache.py), set after this
        if is_url(path):
            from ..pack import parse_size

            limit = None if cache_limit is None else parse_size(cache_limit)
            self._remote = Remote(
                str(path), cache_dir=cache_dir, cache_limit=limit, storage_options=dict(storage_options or {})
            )
            self.path: Path | str = self._remote.url
            self.manifest = self._remote.manifest
        else:
            warn_local_options(path, cache_dir=cache_dir, cache_limit=cache_limit, storage_options=storage_options)
            self.path = Path(path)
            self.manifest = read_manifest(self.path)
        self.schema: Schema = self.manifest.schema
        for name, value in (("as_dict", as_dict), ("decode", decode)):
            if not isinstance(value, (bool, np.bool_)):  # decode="no" is truthy: it would decode
                raise TypeError(f"fastload.open: {name}={value!r} should be a bool (True or False)")
        self.as_dict = bool(as_dict)
        self.decode = bool(decode)
        self.transforms, self.pipelines, self.sequences = resolve_transforms(transforms, self.schema)
        if batch_transforms is not None and not self.decode:
            raise ValueError(
                "fastload.open: batch_transforms (MixUp/CutMix) mix decoded images; with decode=False "
                "images come back as their stored bytes: leave decode=True or batch_transforms out"
            )
        self.batch_mix = resolve_batch(batch_transforms, self.schema, self.pipelines, self.as_dict)
        self._open_reader()
        check_lengths(self)  # Pad/Bucket against every sample, before any batch
        check_sizes(self)  # the image crops and resizes against every sample's stored size, the same

    @property
    def reader(self) -> PackedReader:
        """What the loader reads through (formats/reader.py): locate, gather, blob sources."""
        return self._reader

    def _open_reader(self) -> None:
        segments = self._remote.segments() if self._remote is not None else local_segments(self.path, self.manifest)
        self._reader = PackedReader(segments, self.path)
        self._finalizer = weakref.finalize(self, self._reader.close)

    # -- metadata ----------------------------------------------------------------------------
    @property
    def format(self) -> str:
        return self.manifest.layout

    @property
    def classes(self) -> list[str] | None:
        return self.manifest.metadata.get("classes")

    @property
    def metadata(self) -> dict:
        return self.manifest.metadata

    def __len__(self) -> int:
        return self.manifest.num_samples

    def __repr__(self) -> str:
        return f"fastload.Dataset('{self.path}', {len(self)} samples, {self.format}, {self.schema})"

    @property
    def remote(self) -> bool:
        """True for a dataset read from a URL through the local shard cache."""
        return self._remote is not None

    def remote_stats(self) -> dict | None:
        """Downloads, cache hits, bytes, retries, corrupt downloads, evictions, time waited for shards
        (a remote dataset; None for a local one)."""
        return None if self._remote is None else self._remote.stats.as_dict()

    def read_plan(self, batches: Any) -> Any:
        """The loader's batch iterator; for a remote dataset, wrapped in a read plan that downloads the
        coming batches' shards ahead and releases the ones no longer needed."""
        return batches if self._remote is None else self._remote.plan(batches)

    @property
    def batch_items(self) -> Any:
        """``__getitems__``'s state in this process (``_getitems.BatchItems``: its batcher, slots and lock),
        None before the first call; never pickled (a worker makes its own)."""
        return self.__dict__.get("_items")

    @batch_items.setter
    def batch_items(self, state: Any) -> None:
        self._items = state

    # -- access ------------------------------------------------------------------------------
    def locate(self, i: int) -> tuple[Any, int]:
        """(segment, index within it) of global sample ``i``."""
        return self._reader.sample(i)

    def __getitem__(self, i: int) -> Any:
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
            raise TypeError(f"dataset indices must be integers, got {type(i).__name__}")
        n = len(self)
        asked = i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample index {asked} out of range for a dataset of {n} samples")
        return self.read_sample(i)

    def read_sample(self, i: int, draws: Any = None) -> Any:
        """Sample ``i`` (in range). Its random transforms plan from ``draws`` (a ``_draws.SampleDraws`` of this one
        sample, drawn for the image fields in schema order as the batcher draws them: ``__getitems__``'s
        per-sample fallback), or else from torch's generator."""
        at = self._reader.locate_one(i)
        plans: dict = {}  # one plan per image field for the whole sample: its masks follow it (fields/mask.py)
        if draws is not None and self.decode:
            for f in self.schema:
                if f.name in self.pipelines:
                    h, w = (int(v) for v in self._reader.row(at, f.name, "meta", 0)[:2])
                    plans[f.name] = self.pipelines[f.name].plan(np.array([h]), np.array([w]), draws)
        values = [self._field_value(at, i, f, plans) for f in self.schema]
        if self.as_dict:
            return dict(zip(self.schema.names, values))
        return tuple(values)

    def __getitems__(self, indices: Any) -> list:
        """``[self[i] for i in indices]``, decoded as one batch by the fast path's native batcher.

        torch's DataLoader calls this with each batch's indices (so do accelerate, Hugging Face's Trainer and
        anything built on torch's fetchers): a fastload dataset decodes natively under any loader. The items
        are ds[i]'s; under torch's DataLoader a sample's random draws are keyed by (the iterator's seed, epoch,
        sample index), so it gets the same pixels whichever worker or batch reads it. ``_front/getitems.py`` says
        what that means for reproducibility, threads and forked workers; ``_front/getitems_shm.py`` how a worker's
        batch is collated into reused shared memory (for torch's default_collate the items are then dict/tuple
        subclasses, equal to ds[i]'s; a user's collate_fn gets plain dicts/tuples)."""
        from .getitems import get_items

        return get_items(self, indices)

    def _field_value(self, at: Located, i: int, f: Field, plans: dict | None = None) -> Any:
        try:
            return self._decode_field(at, f, plans)
        except (ValueError, UnicodeDecodeError) as e:
            if isinstance(e, FormatError):
                raise
            raise DecodeError(f"{where(self.path, self._reader.shard(at.seg_ids[0]), i, f.name)}: {e}") from None

    def _decode_field(self, at: Located, f: Field, plans: dict | None = None) -> Any:
        # the field kind's codec reads it (fields/); a lone sample is padded (Pad/Bucket), never packed
        padding = {n: s for n, s in self.sequences.items() if not isinstance(s, PackSequences)}
        ctx = ReadContext(
            self.decode, self.pipelines, padding, self._transformed_image, moved_mask, {} if plans is None else plans
        )
        return codec_of(f).read(f, self._reader, at, ctx)

    def _transformed_image(
        self, pipeline: Any, blob: memoryview, h: int, w: int, enc: int, plan: Any = None
    ) -> torch.Tensor:
        # the same planning and native kernels as the loader; randomness from torch's generator,
        # so torch.manual_seed makes ds[i] reproducible as with torchvision transforms (``plan``: drawn so)
        if plan is None:
            rng = np.random.default_rng(int(torch.randint(0, 2**62, ()).item()))
            plan = pipeline.plan(np.array([h]), np.array([w]), rng)
        crop = tuple(int(v) for v in plan.crops[0])
        out_hw = tuple(int(v) for v in plan.out_hw[0])
        flip = bool(plan.flips[0])
        interp = plan.interp_of(0)  # bilinear or bicubic
        frame = plan.frame_of(0)  # torchvision's resize then crop, exactly (Plan.frames; never with a padded window)

        def decode(crop: tuple, out_hw: tuple, flip: bool = False) -> np.ndarray:
            if enc == IMAGE_JPEG:
                return native().decode_crop_resize(blob, crop, out_hw, flip, interpolation=interp, frame=frame)
            pixels = np.frombuffer(blob, dtype=np.uint8).reshape(h, w, 3)
            return native().resize_crop(pixels, crop, out_hw, flip, interpolation=interp, frame=frame)

        # issue 21's augmentation (and padded crops): the PIL reference engine on the decoded tile
        arr = decode(crop, out_hw, flip) if plan.augment is None else augment_reference(decode, plan)
        arr = pipeline.run_fallback(arr, plan)  # transforms fastload does not know, per sample (the loader's too)
        image = torch.from_numpy(arr).permute(2, 0, 1)
        if pipeline.tensor:
            image = pipeline.tensor.apply(image[None])[0]
        return pipeline.run_after(image, plan)  # callables after ToDtype/Normalize, on the float image

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Unmap shards / close LMDB now (they are also released when the dataset is collected)."""
        self._reader.close()

    def __getstate__(self) -> dict:
        # Worker processes reopen their own mappings; nothing mapped travels through pickle.
        state = self.__dict__.copy()
        state["_reader"] = None
        state["_finalizer"] = None
        state["_items"] = None  # __getitems__'s native pool and slots are this process's
        state["_lease"] = None  # an open lock file (folder_cache.py): the process that opened the dataset holds it
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._open_reader()


def _torchvision_habits(fn: Any) -> Any:
    """``fastload.open`` with torchvision's habits (``open(root, transform)``, ``transform=``, a DataLoader
    argument) refused with what to write (``_field_transforms.open_habit``), not Python's bare TypeError."""
    import functools
    import inspect

    sig = inspect.signature(fn)
    accepted = [p for p in sig.parameters if p != "path"]

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            sig.bind(*args, **kwargs)
        except TypeError:
            from .._transforms.fields import open_habit

            unknown = {k: v for k, v in kwargs.items() if k not in sig.parameters}
            if len(args) > 1 or unknown:
                path = args[0] if args else kwargs.get("path")
                raise TypeError(open_habit(path, args[1:], unknown, accepted)) from None
            raise
        return fn(*args, **kwargs)

    return checked


@_torchvision_habits
def open(
    path: str | os.PathLike,
    *,
    transforms: Mapping[str, Any] | None = None,
    as_dict: bool = False,
    decode: bool = True,
    cache_dir: str | os.PathLike | None = None,
    cache_limit: int | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    batch_transforms: Any = None,
) -> Dataset:
    """Open a packed dataset (shards directory or LMDB environment) as a map-style Dataset.

    ``path`` may be a URL that fsspec reads (``s3://bucket/ds``, ``gs://``, ``az://``, ``https://``,
    ``file://``; ``pip install 'torch-fastload[remote]'``): the manifest is read now (a missing bucket or
    missing credentials raise ``RemoteError`` here), and shards are downloaded whole into ``cache_dir``
    (default ``$FASTLOAD_CACHE_DIR`` or ``~/.cache/fastload/shards``) as batches need them, verified
    against the manifest, and evicted least-recently-used beyond ``cache_limit`` (bytes or e.g.
    ``"50GB"``; default: no limit). ``storage_options`` go to the fsspec backend (e.g.
    ``{"endpoint_url": ...}`` for s3fs).

    A local ``path`` that is an unpacked torchvision ImageFolder tree is packed once (``fastload.pack``'s
    defaults, with a progress bar and one log line saying where) into ``<cache>/folders/`` (``<cache>``:
    ``cache_dir``, else ``$FASTLOAD_CACHE_DIR``, else ``~/.cache/fastload``), keyed by the folder's listing,
    sizes and mtimes: the next open of the unchanged folder reads that pack, a changed folder is packed
    again, an interrupted pack resumes, and processes opening it at once pack it once (``_front/folder_cache.py``).
    Local Parquet files and WebDataset tar shards (a file, a folder, a glob, a brace pattern) are packed once
    the same way, keyed by their files' paths, sizes and mtimes.
    Any other path that holds no dataset raises the ``fastload pack`` command that packs it.

    ``transforms`` maps an image field to a list of ``fastload.transforms`` (e.g.
    ``{"image": [RandomResizedCrop(224), RandomHorizontalFlip()]}``): ``ds[i]`` and
    ``fastload.DataLoader`` then give the same kind of sample. ``ds.schema`` is the schema;
    ``ds.classes`` the class names where the source had them.

    ``batch_transforms`` is MixUp, CutMix or ``RandomChoice([CutMix(...), MixUp(...)])`` (torchvision v2's
    names and arguments), run by ``fastload.DataLoader`` on whole batches (after collate on the CPU, on the
    device after the copy with ``device='cuda'``): the image field's images mixed, the int label field made
    float soft labels (N, num_classes). The fields default to the single image and single int field; name
    them with ``{('image', 'label'): transform}``. ``ds[i]`` is one sample: batch transforms do not apply.
    """
    lease = None
    if not is_url(path):
        from .folder_cache import resolve

        packed, lease = resolve(Path(path), cache_dir)
        if lease is not None:  # cache_dir chose where the folder's pack lives: it is not a remote option here
            path, cache_dir = packed, None
    try:
        ds = Dataset(
            path,
            transforms=transforms,
            as_dict=as_dict,
            decode=decode,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            storage_options=storage_options,
            batch_transforms=batch_transforms,
        )
    except BaseException:
        if lease is not None:
            lease.close()
        raise
    return leased(ds, lease)


def leased(ds: Dataset, lease: Any) -> Dataset:
    """``ds`` holding ``lease`` (the open lock file of a folder's cached pack, ``_front/folder_cache.py``) for as long
    as it lives: the pack is then never removed as stale while this dataset reads it. The lease is closed when
    the dataset is collected (not left to the file object's own collection: "unclosed file" warnings)."""
    ds._lease = lease
    if lease is not None:
        weakref.finalize(ds, lease.close)
    return ds
