"""The batcher: one native call per batch fills a preallocated slot with decoded, cropped images
and gathered columns. No per-sample Python on the image path for packed shards.

A *slot* (``_ring.Slot``) is one batch worth of output buffers, allocated once (pinned when CUDA is
usable) and reused by the loader's ``SlotRing``. Tensors handed to the caller are views of a slot; a
slot is refilled only when no view of it is alive any more (the ring's protocol, ``_ring.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._errors import DecodeError, where
from ._images import ImageDecoding
from ._native import native
from .fast.collate import Collator
from .fast.packing import PackJob, cu_seqlens
from ._ring import Slot, host_empty, pinned_memory_usable
from ._schema import Field
from ._sequences import PackSequences


class NotFastPath(Exception):
    """The dataset/loader configuration needs the generic path; the message says why."""


def _torch_dtype(np_dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=np_dtype.newbyteorder("="))).dtype


class Batcher:
    """Fills slots for a ``fastload.Dataset``; raises NotFastPath when it cannot."""

    def __init__(self, dataset: Any, batch_size: int, num_threads: int, on_error: str = "raise",
                 decoder: str = "native", device: torch.device | None = None):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error={on_error!r} should be 'raise' or 'skip'")
        self.images = ImageDecoding(decoder, device, batch_size, num_threads)
        self.decoder = decoder
        self.ds = dataset
        self.reader = dataset.reader
        self.batch_size = batch_size
        self.on_error = on_error
        self.schema = dataset.schema
        self.pipelines = dataset.pipelines
        self.num_threads = num_threads
        self._pool = None
        self.skipped = 0
        packed = [(n, t) for n, t in dataset.sequences.items() if isinstance(t, PackSequences)]
        self.packed = packed[0] if packed else None
        for f in self.schema:
            if self.packed is not None:
                break  # a packed batch holds the packed field only (sample_ids find the rest)
            if f.kind == "image":
                p = self.pipelines.get(f.name)
                if p is None or p.output_size is None:
                    raise NotFastPath(f"image field '{f.name}' has no transform giving a fixed output size "
                                      f"(e.g. RandomResizedCrop(224)); images of different sizes cannot be batched")
            elif f.kind == "ndarray" and not f.fixed_size and f.name not in dataset.sequences:
                raise NotFastPath(f"ndarray field '{f.name}' has a variable shape {f.shape} and no Pad/Bucket "
                                  f"transform to batch it to a fixed shape")
        self.collator = Collator(dataset, batch_size, self.packed, self.images)
        # what fill does with each field, decided once (not per batch)
        self.fields = [(f, "image" if f.kind == "image" else "sequence" if f.name in dataset.sequences
                        else "fixed" if f.fixed_size else "object") for f in self.schema]

    @property
    def pool(self):
        if self._pool is None:
            self._pool = native().Pool(self.num_threads)
        return self._pool

    def close(self) -> None:
        self._pool = None
        self.images.close()

    def end_epoch(self) -> None:
        """A non-persistent loader's epoch is over: the GPU decoders (and their device memory) go, as torch's
        worker processes would. The native threads stay, idle on a condition variable until the loader is
        collected: starting them again costs more than an epoch of small batches takes (bench/suite.py's
        tiny records, 16 batches an epoch, ran 8-21% slower at num_workers=2 than at 0 that way)."""
        self.images.close()

    def new_slot(self, pin: bool | None = None) -> Slot:
        """One batch of buffers; ``pin`` None: pinned where CUDA is usable. ``Dataset.__getitems__`` passes
        False: its batches are copied by the caller's collate, so pinning them would only cost."""
        b = self.batch_size
        tensors = {}
        if pin is None:
            pin = pinned_memory_usable()  # asked per slot: a forked child must not pin (_ring.py, rule 6)
        if self.packed is not None:
            name, spec = self.packed
            size = b * spec.row_length
            tensors[name] = host_empty((size,), _torch_dtype(np.dtype(self.schema[name].dtype)), pin)
            tensors[name + ":cu"] = host_empty((size + 1,), torch.int32, pin)
            tensors[name + ":ids"] = host_empty((size,), torch.int64, pin)
            return Slot(tensors)
        for f in self.schema:
            if f.kind == "image":
                h, w = self.pipelines[f.name].output_size
                tensors.update(self.images.buffers(f.name, (b, h, w, 3), lambda shape, dt: host_empty(shape, dt, pin)))
            elif f.fixed_size:
                tensors[f.name] = host_empty((b,) + tuple(f.shape or ()), _torch_dtype(f.np_dtype), pin)
            elif f.name in self.ds.sequences:
                rest = int(np.prod(f.shape[1:], dtype=np.int64))
                size = b * self.ds.sequences[f.name].max_length * rest
                tensors[f.name] = host_empty((size,), _torch_dtype(np.dtype(f.dtype)), pin)
                tensors[f.name + ":len"] = host_empty((b,), torch.int64, pin)
        return Slot(tensors)

    # -- filling ---------------------------------------------------------------------------------
    @property
    def needs_rng(self) -> bool:
        return bool(self.pipelines)

    def _fill_packed(self, slot: Slot, job: PackJob, pool: Any) -> list:
        """A packed batch: pieces of samples copied into the flat token buffer, plus boundaries."""
        name, spec = self.packed
        f = self.schema[name]
        flat = slot.arrays[name]
        flat[...] = spec.value
        at = self.reader.locate(job.samples)
        item = flat.itemsize
        self._gather_pieces(f, flat, at, job.samples, job.starts * item, job.lengths * item, job.dst * item, pool)
        cu = cu_seqlens(job, spec.row_length)
        k = len(cu) - 1
        slot.arrays[name + ":cu"][: k + 1] = cu
        piece = np.searchsorted(job.dst, cu[:-1], side="right") - 1
        slot.arrays[name + ":ids"][:k] = job.samples[piece]
        return [k]

    def fill(self, slot: Slot, indices: np.ndarray, rng: np.random.Generator | None, pool: Any = None) -> list:
        """Fill ``slot`` with samples ``indices``; return the Python-object fields (str/bytes) as lists.

        ``rng`` plans random transforms; it may be None when ``needs_rng`` is False. ``pool``: the native
        thread pool to fill with (default: this batcher's own, ``num_threads`` threads)."""
        if pool is None:
            pool = self.pool
        if isinstance(indices, PackJob):
            return self._fill_packed(slot, indices, pool)
        indices = np.asarray(indices, dtype=np.int64)
        at = self.reader.locate(indices)
        objects = {}
        failed: dict[int, str] = {}
        for f, how in self.fields:
            if how == "image":
                for k, msg in self.images.fill(pool, self.pipelines[f.name], f, slot, self.reader, at, rng):
                    failed.setdefault(k, f"field '{f.name}': {msg}")
            elif how == "sequence":
                objects[f.name] = self._fill_sequences(f, slot, at, indices, pool)
            elif how == "fixed":  # the reader says where the rows lie; the native gather copies them
                native().gather_rows(pool, *self.reader.row_sources(at, f.name), slot.arrays[f.name][: len(indices)])
            else:
                objects[f.name] = self._objects(f, at, failed)
        if failed:
            self._handle_failures(failed, slot, objects, indices, at.seg_ids, len(indices))
        return [objects.get(f.name) for f, _ in self.fields]

    def _fill_sequences(self, f: Field, slot: Slot, at, indices: np.ndarray, pool: Any) -> int:
        """Pad/bucket a variable-length field into the slot; returns the batch's padded length."""
        seq = self.ds.sequences[f.name]
        n = len(at)
        lengths = self.reader.take(at, f.name, "shape")[:, 0].astype(np.int64)

        def describe(k: int) -> str:
            return where(self.ds.path, self.reader.shard(at.seg_ids[k]), int(indices[k]), f.name)

        try:
            seq.check(lengths, describe)
        except ValueError as e:
            raise DecodeError(str(e)) from None
        bound = int(seq.bounds(lengths).max()) if n else seq.max_length
        cut = np.minimum(lengths, bound)
        rest = tuple(f.shape[1:])
        out = slot.arrays[f.name][: n * bound * int(np.prod(rest, dtype=np.int64))].reshape((n, bound) + rest)
        out[...] = seq.value
        row_bytes = np.dtype(f.dtype).itemsize * int(np.prod(rest, dtype=np.int64))
        self._gather_pieces(f, out, at, indices, np.zeros(n, np.int64), cut * row_bytes,
                            np.arange(n, dtype=np.int64) * (bound * row_bytes), pool)
        slot.arrays[f.name + ":len"][:n] = cut
        return bound

    def _gather_pieces(self, f: Field, out: np.ndarray, at, indices: np.ndarray, skip: np.ndarray,
                       nbytes: np.ndarray, dst: np.ndarray, pool: Any) -> None:
        """One native copy of variable-length pieces: piece j is ``nbytes[j]`` bytes of batch position j's
        value of field ``f`` (``at`` locates them), from byte ``skip[j]`` of that value, to byte ``dst[j]`` of ``out`` (padding
        is the caller's). A piece past the end of its value (an LMDB record shorter than its recorded
        length; shard offsets are checked at open) is refused naming the sample."""
        regions, region, offset, length = self.reader.blob_sources(at, f.name)
        short = np.flatnonzero(skip + nbytes > length)
        if short.size:
            p = int(short[0])
            raise DecodeError(f"{where(self.ds.path, None, int(indices[p]), f.name)}: the value is "
                              f"{int(length[p])} bytes, its recorded length needs {int(skip[p] + nbytes[p])}")
        native().gather_pieces(pool, regions, region, offset + skip, nbytes.astype(np.int64, copy=False),
                               dst.astype(np.int64, copy=False), out)

    def _objects(self, f: Field, at, failed) -> list:
        out = []
        for k in range(len(at)):
            blob = self.reader.blob(at, f.name, k)
            if f.kind == "bytes":
                out.append(bytes(blob))
            else:
                try:
                    out.append(str(blob, "utf-8"))
                except UnicodeDecodeError as e:
                    failed.setdefault(k, f"field '{f.name}': {e}")
                    out.append("")
        return out

    def _handle_failures(self, failed: dict, slot: Slot, objects: dict, indices, seg_ids, n: int) -> None:
        if self.on_error == "raise" or len(failed) == n:
            k = min(failed)
            shard = self.reader.shard(seg_ids[k])
            more = f" ({len(failed) - 1} more in this batch)" if len(failed) > 1 else ""
            hint = "" if self.on_error == "skip" else "; pass on_error='skip' to replace bad samples"
            raise DecodeError(f"{where(self.ds.path, shard, int(indices[k]), None)}: {failed[k]}{more}{hint}")
        good = [k for k in range(n) if k not in failed]
        bad = sorted(failed)
        sources = [good[j % len(good)] for j in range(len(bad))]  # a good sample of the same batch, counted
        device_rows = [f.name for f in self.schema if f.kind == "image" and self.images.device is not None]
        for name in device_rows:  # GPU decoders' rows: on a stream of the decoders', complete on return
            self.images.move_rows(slot.tensors[name], bad, sources)
        views: list = []
        for f in self.schema:
            if f.name in device_rows:
                continue
            if f.name in self.ds.sequences:
                shape = (n, objects[f.name]) + tuple(f.shape[1:])
                views.append(slot.arrays[f.name][: int(np.prod(shape, dtype=np.int64))].reshape(shape))
                views.append(slot.arrays[f.name + ":len"])
            elif f.name in slot.arrays:
                views.append(slot.arrays[f.name])
        for k, src in zip(bad, sources):
            for arr in views:
                arr[k] = arr[src]
            for lst in objects.values():
                if isinstance(lst, list):
                    lst[k] = lst[src]
        self.skipped += len(failed)

    # -- output ----------------------------------------------------------------------------------
    def collate(self, slot: Slot, n: int, objects: list, tensor_transforms: bool = True) -> Any:
        """The batch as ``default_collate`` would structure it (``fast/collate.py``)."""
        return self.collator.collate(slot, n, objects, tensor_transforms)
