"""The batcher: one native call per batch fills a preallocated slot with decoded, cropped images
and gathered columns. No per-sample Python on the image path for packed shards.

A *slot* (``_ring.Slot``) is one batch worth of output buffers, allocated once (pinned when CUDA is
usable) and reused by the loader's ``SlotRing``. Tensors handed to the caller are views of a slot; a
slot is refilled only when no view of it is alive any more (the ring's protocol, ``_ring.py``).

The chain (``fast/``) drives the batcher: it hands it slots, its pool and index batches (``_sequences.PackJob``
for packed ones), and its Collate stage makes the batch of a filled slot (``fast.collate.Collator``, which
``ds.__getitems__`` uses too). Nothing here imports the chain.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np
import torch

from .._augment.masks import decode_masks
from .._draws import for_samples
from .._errors import DecodeError, where
from ..decoders._base import HOST_FLOATS, PER_SAMPLE
from .images import ImageDecoding
from ..decoders._base import BICUBIC_RESIZE
from .._native import native
from ..fields import codec_of
from ..fields._codec import torch_dtype
from ..fields.array import gather_pieces
from ..fields.image import ImagePart
from .._ring import Slot, host_empty, pinned_memory_usable
from .._transforms.sequences import PackJob, PackSequences, cu_seqlens


class Batcher:
    """Fills slots for a ``fastload.Dataset``; raises NotFastPath when it cannot."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        num_threads: int,
        on_error: str = "raise",
        decoder: str = "native",
        device: torch.device | None = None,
    ):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error={on_error!r} should be 'raise' or 'skip'")
        self.images = ImageDecoding(decoder, device, batch_size, num_threads, beyond_geometry(dataset.pipelines))
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
        # each field's part of a batch, made once by its kind's codec (fields/), in schema order; NotFastPath
        # names the first field that cannot be batched. A packed batch holds the packed field only (sample_ids
        # find the rest), filled by _fill_packed.
        self.parts = [] if self.packed is not None else [codec_of(f).batch(f, dataset) for f in self.schema]
        # fill order: parts that follow an image's plan (masks, ``after_images``) after every other part, so the
        # image parts have recorded this batch's plans (``plans``, image field -> transforms.Plan) by then
        self._order = sorted(range(len(self.parts)), key=lambda j: self.parts[j].after_images)
        self.plans: dict = {}

    # the mask parts' engine (fields/mask.py knows none): masks moved with their image's plan, one native call
    move_masks = staticmethod(decode_masks)

    @property
    def pool(self):
        if self._pool is None:
            self._pool = native().Pool(self.num_threads)
        return self._pool

    def close(self) -> None:
        self._pool = None
        self.images.close()

    def copy_helpers(self) -> int:
        """Helper threads for this batcher's large row gathers (``copy_helpers_for``)."""
        return copy_helpers_for(self.num_threads)

    def begin_iteration(self, timeout: float) -> None:
        """An iteration starts, in the training thread, before its producer thread runs: ``'cuda'`` becomes the
        device current here (``ImageDecoding.bind_device``), the per-sample transform workers answer within
        ``timeout`` (torch's; 0: no limit) and are forked now, as many as the pool's threads (no fork while
        threads run, ``_augment/fallback_workers.py``); the pool's copy helpers follow torch's thread count
        (``copy_helpers``). The loader calls this where it starts an iteration;
        the chain that drives this batcher changes nothing of it."""
        pool = self.pool
        helpers = self.copy_helpers()  # torch's thread count, as it is when the iteration starts
        if pool.copy_helpers != helpers:
            pool.copy_helpers = helpers
        images = self.images
        images.bind_device()
        images.fallback_timeout = timeout
        images.start_fallbacks(self.pool, {p.name: p.pipeline for p in self.parts if isinstance(p, ImagePart)})

    def end_epoch(self) -> None:
        """A non-persistent loader's epoch is over: what stands for torch's worker processes goes, as torch's
        would (``ImageDecoding.end_epoch``: the per-sample transforms' worker processes; the decoders stay, built
        once, and give back the memory they cache and do not use in a thread of their own: that may synchronise
        the device, and this runs in the training thread). The native threads stay, idle on a
        condition variable until the loader is collected: starting them again costs more than an epoch of small
        batches takes (bench/suite.py's tiny records, 16 batches an epoch, ran 8-21% slower at num_workers=2 than
        at 0 that way). A persistent loader keeps everything."""
        self.images.end_epoch()

    def new_slot(self, pin: bool | None = None, rows: int | None = None) -> Slot:
        """One batch of buffers; ``pin`` None: pinned where CUDA is usable. ``Dataset.__getitems__`` passes
        False: its batches are copied by the caller's collate, so pinning them would only cost. ``rows``: that
        many samples instead of a batch (a group slot of several batches, ``fast/group.py``)."""
        b = self.batch_size if rows is None else rows
        tensors = {}
        if pin is None:
            pin = pinned_memory_usable()  # asked per slot: a forked child must not pin (_ring.py, rule 6)
        if self.packed is not None:
            name, spec = self.packed
            size = b * spec.row_length
            tensors[name] = host_empty((size,), torch_dtype(np.dtype(self.schema[name].dtype)), pin)
            tensors[name + ":cu"] = host_empty((size + 1,), torch.int32, pin)
            tensors[name + ":ids"] = host_empty((size,), torch.int64, pin)
            return Slot(tensors)
        alloc = functools.partial(host_empty, pin=pin)
        for part in self.parts:
            tensors.update(part.buffers(self, b, alloc))
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
        gather_pieces(
            self.reader,
            self.ds.path,
            f,
            flat,
            at,
            job.samples,
            job.starts * item,
            job.lengths * item,
            job.dst * item,
            pool,
        )
        cu = cu_seqlens(job, spec.row_length)
        k = len(cu) - 1
        slot.arrays[name + ":cu"][: k + 1] = cu
        piece = np.searchsorted(job.dst, cu[:-1], side="right") - 1
        slot.arrays[name + ":ids"][:k] = job.samples[piece]
        return [k]

    def fill(self, slot: Slot, indices: np.ndarray, rng: np.random.Generator | None, pool: Any = None) -> list:
        """Fill ``slot`` with samples ``indices``; return what each field's part hands the collate (the
        Python-object fields' lists, Pad/Bucket bounds, None for the rest), in schema order.

        ``rng`` plans random transforms; it may be None when ``needs_rng`` is False. ``pool``: the native
        thread pool to fill with (default: this batcher's own, ``num_threads`` threads)."""
        if pool is None:
            pool = self.pool
        if isinstance(indices, PackJob):
            return self._fill_packed(slot, indices, pool)
        indices = np.asarray(indices, dtype=np.int64)
        at = self.reader.locate(indices)
        failed: dict[int, str] = {}
        self.plans = {}
        objects: list = [None] * len(self.parts)
        rng = for_samples(rng, indices)  # the loader's: each sample's draws keyed by (seed, epoch, index)
        for j in self._order:
            objects[j] = self.parts[j].fill(self, slot, at, indices, rng, pool, failed)
        if failed:
            self._handle_failures(failed, slot, objects, indices, at.seg_ids, len(indices))
        return objects

    def _handle_failures(self, failed: dict, slot: Slot, objects: list, indices, seg_ids, n: int) -> None:
        if self.on_error == "raise" or len(failed) == n:
            k = min(failed)
            shard = self.reader.shard(seg_ids[k])
            more = f" ({len(failed) - 1} more in this batch)" if len(failed) > 1 else ""
            hint = "" if self.on_error == "skip" else "; pass on_error='skip' to replace bad samples"
            raise DecodeError(f"{where(self.ds.path, shard, int(indices[k]), None)}: {failed[k]}{more}{hint}")
        good = [k for k in range(n) if k not in failed]
        bad = sorted(failed)
        sources = [good[j % len(good)] for j in range(len(bad))]  # a good sample of the same batch, counted
        for part, obj in zip(self.parts, objects):
            part.replace(self, slot, n, obj, bad, sources)
        self.skipped += len(failed)


def copy_helpers_for(num_threads: int) -> int:
    """Helper threads for the native row gather of a large batch on a pool of ``num_threads`` (``Pool.copy_helpers``):
    at ``num_workers=0`` a fixed-size column's rows of 2 MiB or more (``GATHER_INLINE_BYTES``; 64 raw 3x224x224
    images are 9.6 MB) are copied by the calling thread and ``torch.get_num_threads() - 1`` helpers, which take
    chunks in turn, as torch's own loader collates on its intra-op threads at ``num_workers=0``.
    ``torch.set_num_threads(1)`` (torch's worker processes set it) keeps the copy in the calling thread; with
    ``num_workers > 0`` the pool's own threads copy."""
    if num_threads > 0:
        return 0
    return max(0, min(torch.get_num_threads(), os.cpu_count() or 1) - 1)


def beyond_geometry(pipelines: dict) -> tuple[str, ...]:
    """What the image pipelines plan beyond crop, resize and horizontal flip (augmentations, padded crops), by
    transform name: the decoder must execute ``Plan.augment`` (``ImageDecoding`` decides when it is made)."""
    names: dict[str, None] = {}
    for p in pipelines.values():
        for t in getattr(p, "transforms", ()):
            if getattr(t, "pads", False):
                names["RandomCrop with padding"] = None
            if getattr(t, "interpolation", "bilinear") != "bilinear":  # bicubic or random: the native resize
                names[BICUBIC_RESIZE] = None
        for t in getattr(p, "augment", ()):
            names[type(t).__name__] = None
        for t in getattr(p, "fallback", ()):  # run per sample on host rows after the native decoder
            names[f"{t.name} {PER_SAMPLE})"] = None
        for t in getattr(p, "erase", ()):  # on the host's float rows after ToDtype/Normalize (fill stage)
            names[f"{t.name} {HOST_FLOATS}"] = None
        for t in getattr(p, "after", ()):  # the same, on the host's float rows after ToDtype/Normalize
            names[f"{t.name} {PER_SAMPLE} after ToDtype/Normalize)"] = None
    return tuple(names)
