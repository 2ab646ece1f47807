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
from ._ring import Slot, host_empty, pinned_memory_usable
from ._schema import Field
from .formats.shards import ShardSegment
from ._sequences import PackJob, PackSequences, cu_seqlens


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
        self.batch_size = batch_size
        self.on_error = on_error
        self.schema = dataset.schema
        self.pipelines = dataset.pipelines
        self.num_threads = num_threads
        self._pool = None
        self.skipped = 0
        # ToDtype/Normalize run here on the CPU; a device prefetcher turns this off and runs them on the device
        self.apply_tensor_transforms = True
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

    def new_slot(self) -> Slot:
        b = self.batch_size
        tensors = {}
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
        starts = self.ds._starts
        seg_ids = np.searchsorted(starts, job.samples, side="right") - 1
        local = job.samples - starts[seg_ids]
        groups = [(int(g), np.flatnonzero(seg_ids == g)) for g in np.unique(seg_ids)]
        segs = {g: self.ds._segments[g].open() for g, _ in groups}
        item = flat.itemsize
        self._gather_pieces(f, flat, segs, groups, local, job.samples, job.starts * item, job.lengths * item,
                            job.dst * item)
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
        if len(self.ds._segments) == 1:  # common for small records: skip the shard lookup
            seg_ids = np.zeros(len(indices), dtype=np.int64)
            local = indices
            groups = [(0, np.arange(len(indices)))]
        else:
            starts = self.ds._starts
            seg_ids = np.searchsorted(starts, indices, side="right") - 1
            local = indices - starts[seg_ids]
            present = np.flatnonzero(np.bincount(seg_ids, minlength=len(self.ds._segments)))
            groups = [(int(s), np.flatnonzero(seg_ids == s)) for s in present] if len(present) > 1 else \
                [(int(present[0]), np.arange(len(indices)))]
        segs = {s: self.ds._segments[s].open() for s, _ in groups}
        objects = {}
        failed: dict[int, str] = {}
        region_of = None  # position -> index into groups, built on first use
        for f in self.schema:
            if f.kind == "image":
                sources = _blob_sources(f, segs, groups, local)
                for k, msg in self.images.fill(self.pool, self.pipelines[f.name], f, slot, segs, groups, local,
                                               sources, rng):
                    failed.setdefault(k, f"field '{f.name}': {msg}")
            elif f.name in self.ds.sequences:
                objects[f.name] = self._fill_sequences(f, slot, segs, groups, local, indices, seg_ids)
            elif f.fixed_size:
                if region_of is None:
                    region_of = np.zeros(len(indices), np.int64)
                    for k, (_, pos) in enumerate(groups[1:], 1):
                        region_of[pos] = k
                self._gather_column(f, slot.arrays[f.name][: len(indices)], segs, groups, region_of, local)
            else:
                objects[f.name] = self._objects(f, segs, seg_ids, local, indices, failed)
        if failed:
            self._handle_failures(failed, slot, objects, indices, seg_ids, len(indices))
        return [objects.get(f.name) for f in self.schema]

    def _gather_column(self, f: Field, out: np.ndarray, segs: dict, groups: list, region_of: np.ndarray,
                       local: np.ndarray) -> None:
        """Rows of a fixed-size column: one native, bounds-checked, multi-threaded copy for shards."""
        if all(isinstance(segs[s], ShardSegment) for s, _ in groups):
            row_bytes = out[:1].nbytes
            regions = [segs[s].buffer for s, _ in groups]
            base = np.array([segs[s].column_start[(f.name, "values")] for s, _ in groups], dtype=np.int64)
            offset = base[region_of] + local * row_bytes
            native().gather_rows(self.pool, regions, region_of, offset, row_bytes, out)
        else:
            for s, pos in groups:
                out[pos] = segs[s].take(f.name, "values", local[pos])

    def _fill_sequences(self, f: Field, slot: Slot, segs: dict, groups: list, local: np.ndarray,
                        indices: np.ndarray, seg_ids: np.ndarray) -> int:
        """Pad/bucket a variable-length field into the slot; returns the batch's padded length."""
        seq = self.ds.sequences[f.name]
        n = len(local)
        lengths = np.empty(n, dtype=np.int64)
        for s, pos in groups:
            lengths[pos] = segs[s].take(f.name, "shape", local[pos])[:, 0]

        def describe(k: int) -> str:
            seg = self.ds._segments[int(seg_ids[k])]
            return where(self.ds.path, seg.name if isinstance(seg, ShardSegment) else None, int(indices[k]), f.name)

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
        self._gather_pieces(f, out, segs, groups, local, indices, np.zeros(n, np.int64), cut * row_bytes,
                            np.arange(n, dtype=np.int64) * (bound * row_bytes))
        slot.arrays[f.name + ":len"][:n] = cut
        return bound

    def _gather_pieces(self, f: Field, out: np.ndarray, segs: dict, groups: list, local: np.ndarray,
                       indices: np.ndarray, skip: np.ndarray, nbytes: np.ndarray, dst: np.ndarray) -> None:
        """One native copy of variable-length pieces: piece j is ``nbytes[j]`` bytes of sample ``local[j]``'s
        value of field ``f``, from byte ``skip[j]`` of that value, to byte ``dst[j]`` of ``out`` (padding
        is the caller's). A piece past the end of its value (an LMDB record shorter than its recorded
        length; shard offsets are checked at open) is refused naming the sample."""
        regions, region, offset, length = _blob_sources(f, segs, groups, local)
        short = np.flatnonzero(skip + nbytes > length)
        if short.size:
            p = int(short[0])
            raise DecodeError(f"{where(self.ds.path, None, int(indices[p]), f.name)}: the value is "
                              f"{int(length[p])} bytes, its recorded length needs {int(skip[p] + nbytes[p])}")
        native().gather_pieces(self.pool, regions, region, offset + skip, nbytes.astype(np.int64, copy=False),
                               dst.astype(np.int64, copy=False), out)

    def _objects(self, f: Field, segs: dict, seg_ids, local, indices, failed) -> list:
        out = []
        for k, (s, i) in enumerate(zip(seg_ids.tolist(), local.tolist())):
            blob = segs[s].blob(f.name, i)
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
            seg = self.ds._segments[int(seg_ids[k])]
            shard = seg.name if isinstance(seg, ShardSegment) else None
            more = f" ({len(failed) - 1} more in this batch)" if len(failed) > 1 else ""
            hint = "" if self.on_error == "skip" else "; pass on_error='skip' to replace bad samples"
            raise DecodeError(f"{where(self.ds.path, shard, int(indices[k]), None)}: {failed[k]}{more}{hint}")
        good = [k for k in range(n) if k not in failed]
        views: list = [slot.tensors[f.name] for f in self.schema  # device rows (GPU decoders): torch indexing
                       if f.name in slot.tensors and f.name not in slot.arrays and f.name not in self.ds.sequences]
        for f in self.schema:
            if f.name in self.ds.sequences:
                shape = (n, objects[f.name]) + tuple(f.shape[1:])
                views.append(slot.arrays[f.name][: int(np.prod(shape, dtype=np.int64))].reshape(shape))
                views.append(slot.arrays[f.name + ":len"])
            elif f.name in slot.arrays:
                views.append(slot.arrays[f.name])
        for j, k in enumerate(sorted(failed)):
            src = good[j % len(good)]  # replaced by a good sample of the same batch, and counted
            for arr in views:
                arr[k] = arr[src]
            for lst in objects.values():
                if isinstance(lst, list):
                    lst[k] = lst[src]
        self.skipped += len(failed)

    # -- output ----------------------------------------------------------------------------------
    def collate(self, slot: Slot, n: int, objects: list) -> Any:
        """The batch as ``default_collate`` would structure it: list for tuple samples, dict for dicts."""
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
                if self.apply_tensor_transforms and self.pipelines[f.name].tensor:
                    images = self.pipelines[f.name].tensor.apply(images)  # CPU: a new float batch
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


def _blob_sources(f: Field, segs: dict, groups: list, local: np.ndarray) -> tuple[list, np.ndarray, np.ndarray,
                                                                                 np.ndarray]:
    """Where each sample's value of blob field ``f`` lies, for the native calls: ``(regions, region,
    offset, length)``. A shard's values are byte ranges of its mapped file; an LMDB value is its own region."""
    n = len(local)
    region = np.empty(n, dtype=np.int64)
    offset = np.empty(n, dtype=np.int64)
    length = np.empty(n, dtype=np.int64)
    regions: list = []
    for s, pos in groups:
        seg, loc = segs[s], local[pos]
        if isinstance(seg, ShardSegment):
            offs = seg.offsets[f.name]
            region[pos] = len(regions)
            regions.append(seg.buffer)
            offset[pos] = seg.data_start[f.name] + offs[loc].astype(np.int64)
            length[pos] = (offs[loc + 1] - offs[loc]).astype(np.int64)
        else:
            for p, i in zip(pos.tolist(), loc.tolist()):
                blob = seg.blob(f.name, int(i))
                region[p] = len(regions)
                regions.append(blob)
                offset[p] = 0
                length[p] = len(blob)
    return regions, region, offset, length
