"""Hugging Face accelerate: keep fastload's loader (and its fast path) through ``prepare``.

``Accelerator.prepare(loader)`` rebuilds any ``torch.utils.data.DataLoader`` subclass into accelerate's
own ``DataLoaderShard`` over torch's samplers: the native batcher, fastload's order and its ``seed`` are
gone (the loader says so with a ``FastPathWarning`` when accelerate reads its ``_is_accelerate_prepared``
mark), and accelerate has no hook that lets a loader shard itself. ``fastload.accelerate.prepare`` is the
drop-in for that one call::

    from fastload.accelerate import prepare

    accelerator = Accelerator()
    model, optimizer, loader = prepare(accelerator, model, optimizer, loader)   # not accelerator.prepare

Each fastload loader on the fast path is set up for the accelerator's process (rank = ``process_index``,
world size = ``num_processes``: disjoint, equally long shards, like ``DistributedSampler``; batches
placed on ``accelerator.device`` when that is a GPU, with the decoder chosen for it), marked as prepared and registered
with the accelerator, so ``accelerator.save_state`` / ``load_state`` save and restore its exact position (a
mid-epoch ``load_state`` resumes at the next batch). Everything else goes to ``accelerator.prepare``.

Not covered (these fall back to ``accelerator.prepare`` with a ``FastPathWarning``): ``split_batches``
and ``dispatch_batches``, and a loader whose own sampler is not already distributed. Because the loader is
not accelerate's ``DataLoaderShard``, ``accelerator.gather_for_metrics`` does not know about the wrap-around
padding of the last batch (count samples yourself, or use ``drop_last=True`` for evaluation), and
``accelerator.accumulate`` does not see the end of an epoch (make the batches per epoch a multiple of the
accumulation steps, or step the optimizer yourself after the loop).
"""

from __future__ import annotations

import warnings
from typing import Any

from ._errors import FastPathWarning
from ._front.loader import (
    DataLoader,
    accelerate_ready,
    mark_prepared,
    place_on,
    retarget,
    sampler_replicas,
    warned_of_rebuild,
)

__all__ = ["prepare"]


def prepare(accelerator: Any, *args: Any, device_placement: list[bool] | None = None) -> Any:
    """``accelerator.prepare(*args)``, with fastload loaders kept on their fast path (see the module doc)."""
    if device_placement is not None and len(device_placement) != len(args):
        raise ValueError(
            f"device_placement has {len(device_placement)} entries for {len(args)} objects; give one "
            f"per object, as accelerator.prepare expects"
        )
    out = []
    for k, obj in enumerate(args):
        if isinstance(obj, DataLoader) and not accelerate_ready(obj):
            place = True if device_placement is None else device_placement[k]
            why = _why_not(accelerator, obj)
            if why is None:
                _prepare_loader(accelerator, obj, place)
            else:
                warned_of_rebuild(obj)  # this warning says it; the rebuild need not again
                warnings.warn(
                    f"fastload.accelerate.prepare: this loader is left to accelerator.prepare, which "
                    f"rebuilds it without fastload's fast path: {why}",
                    FastPathWarning,
                    stacklevel=2,
                )
        out.append(obj)
    return accelerator.prepare(*out, device_placement=device_placement)


def _why_not(accelerator: Any, loader: DataLoader) -> str | None:
    if not loader.fast_path:
        return f"it is not on the fast path ({loader.fast_path_reason})"
    if accelerator.split_batches:
        return "split_batches=True (fastload batches are per process; divide batch_size yourself instead)"
    if accelerator.dispatch_batches:
        return "dispatch_batches=True (every process reads its own shard on the fast path)"
    sampler = sampler_replicas(loader)
    if sampler is not None and accelerator.num_processes > 1 and sampler[1] != accelerator.num_processes:
        return (
            f"its sampler ({sampler[0]}) is not a DistributedSampler over {accelerator.num_processes} "
            f"processes; drop sampler= (fastload shards its own order) or pass one"
        )
    return None


def _prepare_loader(accelerator: Any, loader: DataLoader, place: bool) -> None:
    retarget(loader, accelerator.process_index, accelerator.num_processes)
    device = accelerator.device
    if place and device.type == "cuda" and loader.device is None:
        # the loader's own prefetch (side-stream copies, no host sync), with its decoder chosen for the GPU:
        # setting loader.device alone left decoder='auto' with the CPU-only choice made at construction
        place_on(loader, device)
    mark_prepared(loader)  # accelerator.prepare returns it as it is, and registers it
    loader.use_stateful_dataloader = True  # accelerator.save_state / load_state call state_dict / load_state_dict
