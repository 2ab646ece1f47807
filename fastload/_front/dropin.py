"""What being a drop-in for torch's DataLoader asks of the fast path, in one place.

* which ``collate_fn`` / ``batch_sampler`` / ``worker_init_fn`` the fast path can honour, and the reason
  when it cannot (``NotFastPath``);
* the warning when a fastload.Dataset that could take the fast path is refused it (``FastPathWarning``,
  once per loader, never silently);
* a torchvision ImageFolder / DatasetFolder (timm's ImageDataset) over its cached pack (``_front/tvfolder.py``): said
  once when it takes the fast path, and when it cannot, the reason (``FastPathWarning`` both);
* torch's own warnings that the fast path must give too (``pin_memory`` without an accelerator);
* the batch memory format, a declared choice (``memory_format=``).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
from torch.utils.data import BatchSampler
from torch.utils.data._utils.collate import default_collate

from ..fields import NotFastPath
from .._errors import FastPathWarning

MEMORY_FORMATS = (torch.channels_last, torch.contiguous_format)


def check_collate(collate_fn: Any) -> None:
    """``default_collate`` (what torch puts in ``loader.collate_fn``, and what Lightning passes back when it
    re-creates a loader) is not a custom collate: the fast path produces the same structure."""
    if collate_fn is not None and collate_fn is not default_collate:
        name = getattr(collate_fn, "__qualname__", type(collate_fn).__name__)
        raise NotFastPath(f"a custom collate_fn ({name}) runs per sample in Python")


def check_batch_sampler(batch_sampler: Any) -> None:
    if batch_sampler is not None and not (
        isinstance(batch_sampler, BatchSampler) and isinstance(getattr(batch_sampler, "batch_size", None), int)
    ):
        raise NotFastPath(
            f"a custom batch_sampler ({type(batch_sampler).__name__}, not a torch BatchSampler with a "
            f"fixed batch_size) can give batches of any size"
        )


def is_lightning_seeding(fn: Any) -> bool:
    """Lightning's ``seed_everything(workers=True)`` sets ``worker_init_fn`` to seed each worker's random,
    numpy and torch generators. The fast path runs no worker processes and keys its augmentation by
    (seed, epoch, rank, batch), so there is nothing for it to seed: it is accepted and not called."""
    func = fn.func if isinstance(fn, functools.partial) else fn
    return getattr(func, "__name__", "") == "pl_worker_init_function" and getattr(func, "__module__", "").split(".")[
        0
    ] in ("lightning", "lightning_fabric", "pytorch_lightning")


def check_worker_init_fn(fn: Any) -> None:
    """The fast path has no worker processes to initialise: refuse ``worker_init_fn`` clearly."""
    if fn is None or is_lightning_seeding(fn):
        return
    name = getattr(fn, "__qualname__", type(fn).__name__)
    raise ValueError(
        f"worker_init_fn={name} cannot run on fastload's fast path: it has no worker processes; native threads "
        f"decode and gather the batches and run no Python, and augmentation randomness is keyed by the loader's "
        f"seed, the epoch, the rank and the batch (so nothing needs seeding per worker). Drop worker_init_fn (pass "
        f"seed= for reproducible augmentation), or, to run your own per-sample Python in worker processes, use a "
        f"Dataset that is not a fastload.Dataset (the generic path calls worker_init_fn in each worker, like torch)"
    )


def warn_refused(reason: str, order: Any = None, stacklevel: int = 3, batched: bool = False) -> None:
    """``order``: the generic path's ``fast.order.Order`` (None: a sampler of the user's picks the indices).
    ``batched``: torch's fetcher will ask ``fastload.Dataset.__getitems__`` for whole batches, which it decodes
    in one native call; else samples are decoded one by one."""
    if order is None:
        kept = "the order is the sampler's, as on the fast path"
    else:
        split = f", rank {order.rank} of {order.world_size}" if order.world_size > 1 else ""
        kept = (
            f"the order, seed and rank split stay fastload's ({order.kind}, seed={order.seed}{split}): the same "
            f"samples in the same batches as the fast path, resumable the same way"
        )
    speed = (
        "each batch is still decoded in one native call (torch's fetcher calls fastload.Dataset.__getitems__), "
        "but without the fast path's reused slots, producer thread and device prefetch"
        if batched
        else "per-sample decoding, like torch's DataLoader, which is much slower"
    )
    warnings.warn(
        f"fastload.DataLoader is not on the fast path for this fastload.Dataset: {reason}. It takes the "
        f"generic path: {speed}; {kept}. Silence with "
        "warnings.filterwarnings('ignore', category=fastload.FastPathWarning)",
        FastPathWarning,
        stacklevel=stacklevel,
    )


def check_folder_worker_init_fn(fn: Any) -> None:
    """A torchvision script's ``worker_init_fn`` ran in its worker processes: with a folder dataset it keeps
    torch's path (said), where a fastload.Dataset's loader refuses it (``check_worker_init_fn``)."""
    if fn is not None and not is_lightning_seeding(fn):
        name = getattr(fn, "__qualname__", type(fn).__name__)
        raise NotFastPath(f"worker_init_fn={name} runs in worker processes, which the fast path has none of")


def _folder_name(dataset: Any) -> str:
    root = getattr(dataset, "root", None) or getattr(getattr(dataset, "reader", None), "root", "?")  # timm: reader's
    return f"{type(dataset).__name__}('{root}')"


def warn_folder_fast(dataset: Any, packed: Any, stacklevel: int = 3) -> None:
    """Once per loader: the folder dataset is read from its pack, with its transform converted."""
    pipe = packed.pipelines.get("image")
    steps = ", ".join(
        repr(t)
        for t in (
            pipe.transforms + pipe.augment + tuple(getattr(pipe.tensor, "transforms", ())) if pipe is not None else ()
        )
    )
    warnings.warn(
        f"fastload.DataLoader: {_folder_name(dataset)} ({len(dataset)} samples) takes the fast path: its "
        f"samples, in its order and with its labels, are read from its pack in {packed.path} (made once; "
        f"fastload.open(root) shares it), its transform run natively as [{steps}]. loader.dataset stays "
        f"your dataset. Silence with warnings.filterwarnings('ignore', category=fastload.FastPathWarning)",
        FastPathWarning,
        stacklevel=stacklevel,
    )


def warn_folder_refused(dataset: Any, reason: str, stacklevel: int = 3) -> None:
    """Once per loader: why a folder dataset keeps torch's path."""
    warnings.warn(
        f"fastload.DataLoader: {_folder_name(dataset)} cannot take the fast path: {reason}. It keeps "
        f"torch's path (per-sample Python: the dataset's __getitem__ in worker processes). Silence with "
        f"warnings.filterwarnings('ignore', category=fastload.FastPathWarning)",
        FastPathWarning,
        stacklevel=stacklevel,
    )


def warn_accelerate_rebuild() -> None:
    warnings.warn(
        "accelerator.prepare() rebuilds this fastload.DataLoader into accelerate's DataLoaderShard. Decoding "
        "stays native (torch's fetcher calls fastload.Dataset.__getitems__: one native call per batch, in "
        "its worker processes), but what fastload's loader adds is lost: the reused (pinned) slot ring, "
        "device prefetch (device='cuda', ToDtype/Normalize on the GPU), fastload's order (seed=, order=, "
        "the rank split) and its exact mid-epoch resume, and Bucket/PackSequences batching; num_workers "
        "now counts worker processes, not decode threads. Call fastload.accelerate.prepare(accelerator, "
        "...) with the same arguments instead",
        FastPathWarning,
        stacklevel=4,
    )


def accelerator_available() -> bool:
    acc = getattr(torch, "accelerator", None)
    if acc is not None:
        return acc.is_available()
    return torch.cuda.is_available()


def warn_pin_memory(pin_memory: bool) -> None:
    """torch's warning, word for word, given when each iterator starts."""
    if pin_memory and not accelerator_available():
        warnings.warn(
            "'pin_memory' argument is set as true but no accelerator is found, then device pinned memory "
            "won't be used.",
            stacklevel=3,
        )


def check_memory_format(memory_format: Any) -> torch.memory_format:
    if memory_format not in MEMORY_FORMATS:
        raise ValueError(
            f"memory_format={memory_format!r} should be torch.channels_last (the default: images as "
            f"decoded, no copy) or torch.contiguous_format (one copy per batch, what torch's "
            f"default_collate gives; .view(B, -1) works on it)"
        )
    return memory_format
