"""Which path a ``fastload.DataLoader`` takes, decided once at construction, and what it takes it with.

``plan`` gets the loader's arguments (``batch_size`` among them) and hands each part what it uses, in one pass
that goes down the layers: the checks of the front (the drop-in rules, ``dropin.py``; the slot size and a user's
sampler, ``sampling.py``; the folder pack, ``tvfolder.py``), then the batcher (``_fill/``), then the order
(``fast/chain.py`` ``order_for``, or ``fast/order.py``'s plain ``Order``), then ``num_workers='auto'``'s
measurement (``autotune.py``), which fills batches of that batcher and order. It returns a ``Plan``; the loader
keeps its parts and changes none of them.

Fast path: a ``fastload.Dataset`` (or a torchvision/timm folder dataset, packed once) whose samples batch to
fixed shapes; its order is fastload's ``Order`` (or the user's sampler's, ``SamplerOrder``). Generic path:
anything else (``NotFastPath`` says why), with fastload's order where it applies (``generic order`` below).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

from .. import decoders
from .._fill.batcher import Batcher
from .._transforms.sequences import PackSequences
from ..fast.chain import order_for
from ..fast.order import Order, default_seed, dist_info
from ..fields import NotFastPath
from .dataset import Dataset as PackedDataset
from .dropin import (
    check_batch_sampler,
    check_collate,
    check_folder_worker_init_fn,
    check_worker_init_fn,
    warn_folder_fast,
    warn_folder_refused,
    warn_refused,
)
from .getitems import batch_decodable
from .sampling import SamplerOrder, agreed_seed, slot_batch_size
from .tvfolder import folder_dataset, kind_of as folder_kind

# warnings said in ``plan`` point at the line that built the loader: plan <- DataLoader.__init__ <- that line
_CALLER = 3


@dataclass
class Plan:
    """What ``plan`` decided: ``batcher`` (None: the generic path, ``reason`` says why), the order (fastload's
    ``order``, or ``sampled``, a user's sampler driving the fast path; both None: torch's samplers), ``packed``
    (a torchvision/timm folder dataset's pack, which the fast path reads), ``slot_batch`` (samples per slot),
    ``seed`` (drawn where fastload's order or augmentation uses it) and ``num_workers`` (measured for 'auto')."""

    batcher: Batcher | None = None
    order: Order | None = None
    sampled: SamplerOrder | None = None
    packed: Any = None
    slot_batch: int | None = None
    seed: int | None = None
    reason: str | None = None
    num_workers: int = 0


def plan(
    dataset: Any,
    batch_size: int | None,
    *,
    shuffle: Any,
    batch_sampler: Any,
    index_batch_sampler: Any,
    collate_fn: Any,
    worker_init_fn: Any,
    num_workers: int,
    auto: bool,
    on_error: str,
    decoder: str,
    device: Any,
    seed: int | None,
    generator: Any,
    order: str | None,
    rank: int | None,
    world_size: int | None,
    drop_last: bool,
    window: int,
    split: str | None,
    user_sampler: bool,
    iterable: bool,
    num_samples: Callable[[], int | None],
) -> Plan:
    """The loader's path and parts (module docstring). ``batch_sampler`` is the user's argument,
    ``index_batch_sampler`` the one torch's ``__init__`` made (the loader's ``batch_sampler``); ``seed`` the
    user's (None: drawn here where it is used); ``iterable``: an IterableDataset; ``num_samples``:
    ``len(dataset)`` (None: it has none), asked only where the generic path's order needs it."""
    p = Plan(seed=seed, num_workers=num_workers)
    batcher: Batcher | None = None
    try:
        slot, packed = _fast_path(dataset, batch_size, batch_sampler, collate_fn, worker_init_fn)
        p.slot_batch, p.packed = slot, packed
        source = dataset if packed is None else packed  # a folder's pack; loader.dataset stays the user's
        batcher = Batcher(source, slot, num_workers, on_error, decoder, device)
        if user_sampler and batcher.packed is not None:
            raise NotFastPath("PackSequences forms its own batches; a sampler or batch_sampler cannot drive it")
    except NotFastPath as e:
        batcher, p.packed, p.reason = None, None, str(e)
        _refused(dataset, p.reason, decoder)
    source = dataset if p.packed is None else p.packed
    n = None  # the dataset's length, where the generic path's order needs it
    if batcher is not None:
        p.batcher = batcher
        check_worker_init_fn(worker_init_fn)
        if p.packed is not None:
            warn_folder_fast(dataset, p.packed, stacklevel=_CALLER + 1)
        p.seed = seed if seed is not None else default_seed(generator)
        if user_sampler:
            p.sampled = _sampler_order(index_batch_sampler, batcher.batch_size, source, p.seed, rank, world_size)
            return p
    else:
        n = _generic_order_size(dataset, seed, order, rank, world_size, split, user_sampler, iterable, num_samples)
    if batcher is not None or n is not None:  # fastload's order
        kind = order or ("random" if shuffle else "sequential")
        r, w = dist_info(rank, world_size)
        p.seed = p.seed if p.seed is not None else default_seed(generator)
        if seed is None and kind != "sequential":
            p.seed = agreed_seed(p.seed, w)  # ranks must shuffle alike
        size = 1 if batch_size is None else batch_size  # the generic path without automatic batching: one sample
        if batcher is not None or (isinstance(dataset, PackedDataset) and not _packs(dataset)):
            p.order = order_for(source, size, kind, p.seed, r, w, drop_last=drop_last, window=window, split=split)
        elif n is not None:
            p.order = Order(
                n,
                size,
                kind=kind,
                seed=p.seed,
                rank=r,
                world_size=w,
                drop_last=drop_last,
                window=window,
                split=split or "samples",
            )
    if batcher is None:
        if isinstance(dataset, PackedDataset) and dataset.decode:
            batched = (batch_size is not None or batch_sampler is not None) and batch_decodable(dataset)
            warn_refused(str(p.reason), p.order, stacklevel=_CALLER + 1, batched=batched)
    elif auto and p.order is not None:
        from .autotune import autotune

        p.num_workers = autotune(batcher, p.order, source, batcher.batch_size)
        batcher.num_threads = p.num_workers  # its native pool is made at its first use, after this
    return p


def _fast_path(dataset, batch_size, batch_sampler, collate_fn, worker_init_fn) -> tuple[int, Any]:
    """(samples a slot holds, a folder dataset's pack or None); NotFastPath with the reason when there is no
    fast path. A torchvision/timm folder dataset is packed (once) and its transform converted last, after the
    checks that need neither (``tvfolder.py``)."""
    folder = folder_kind(dataset) is not None
    if not folder and not isinstance(dataset, PackedDataset):
        raise NotFastPath("the dataset is not a fastload.Dataset (fastload.open)")
    if not folder and not dataset.decode:
        raise NotFastPath("the dataset was opened with decode=False")
    check_collate(collate_fn)
    check_batch_sampler(batch_sampler)
    size = slot_batch_size(batch_size if batch_sampler is None else None, batch_sampler)
    if size is None:
        raise NotFastPath("batch_size=None (no automatic batching) gives samples one by one")
    if not folder:
        return size, None
    check_folder_worker_init_fn(worker_init_fn)
    return size, folder_dataset(dataset)


def _refused(dataset: Any, reason: str, decoder: str) -> None:
    """The fast path is refused for ``reason``: said for a folder dataset; an error where the generic path would
    drop what was asked for (batch transforms, a GPU decoder, decoder='exact' over a fastload Dataset)."""
    if folder_kind(dataset) is not None:
        warn_folder_refused(dataset, reason, stacklevel=_CALLER + 2)
    # the generic path would not mix: refused, not skipped (a fastload dataset's attribute only: any object
    # answers getattr under unittest.mock.Mock, as Lightning's own tests use for a dataset)
    if isinstance(dataset, PackedDataset) and dataset.batch_mix is not None:
        raise ValueError(
            f"the dataset's batch_transforms ({dataset.batch_mix.transform!r}) run on fastload's "
            f"fast path, which this loader cannot take: {reason}"
        )
    if decoder in ("native", "auto"):
        return
    # a GPU decoder runs on the fast path only; so does any other one over a fastload Dataset, whose __getitems__
    # decodes torch's batches with the native decoder (decoder='exact' would be dropped). Another dataset decodes
    # its own samples (a torchvision ImageFolder: PIL, which decoder='exact' asks for)
    if decoders.kind(decoder).gpu or isinstance(dataset, PackedDataset):
        raise ValueError(f"decoder={decoder!r} needs fastload's fast path, which this loader cannot take: {reason}")


def _sampler_order(batch_sampler: Any, slot_batch: int, source: Any, seed: int, rank, world_size) -> SamplerOrder:
    """The order of a user's sampler driving the fast path (``sampling.py``)."""
    r = getattr(batch_sampler.sampler, "rank", None) if hasattr(batch_sampler, "sampler") else None
    r = r if isinstance(r, int) else dist_info(rank, world_size)[0]
    replicas = getattr(getattr(batch_sampler, "sampler", None), "num_replicas", 1)
    if getattr(source, "remote", False) and isinstance(replicas, int) and replicas > 1:
        warnings.warn(
            "fastload: a remote dataset driven by a distributed sampler: the sampler owns the "
            "order, so each rank downloads every shard its samples lie in (nearly all of them "
            "with a strided split). Without a sampler, fastload.DataLoader(rank=, world_size=) "
            "gives each rank whole shards of its own (split='shards', ~1/world of the data)",
            RuntimeWarning,
            stacklevel=_CALLER + 1,
        )
    return SamplerOrder(batch_sampler, slot_batch, len(source), seed, r)


def _packs(dataset: Any) -> bool:
    return any(isinstance(t, PackSequences) for t in dataset.sequences.values())


def _generic_order_size(
    dataset, seed, order, rank, world_size, split, user_sampler: bool, iterable: bool, num_samples
) -> int | None:
    """The dataset's length where the generic path takes fastload's Order; None where torch's samplers pick the
    indices, as in torch.

    The semantics are the fast path's (``fast/order.py``): each rank a disjoint, equal-length share, the same
    permutation for the same seed, resumable. A fastload.Dataset keeps the order its fast path would have
    had; any other map-style Dataset takes it when asked for (``seed``, ``order``, ``rank``,
    ``world_size``, ``split``: fastload's own arguments, with rank and world size then defaulting to
    torch.distributed's). Asked for nothing, a plain Dataset is torch's, also under torch.distributed:
    every rank reads every sample, as torch's DataLoader does (Lightning and accelerate add their own
    DistributedSampler; accelerate's own tests fail when the loader splits by rank by itself)."""
    asked = {
        k: v
        for k, v in dict(seed=seed, order=order, rank=rank, world_size=world_size, split=split).items()
        if v is not None
    }
    named = ", ".join(f"{k}={v!r}" for k, v in asked.items())
    if iterable:
        if asked:
            raise ValueError(
                f"{named} cannot apply to an IterableDataset ({type(dataset).__name__}): it yields "
                f"its own samples in its own order, so fastload cannot shuffle or split them; do "
                f"that in its __iter__ (torch.distributed.get_rank(), "
                f"torch.utils.data.get_worker_info()), or use a map-style Dataset"
            )
        return None
    if user_sampler:
        return None  # the sampler owns the order (check_order_args refused what it cannot honour)
    dist_info(rank, world_size)  # checked here, as when the order is made
    if not (isinstance(dataset, PackedDataset) or asked):
        return None
    n = num_samples()
    if n is None and asked:
        raise TypeError(f"{named} needs the dataset's length: {type(dataset).__name__} has no __len__")
    return n
