"""The collate stage: a filled slot as the batch ``default_collate`` would give, views of the slot (each
field's entry made by its kind's part, ``fields/``).

Images come out NCHW in channels_last memory (the decoder's layout, at no cost); ToDtype/Normalize run
here on the CPU into a small ring of reused output buffers, unless a device prefetcher runs them on the
device (``tensor_transforms=False``). MixUp/CutMix (``batch_transforms``) run here too on the CPU, fused into
the images' native ToDtype/Normalize pass (``Collator.collate_mixed``); ``contiguous`` lists the image entries to copy
into torch's default layout (``memory_format=torch.contiguous_format``). ``Collator`` is also what ``ds.__getitems__``
uses (``_front/getitems.py``); the batcher, which the chain drives, knows none of this.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from .._ring import Slot, SlotRing
from .device import AfterCopy
from .stage import Stage


def contiguous_images(batch: Any, keys: list) -> Any:
    """``batch`` with its image tensors (at ``keys``) in torch's default contiguous layout."""
    for k in keys:
        batch[k] = batch[k].contiguous()
    return batch


class Collator:
    """How one dataset's slots become batches (fields, pipelines, packing decided once, not per batch)."""

    def __init__(self, dataset: Any, batch_size: int, packed: Any, parts: list):
        """``parts``: each field's part of a batch (``fields/``, made by the Batcher), in schema order."""
        self.batch_size, self.packed, self.as_dict = batch_size, packed, dataset.as_dict
        self.names = list(dataset.schema.names)
        self.parts = parts
        # fastload.open's batch_transforms (MixUp/CutMix, _augment/mix.py): run by the Collate stage
        self.mix = getattr(dataset, "batch_mix", None) if packed is None else None
        # the mixed image field's ToDtype/Normalize (or None), which collate_mixed runs with the mix fused in
        self._mix_pipeline = next(
            (getattr(p, "tensor", None) for p in parts if self.mix is not None and p.name == self.mix.image), None
        )
        self._cpu_outputs: dict[str, SlotRing] = {}  # per image field: CPU ToDtype/Normalize results
        self._cpu_outputs_lock = threading.Lock()

    @classmethod
    def for_batcher(cls, batcher: Any) -> "Collator":
        """The collator of the slots ``batcher`` (``_batcher.Batcher``) fills."""
        return cls(batcher.ds, batcher.batch_size, batcher.packed, batcher.parts)

    def _cpu_output(self, name: str, pipeline: Any, images: torch.Tensor) -> torch.Tensor:
        """Where ToDtype/Normalize on the CPU write ``images``' result: a buffer of a small ring, reused once
        nothing views it (the slot protocol, ``_ring.py``), so a batch the caller still holds is never
        overwritten. A fresh float batch per step (38 MB at 64x3x224x224) cost more in page faults than the
        arithmetic: about 14 of 23 ms a batch on one thread."""
        dtype, shape = pipeline.dtype, (self.batch_size,) + tuple(images.shape[1:])
        with self._cpu_outputs_lock:  # one acquire at a time: the view taken inside holds the buffer
            ring = self._cpu_outputs.get(name)
            if ring is None:
                ring = self._cpu_outputs[name] = SlotRing(
                    lambda: Slot({"out": torch.empty(shape, dtype=dtype, memory_format=torch.channels_last)})
                )
            return ring.acquire().tensors["out"][: images.shape[0]]

    def mix_output(self, images: torch.Tensor) -> torch.Tensor:
        """Where MixUp/CutMix on the CPU write their result: a reused buffer as ``_cpu_output``'s (a fresh 38 MB
        batch per step costs more in page faults than the blend itself)."""
        shape = (self.batch_size,) + tuple(images.shape[1:])
        with self._cpu_outputs_lock:
            key = ("mix", images.dtype)
            ring = self._cpu_outputs.get(key)
            if ring is None:
                ring = self._cpu_outputs[key] = SlotRing(
                    lambda: Slot({"out": torch.empty(shape, dtype=images.dtype, memory_format=torch.channels_last)})
                )
            return ring.acquire().tensors["out"][: images.shape[0]]

    def collate(self, slot: Slot, n: int, objects: list, tensor_transforms: bool = True, raw: str | None = None) -> Any:
        """The batch as ``default_collate`` would structure it: list for tuple samples, dict for dicts.
        ``tensor_transforms``: run ToDtype/Normalize here, on the CPU (a device prefetcher runs them instead);
        except on the image field named ``raw``, left as the slot's uint8 view."""
        tensors = slot.tensors
        if self.packed is not None:
            name, spec = self.packed
            k = objects[0]
            return {
                name: tensors[name].view(self.batch_size, spec.row_length),
                "cu_seqlens": tensors[name + ":cu"][: k + 1],
                "sample_ids": tensors[name + ":ids"][:k],
            }
        cpu_output = self._cpu_output
        values = [
            part.collate(tensors, n, obj, tensor_transforms and part.name != raw, cpu_output)
            for part, obj in zip(self.parts, objects)
        ]
        if self.as_dict:
            return dict(zip(self.names, values))
        return values

    def collate_mixed(self, slot: Slot, n: int, objects: list) -> Any:
        """``collate`` with MixUp/CutMix on the CPU, their plan drawn from the batch's generator (the fill stage
        leaves it on the slot, after the per-sample plan's draws). The blend (or CutMix's box) rides in the
        images' native uint8 -> float32 ToDtype/Normalize pass, reading each sample and its neighbour from the
        slot: a pass of its own over the float batch (38 MB at 64x3x224x224) cost about as much as the
        conversion itself (the soft labels: ``mix.mix_labels``, in numpy). Elsewhere (float16/bfloat16, ...)
        the mix runs after the pipeline into reused buffers (``mix_output``); CutMix on uint8 images pastes the boxes in
        the slot itself (a batch's slot is only refilled once nothing views it, and nothing has viewed it yet)."""
        mix, pipeline = self.mix, self._mix_pipeline
        batch = self.collate(slot, n, objects, True, raw=mix.image)
        plan = mix.plan(batch, slot.batch_rng)
        images = batch[mix.image_key]
        if pipeline is None:  # uint8 images: CutMix only (resolve_batch refuses MixUp there)
            in_place = plan.kind == "cutmix" and images.device.type == "cpu"
            return mix.apply(batch, plan, (lambda x: x) if in_place else self.mix_output)
        out = self._cpu_output(mix.image, pipeline, images)
        if pipeline.fuses_mix(images, out):
            return mix.apply_fused(batch, plan, pipeline, out)
        batch[mix.image_key] = pipeline.apply(images, out)
        return mix.apply(batch, plan, self.mix_output)


class Collate(Stage):
    """``(slot, n, objects, fill seconds)`` from the producer stage -> the batch; the slot's reservation
    (``fill.Reservations``) ends once its views exist (they hold it from then on).

    The last stage in the caller's thread before the device copy, so it measures what the caller sees:
    its wait for the batch and its own time between batches (``stats.took``, with the batch's fill time; the
    step also goes to ``steps``, the fill policy's window, which decides between the calling thread and a
    producer thread)."""

    def __init__(
        self,
        source: Any,
        collator: Collator,
        reserved: Any,
        stats: Any,
        steps: Any,
        tensor_transforms: bool = True,
        contiguous: list | None = None,
    ):
        self.source, self.collator, self.reserved, self.stats, self.steps = source, collator, reserved, stats, steps
        self.tensor_transforms = tensor_transforms
        self.contiguous = contiguous if contiguous and collator.packed is None else None
        self._returned_at: float | None = None

    def __next__(self) -> Any:
        started = time.perf_counter()
        if self._returned_at is not None:
            self.steps.append(started - self._returned_at)  # the caller's own time for one batch
        slot, n, objects, fill = next(self.source)
        mix = self.collator.mix
        if mix is not None and self.tensor_transforms:  # on the CPU, fused into ToDtype/Normalize
            out = self.collator.collate_mixed(slot, n, objects)
        else:
            out = self.collator.collate(slot, n, objects, self.tensor_transforms)
        if mix is not None and not self.tensor_transforms:
            # drawn here from the batch's generator (the fill stage leaves it on the slot, after the per-sample
            # plan's draws); run on the device after the copy and ToDtype/Normalize
            plan = mix.plan(out, slot.batch_rng)
            out = AfterCopy(out, lambda batch, m=mix, p=plan: m.apply(batch, p))
        # read before the reservation ends: from then on the producer may refill the slot (and its indices) where
        # the batch does not view it (CPU ToDtype/Normalize made new tensors)
        indices = getattr(slot, "indices", None)
        group = getattr(slot, "group", None)  # a batch of a group slot (group.py): reserved to its last batch
        if group is None or slot.last:
            r = self.reserved
            with r.lock:
                r.ids.discard(id(slot if group is None else group))
        self.stats.took(started, n, self.source.ready, fill, indices)
        if self.contiguous is not None:
            out = contiguous_images(out, self.contiguous)  # (never on the device path, so never an AfterCopy)
        self._returned_at = time.perf_counter()
        return out

    def reset(self, state: dict | None = None) -> None:
        self._returned_at = None  # the caller's time between batches restarts with the stream
        super().reset(state)
