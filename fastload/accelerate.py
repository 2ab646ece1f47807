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
placed on ``accelerator.device`` when that is a GPU), marked as prepared and registered with the
accelerator, so ``accelerator.save_state`` / ``load_state`` save and restore its exact position (a
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
from ._loader import DataLoader
from .fast.order import Order
from .fast.packing import BucketOrder, PackedOrder

__all__ = ["prepare"]


def prepare(accelerator: Any, *args: Any, device_placement: list[bool] | None = None) -> Any:
    """``accelerator.prepare(*args)``, with fastload loaders kept on their fast path (see the module doc)."""
    if device_placement is not None and len(device_placement) != len(args):
        raise ValueError(f"device_placement has {len(device_placement)} entries for {len(args)} objects; give one "
                         f"per object, as accelerator.prepare expects")
    out = []
    for k, obj in enumerate(args):
        if isinstance(obj, DataLoader) and not obj.__dict__.get("_accelerate_ready", False):
            place = True if device_placement is None else device_placement[k]
            why = _why_not(accelerator, obj)
            if why is None:
                _prepare_loader(accelerator, obj, place)
            else:
                obj.__dict__["_accelerate_warned"] = True  # this warning says it; the rebuild need not again
                warnings.warn(f"fastload.accelerate.prepare: this loader is left to accelerator.prepare, which "
                              f"rebuilds it without fastload's fast path: {why}", FastPathWarning, stacklevel=2)
        out.append(obj)
    return accelerator.prepare(*out, device_placement=device_placement)


def _why_not(accelerator: Any, loader: DataLoader) -> str | None:
    if not loader.fast_path:
        return f"it is not on the fast path ({loader.fast_path_reason})"
    if accelerator.split_batches:
        return "split_batches=True (fastload batches are per process; divide batch_size yourself instead)"
    if accelerator.dispatch_batches:
        return "dispatch_batches=True (every process reads its own shard on the fast path)"
    if loader._sampled is not None and accelerator.num_processes > 1 \
            and getattr(loader._sampled.sampler, "num_replicas", None) != accelerator.num_processes:
        return (f"its sampler ({type(loader._sampled.sampler).__name__}) is not a DistributedSampler over "
                f"{accelerator.num_processes} processes; drop sampler= (fastload shards its own order) or pass one")
    return None


def _prepare_loader(accelerator: Any, loader: DataLoader, place: bool) -> None:
    rank, world = accelerator.process_index, accelerator.num_processes
    if loader._order is not None and (_rank_of(loader._order), _world_of(loader._order)) != (rank, world):
        loader._order = _for_rank(loader._order, rank, world)
    device = accelerator.device
    if place and device.type == "cuda" and loader.device is None:
        loader.device = device  # the loader's own prefetch: side-stream copies, no host sync
    loader._is_accelerate_prepared = True  # accelerator.prepare returns it as it is, and registers it
    loader.use_stateful_dataloader = True  # accelerator.save_state / load_state call state_dict / load_state_dict


def _rank_of(order: Order) -> int:
    return getattr(order, "pack_rank", order.rank)


def _world_of(order: Order) -> int:
    return getattr(order, "pack_world", order.world_size)


def _for_rank(order: Order, rank: int, world: int) -> Order:
    """The same order (kind, seed, batching) for another process."""
    common = dict(kind=order.kind, seed=order.seed, rank=rank, world_size=world, drop_last=order.drop_last,
                  window=order.window)
    if isinstance(order, PackedOrder):
        return PackedOrder(order.lengths, order.tokens_per_batch, **common)
    if isinstance(order, BucketOrder):
        return BucketOrder(order.bucket_ids, order.batch_size, **common)
    shards = order.shard_sizes if order.kind == "quasi" else None
    return Order(order.num_samples, order.batch_size, shard_sizes=shards, **common)
