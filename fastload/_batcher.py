"""The batcher: one native call per batch fills a preallocated slot with decoded, cropped images
and gathered columns. No per-sample Python on the image path for packed shards.

A *slot* (``_ring.Slot``) is one batch worth of output buffers, allocated once (pinned when CUDA is
usable) and reused by the loader's ``SlotRing``. Tensors handed to the caller are views of a slot; a
slot is refilled only when no view of it is alive any more (the ring's protocol, ``_ring.py``).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from ._errors import DecodeError, where
from ._images import ImageDecoding
from ._native import native
from ._order import PackJob, cu_seqlens
from ._ring import Slot, SlotRing, host_empty, pinned_memory_usable
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
        self._cpu_outputs: dict[str, SlotRing] = {}  # per image field: CPU ToDtype/Normalize results
        self._cpu_outputs_lock = threading.Lock()
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

    def _fill_packed(self, slot: Slot, job: PackJob) -> list:
        """A packed batch: pieces of samples copied into the flat token buffer, plus boundaries."""
        name, spec = self.packed
        f = self.schema[name]
        flat = slot.arrays[name]
        flat[...] = spec.value
        at = self.reader.locate(job.samples)
        item = flat.itemsize
        self._gather_pieces(f, flat, at, job.samples, job.starts * item, job.lengths * item, job.dst * item)
        cu = cu_seqlens(job, spec.row_length)
        k = len(cu) - 1
        slot.arrays[name + ":cu"][: k + 1] = cu
        piece = np.searchsorted(job.dst, cu[:-1], side="right") - 1
        slot.arrays[name + ":ids"][:k] = job.samples[piece]
        return [k]

    def fill(self, slot: Slot, indices: np.ndarray, rng: np.random.Generator | None) -> list:
        """Fill ``slot`` with samples ``indices``; return the Python-object fields (str/bytes) as lists.

        ``rng`` plans random transforms; it may be None when ``needs_rng`` is False."""
        if isinstance(indices, PackJob):
            return self._fill_packed(slot, indices)
        indices = np.asarray(indices, dtype=np.int64)
        at = self.reader.locate(indices)
        objects = {}
        failed: dict[int, str] = {}
        for f in self.schema:
            if f.kind == "image":
                for k, msg in self.images.fill(self.pool, self.pipelines[f.name], f, slot, self.reader, at, rng):
                    failed.setdefault(k, f"field '{f.name}': {msg}")
            elif f.name in self.ds.sequences:
                objects[f.name] = self._fill_sequences(f, slot, at, indices)
            elif f.fixed_size:
                native().gather_rows(self.pool, *self.reader.row_sources(at, f.name), slot.arrays[f.name][: len(indices)])
            else:
                objects[f.name] = self._objects(f, at, failed)
        if failed:
            self._handle_failures(failed, slot, objects, indices, at.seg_ids, len(indices))
        return [objects.get(f.name) for f in self.schema]

    def _fill_sequences(self, f: Field, slot: Slot, at, indices: np.ndarray) -> int:
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
                            np.arange(n, dtype=np.int64) * (bound * row_bytes))
        slot.arrays[f.name + ":len"][:n] = cut
        return bound

    def _gather_pieces(self, f: Field, out: np.ndarray, at, indices: np.ndarray, skip: np.ndarray,
                       nbytes: np.ndarray, dst: np.ndarray) -> None:
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
        native().gather_pieces(self.pool, regions, region, offset + skip, nbytes.astype(np.int64, copy=False),
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
    def _cpu_output(self, name: str, images: torch.Tensor) -> torch.Tensor:
        """Where ToDtype/Normalize on the CPU write ``images``' result: a buffer of a small ring, reused once
        nothing views it (the slot protocol, ``_ring.py``), so a batch the caller still holds is never
        overwritten. A fresh float batch per step (38 MB at 64x3x224x224) cost more in page faults than the
        arithmetic: about 14 of 23 ms a batch on one thread."""
        dtype, shape = self.pipelines[name].tensor.dtype, (self.batch_size,) + tuple(images.shape[1:])
        with self._cpu_outputs_lock:  # one acquire at a time: the view taken inside holds the buffer
            ring = self._cpu_outputs.get(name)
            if ring is None:
                ring = self._cpu_outputs[name] = SlotRing(
                    lambda: Slot({"out": torch.empty(shape, dtype=dtype, memory_format=torch.channels_last)}))
            return ring.acquire().tensors["out"][:images.shape[0]]

    def collate(self, slot: Slot, n: int, objects: list, tensor_transforms: bool = True) -> Any:
        """The batch as ``default_collate`` would structure it: list for tuple samples, dict for dicts.
        ``tensor_transforms``: run ToDtype/Normalize here, on the CPU (a device prefetcher runs them instead)."""
        if self.packed is not None:
            name, spec = self.packed
            k = objects[0]
            return {name: slot.tensors[name].view(self.batch_size, spec.row_length),
                    "cu_seqlens": slot.tensors[name + ":cu"][: k + 1],
                    "sample_ids": slot.tensors[name + ":ids"][:k]}
        values = []
        for f, obj in zip(self.schema, objects):
            if f.kind == "image":
                images = slot.tensors[f.name][:n].permute(0, 3, 1, 2)  # NCHW, channels_last
                if self.images.device is not None:  # a GPU decoder's rows: readers wait on this on the device
                    images._fastload_ready = self.images.ready_event(slot.tensors[f.name])
                if tensor_transforms and self.pipelines[f.name].tensor:
                    images = self.pipelines[f.name].tensor.apply(images, self._cpu_output(f.name, images))
                values.append(images)
            elif f.name in self.ds.sequences:
                shape = (n, obj) + tuple(f.shape[1:])
                flat = slot.tensors[f.name][: int(np.prod(shape, dtype=np.int64))]
                values.append([flat.view(shape), slot.tensors[f.name + ":len"][:n]])
            elif f.fixed_size:
                values.append(slot.tensors[f.name][:n])
            else:
                values.append(obj)
        if self.ds.as_dict:
            return dict(zip(self.schema.names, values))
        return values

