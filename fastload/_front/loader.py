"""``fastload.DataLoader``: torch's DataLoader signature and semantics, fastload's speed.

Fast path (a ``fastload.Dataset`` whose samples batch to fixed shapes): the Order picks each batch's
indices (or the user's sampler does, ``_front/sampling.py``), the Batcher fills a preallocated slot in one
native call with the GIL released, and a producer thread keeps ``prefetch_factor`` batches ready while
the training step runs. Anything else (any other Dataset, a custom ``collate_fn``, a batch sampler that
is not a torch ``BatchSampler``) takes the generic path: with ``num_workers > 0``, worker processes
collate into shared-memory slots (``_generic/workers.py``); with 0, torch's own single-process iterator. A
fastload.Dataset refused the fast path says so once (``FastPathWarning``, ``_front/dropin.py``).
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from typing import Any, TypeVar

import torch
from torch.utils.data import IterableDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter, _DatasetKind

from .._fill.batcher import Batcher
from .mix import Mixed
from .dropin import (
    check_memory_format,
    check_worker_init_fn,
    warn_accelerate_rebuild,
    warn_pin_memory,
)
from ..fast.device import DevicePrefetcher, DeviceRing, check_device
from .._ring import SlotRing
from .stats import LoaderStats
from ..fast.collate import Collator
from ..fast.chain import fast_iterator, for_rank, replaceable
from ..fast.fill import host_limit
from ..fast.producer import FillPolicy
from ..fast.stage import innermost
from ..fast.order import Order, as_int
from ..fast.position import Progress, loader_guard
from .plan import plan
from .resume import EpochsAndResume
from .sampling import (
    Counted,
    EpochRandomSampler,
    EpochSequentialSampler,
    GenericPlan,
    IndexReplay,
    OrderIndices,
    SamplerOrder,
    agreed_seed,
    check_order_args,
)
from .._generic.workers import WorkerIterator, fallback_reason

T_co = TypeVar("T_co", covariant=True)


class DataLoader(EpochsAndResume, torch.utils.data.DataLoader[T_co]):
    """A drop-in ``torch.utils.data.DataLoader``.

    Extra keyword-only arguments: ``device`` ('cuda': batches arrive on the GPU, copied on a side stream
    and handed over by events, with ToDtype/Normalize run there), ``seed`` (shuffling and augmentation;
    drawn from torch's generator when None), ``order`` ('sequential', 'random', 'quasi'; default from
    ``shuffle``), ``rank``/``world_size`` (default from torch.distributed), ``window`` (shards per
    quasi-random window), ``on_error`` ('raise' or 'skip' corrupt samples), ``decoder``
    ('native': CPU threads, a JPEG shrunk 2x or more decoded at 1/2, 1/4 or 1/8 size; 'exact': CPU threads,
    every JPEG at full size, PIL's (torchvision's) pixels; 'dali': NVIDIA DALI executes the same plans, on the
    GPU with ``device='cuda'``, else in its CPU-only mode; 'nvjpeg': torchvision's GPU decoder, needs
    ``device='cuda'``; 'auto': with ``device='cuda'`` and DALI or torchvision installed, CPU threads and the GPU
    decoder share each batch in the ratio of their measured rates, else 'native'; see ``_fill/images.py``),
    ``memory_format`` (image batches: ``torch.channels_last``, the default, is the decoder's layout at no cost;
    ``torch.contiguous_format`` copies each batch to torch's default layout, where ``.view(B, -1)`` works),
    ``split`` ('samples': ranks take strided samples like DistributedSampler; 'shards': each rank reads
    only its own shards; default 'shards' for a remote dataset with world_size > 1, see ``fast/order.py``).

    A ``sampler`` (``DistributedSampler``, ``RandomSampler``, ...) or a torch ``BatchSampler`` keeps the fast
    path: the sampler owns the order (``_front/sampling.py`` says what that means for determinism and resume).
    ``collate_fn=default_collate`` is torch's default, not a custom collate. ``worker_init_fn`` is refused on
    the fast path (there are no worker processes; Lightning's seeding function is accepted and not needed).

    On the fast path ``num_workers`` is the number of native decode threads (0 decodes in the calling
    thread; ``"auto"`` measures the best count once per dataset and machine, see ``_front/autotune.py``);
    batches depend only on (seed, epoch, rank, world size), never on ``num_workers``.

    Off the fast path, ``seed``, ``order``, ``rank``/``world_size`` (or torch.distributed's, with more than
    one process) keep their meaning: the same Order picks the indices that torch's iterator or the worker
    processes fetch (``_generic_order``); with none of them torch's samplers run, as in torch. What cannot be
    honoured is refused by name (``_sampling.check_order_args``).

    Resume: ``state_dict()`` is a position (epoch, batches done) and loads on any rank; with fastload's own order
    also on another number of ranks or at another batch size (elastic: the rest of the epoch is split over the
    new ranks, ``fast/elastic.py``; docs/guide/resume.md). The epoch is an input
    like ``DistributedSampler``'s: the next iteration runs the epoch ``set_epoch`` named last -- on the loader,
    on the sampler the loader made when given none (Lightning calls ``loader.sampler.set_epoch`` at every
    epoch's start, and after an end-of-epoch checkpoint loads no loader state), or on a user's
    ``DistributedSampler`` -- else the one after the last. So under Lightning a resumed run sees the batches
    an uninterrupted one sees, at epoch ends and mid-epoch (``_begin_epoch``).

    Threads and fork: a fast-path loader runs one iteration at a time (its buffers, plans and decoders are
    shared). A new ``iter(loader)`` or ``load_state_dict()`` in the thread running the current one stops it (its
    ``next()`` then says so), as torch's persistent iterator is reset; from another thread, while it runs,
    ``iter(loader)`` and ``load_state_dict()`` raise at once: give each thread its own loader (a dataset can serve
    several). One iterator shared by threads hands each batch whole to one of them; ``state_dict()`` works from any
    thread. A forked child starts iterations of its own (``fast/chain.py`` ``FastIterator``).
    """

    # What a loader whose __init__ was torch's has (a subclass calling torch.utils.data.DataLoader.__init__,
    # torchdata's StatefulDataLoader under a global swap): the generic path, as torch. The mutable ones are
    # made on first use (__getattr__).
    device = None
    seed = None
    _seed_given = None
    _split_given = None
    _seed_loaded = False  # the order's seed is a loaded state's (``resume.py``)
    _loaded = None  # a loaded state no iteration has started from yet (``retarget`` loads it into the new order)
    on_error = "raise"
    memory_format = torch.channels_last
    decoder = "native"
    fast_path_reason = "built by torch.utils.data.DataLoader.__init__, not fastload.DataLoader's"
    _order = None
    _sampled = None
    _packed = None  # a torchvision/timm folder dataset's pack, which the fast path reads (_front/tvfolder.py)
    _user_sampler = False
    _next_epoch = 0
    _resume_at = 0
    _epoch_set = False  # set_epoch was called after the latest iteration started (``_state_dict``)
    _sampler_epoch_seen = 0  # a user's DistributedSampler's epoch at the last iteration (or set_epoch, or load)
    _ring = None
    _collator = None
    _device_ring = None
    _copied_stages = None  # a copied loader's: the chain state of the original's iteration (``__getstate__``)
    _chain_state = None  # a loaded chain state (fast/stage.py), for the next iteration at its position
    _live = None  # the fast path's latest started iteration (a weak reference), superseded by the next one
    _deciding = False  # inside fastload's __init__, until it knows its path
    _LAZY = {"_progress": Progress, "_plan": GenericPlan, "_stats": LoaderStats, "_fill_policy": FillPolicy}

    def __getattr__(self, name: str):
        if name == "_batcher":  # None (the generic path), or re-made after unpickling (see __getstate__)
            value = self.__dict__["_batcher"] = self._new_batcher() if self.__dict__.pop("_remake", False) else None
            return value
        make = type(self)._LAZY.get(name)
        if make is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        value = self.__dict__[name] = make()
        return value

    def __init__(
        self,
        dataset,
        batch_size=1,
        shuffle=None,
        sampler=None,
        batch_sampler=None,
        num_workers=0,
        collate_fn=None,
        pin_memory=False,
        drop_last=False,
        timeout=0,
        worker_init_fn=None,
        multiprocessing_context=None,
        generator=None,
        *,
        prefetch_factor=None,
        persistent_workers=False,
        pin_memory_device="",
        in_order=True,
        device=None,
        seed=None,
        order=None,
        rank=None,
        world_size=None,
        window=8,
        on_error="raise",
        decoder="native",
        memory_format=torch.channels_last,
        split=None,
    ):
        auto = isinstance(num_workers, str) and num_workers == "auto"
        if auto:
            num_workers = os.cpu_count() or 1  # replaced by the measured choice on the fast path
        if prefetch_factor == 0 and isinstance(num_workers, int) and num_workers > 0:
            raise ValueError(
                f"prefetch_factor=0 with num_workers={num_workers}: no batch would ever be asked for "
                f"(torch refuses it too); prefetch_factor is the batches each worker keeps ready "
                f"and should be >= 1, or None for the default 2"
            )
        self._deciding = True  # torch's __init__ checks num_workers; fastload does once it knows its path
        self._user_sampler = sampler is not None or batch_sampler is not None
        check_order_args(sampler, batch_sampler, order, shuffle, rank, world_size)
        if self._user_sampler and isinstance(dataset, Mixed):
            raise ValueError(
                "a fastload.mix draws its samples by weight in its own order: a sampler or batch_sampler would "
                "replace that order (and its weights) by the sampler's over the concatenated datasets. Leave "
                "sampler= out (fastload.DataLoader splits the mix over ranks itself: rank=, world_size=, default "
                "torch.distributed's; under Lightning, Trainer(use_distributed_sampler=False))"
            )
        given = sampler
        if not self._user_sampler and not isinstance(dataset, IterableDataset):
            # torch's default samplers, plus set_epoch: how Lightning's epoch reaches the loader (EpochInput)
            given = EpochRandomSampler(dataset, generator=generator) if shuffle else EpochSequentialSampler(dataset)
        super().__init__(
            dataset,
            batch_size,
            None if given is not sampler else shuffle,
            given,
            batch_sampler,
            num_workers,
            collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        self.device = check_device(device) if device is not None else None  # indexed at the first iteration
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error={on_error!r} should be 'raise' or 'skip'")
        # drawn only where fastload's order or augmentation uses it: otherwise the generic path leaves torch's
        # generators exactly as torch would
        self.seed = as_int("seed", seed, 0) if seed is not None else None
        self._seed_given = self.seed  # what the caller asked for (a state's seed replacing it is said)
        self._split_given = split  # None: the default, which follows the world when the loader is retargeted
        self.on_error = on_error
        self.memory_format = check_memory_format(memory_format)
        self.fast_path_reason: str | None = None
        self._batcher: Batcher | None = None
        self._order: Order | None = None
        self._sampled: SamplerOrder | None = None
        self._next_epoch = 0
        self._resume_at = 0
        self._progress = Progress()  # the latest iteration's position, advanced by what hands out its batches
        self._plan = GenericPlan()  # the generic path's resume state, shared with its index samplers
        self._ring: SlotRing | None = None  # host slots of the fast path, made on first use
        self._device_ring: DeviceRing | None = None  # device slots, kept across epochs
        self._stats = LoaderStats()
        self._fill_policy = FillPolicy()  # inline or producer-thread filling, from measured costs
        self.decoder = decoder
        p = plan(
            dataset,
            batch_size,
            shuffle=shuffle,
            batch_sampler=batch_sampler,
            index_batch_sampler=self.batch_sampler,
            collate_fn=collate_fn,
            worker_init_fn=worker_init_fn,
            num_workers=num_workers,
            auto=auto,
            on_error=on_error,
            decoder=decoder,
            device=self.device,
            seed=self.seed,
            generator=generator,
            order=order,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            window=window,
            split=split,
            user_sampler=self._user_sampler,
            iterable=self._dataset_kind == _DatasetKind.Iterable,
            num_samples=self._num_samples,
        )
        self._batcher, self._order, self._sampled, self._packed = p.batcher, p.order, p.sampled, p.packed
        self._slot_batch, self.seed, self.fast_path_reason, self.num_workers = (
            p.slot_batch,
            p.seed,
            p.reason,
            p.num_workers,
        )
        self._deciding = False
        if isinstance(dataset, Mixed) and self._batcher is not None:
            self._stats.count_datasets(dataset.mixing)  # stats()["mix"]
        tuned = auto and self._order is not None  # measured on the fast path: no advice to give
        if self._batcher is None or (not tuned and self.num_workers > 0):
            self.check_worker_number_rationality()

    def check_worker_number_rationality(self) -> None:
        """torch's advice fits worker processes; on the fast path ``num_workers`` counts native threads."""
        if self._deciding:
            return  # called by torch's __init__: fastload checks once it knows which path it takes
        if self._batcher is None:
            return super().check_worker_number_rationality()
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:
            cpus = os.cpu_count() or 1
        if self.num_workers > cpus:
            warnings.warn(
                f"fastload: num_workers={self.num_workers} asks for {self.num_workers} native decode "
                f"threads (threads in this process, not worker processes) but this process may use "
                f"{cpus} CPUs; threads beyond that only add switching. num_workers='auto' measures "
                f"the best count for this dataset and machine.",
                UserWarning,
                stacklevel=3,
            )

    @property
    def _fast_dataset(self):
        """What the fast path reads: the dataset, or a torchvision/timm folder dataset's pack."""
        return self._packed if self._packed is not None else self.dataset

    def _new_batcher(self) -> Batcher:
        return Batcher(self._fast_dataset, self._slot_batch, self.num_workers, self.on_error, self.decoder, self.device)

    @property
    def fast_path(self) -> bool:
        return self._batcher is not None

    def _torch_index_sampler(self):
        # torch's property through the class this one derives from, never through the module attribute:
        # with torch.utils.data.DataLoader swapped for this class (a sitecustomize), that would be this one
        return super()._index_sampler

    @property
    def _index_sampler(self):
        """What torch's iterator and the generic path's workers draw indices from: on the generic path the
        sampler, replayed from the next batch once after ``load_state_dict`` (``IndexReplay``)."""
        base = self._torch_index_sampler()
        if self._batcher is not None:
            return base
        if self._order is not None:
            return OrderIndices(self._order, self._plan, self._auto_collation)
        if type(self).state_dict is not DataLoader.state_dict:
            # a subclass that keeps its own position (torchdata's StatefulDataLoader) saves the state of the
            # index sampler's iterator itself: it gets torch's, not a replaying wrapper without that state
            return base
        return IndexReplay(self._plan, base)

    def _num_samples(self) -> int | None:
        try:
            return len(self.dataset)
        except TypeError:
            return None

    # -- accelerate ------------------------------------------------------------------------------
    @property
    def _is_accelerate_prepared(self) -> bool:
        """accelerate's mark of a prepared loader. ``Accelerator.prepare`` reads it before rebuilding a loader
        into its own DataLoaderShard, which loses the fast path: that rebuild is said, not silent
        (``fastload.accelerate.prepare`` sets the mark, and the loader is then kept as it is)."""
        ready = self.__dict__.get("_accelerate_ready", False)
        lost = self._batcher is not None or self._order is not None  # the fast path, or fastload's order
        if not ready and lost and not self.__dict__.get("_accelerate_warned"):
            self.__dict__["_accelerate_warned"] = True  # once per loader
            warn_accelerate_rebuild()
        return ready

    @_is_accelerate_prepared.setter
    def _is_accelerate_prepared(self, value: bool) -> None:
        self.__dict__["_accelerate_ready"] = bool(value)

    # -- pickling: no threads, pools, slots or open handles travel; all are re-created lazily -------
    # There is deliberately no __setstate__: pickle restores the dict, and the batcher is re-made at its first
    # use (__getattr__). A __setstate__ is looked up on the instance, and a wrapper that forwards unknown
    # attributes to the loader it wraps (accelerate's DataLoaderShard) handed pickle this class's, which then
    # restored the wrapper's state into the wrapped loader instead of the wrapper.
    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_remake"] = state.pop("_batcher", None) is not None  # a native thread pool (and GPU decoders)
        state["_ring"] = state["_collator"] = None  # host slots (pinned memory is this process's), their collator
        state["_device_ring"] = None  # device slots and a CUDA stream
        state["_iterator"] = None  # a persistent iterator's worker processes stay with this process
        live = state.pop("_live", None)  # an iteration of this process (a weak reference)
        live = live() if live is not None else None
        # where that iteration's chain stands, which the copy's state_dict() says as the original's does
        state["_copied_stages"] = live.state() if live is not None and live.running else None
        state.pop("_guard_of", None)  # a lock: a copy gets its own
        return state

    # -- iteration ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        if self._order is not None:
            return len(self._order)
        return super().__len__()

    def _on_device(self) -> bool:
        return self.device is not None and self.device.type == "cuda"

    def __iter__(self):
        # The iteration's epoch is fixed, and its first indices drawn, at the first next(), not here: Lightning
        # calls iter(loader) before set_epoch for a run's first epoch (a resumed run's too), and torch's
        # single-process iterator draws that late as well. The generic path still makes torch's iterator (or
        # starts its workers) here, through _get_iterator, as torch does.
        if self._batcher is None:
            progress = self._progress = Progress(self._next_epoch, self._resume_at)  # until the first next()

            def begin() -> None:
                epoch, start = self._begin_epoch()
                self._plan.position = (epoch, start)
                progress.epoch, progress.done = epoch, start

            it = self._generic_iter()
            if self._on_device():
                it = DevicePrefetcher(it, depth=self.prefetch_factor or 2, ring=self._device_slots())
            return Counted(it, progress, begin)  # counts what the loop receives
        warn_pin_memory(self.pin_memory)  # what torch says or refuses at iter(), said at iter()
        check_worker_init_fn(self.worker_init_fn)  # Lightning sets it after construction
        with self._guard:
            self._running_here("iter(loader)")  # refused at once from another thread, not at the first next()
        return LazyStart(self)

    @property
    def _guard(self) -> threading.RLock:
        return loader_guard(self.__dict__)  # the iterations' lock (fast/position.py); a forked child's own

    def _running_here(self, what: str):
        """The running fast-path iteration, which this thread may replace (None: none runs); a RuntimeError when
        it runs in another live thread (``fast/chain.py`` ``replaceable``). Called under ``_guard``."""
        return replaceable(self._live() if self._live is not None else None, what)

    def _start(self):
        """The fast path's iterator, made at the iteration's first ``next()`` (``LazyStart``): the chain of
        stages (``fast/chain.py``), each given what it uses. Called under ``_guard``."""
        previous = self._running_here("iter(loader)")  # from another thread: refused (the class docstring)
        if previous is not None:
            # One iteration at a time: the host slots, the batcher's plans and its decoders are the loader's, and
            # two producers filling them hand out each other's batches. The older one stops here (no next() of it
            # is in flight: it runs under _guard too); its next() says why (torch's persistent iterators are
            # reset the same way by a new iter()).
            previous.supersede()
        epoch, start = self._begin_epoch()
        if self._order is not None:
            self._order.set_epoch(epoch)
        self._progress = progress = Progress(epoch, start)
        depth = self.prefetch_factor or 2
        if self._ring is None:
            # a device prefetcher keeps each host batch until its copy ran: the host ring is bounded by those copies
            holds, limit = (self._device_slots().holds, host_limit(depth)) if self._on_device() else (None, None)
            self._ring = SlotRing(self._batcher.new_slot, holds, limit)
            # its CPU ToDtype/Normalize and mix buffers: like the slots, made once, not per iteration
            self._collator = Collator.for_batcher(self._batcher)
        self._batcher.begin_iteration(self.timeout)  # its device and per-sample transform workers, in this thread
        chain, self._chain_state = self._chain_state, None  # a loaded mid-epoch chain state, used once
        ds = self._fast_dataset
        image_keys = (
            []
            if self.memory_format == torch.channels_last
            else [(f.name if ds.as_dict else i) for i, f in enumerate(ds.schema) if f.kind == "image"]
        )
        device = None
        if self._on_device():  # the host chain runs ahead; ToDtype/Normalize run on the device
            keys = {
                (f.name if ds.as_dict else i): ds.pipelines[f.name].batch_tensor
                for i, f in enumerate(ds.schema)
                if f.name in ds.pipelines
            }
            device = (self._device_slots(), keys)
        it = fast_iterator(
            plan=self._order if self._order is not None else self._sampled,
            epoch=epoch,
            start=start,
            batcher=self._batcher,
            slots=self._ring,
            progress=progress,
            policy=self._fill_policy,
            stats=self._stats,
            length=len(self),
            num_workers=self.num_workers,
            depth=depth,
            timeout=self.timeout,
            persistent=self.persistent_workers,
            reading=ds.read_plan if getattr(ds, "remote", False) else None,  # its read plan
            image_keys=image_keys,
            device=device,
            guard=self._guard,
            collator=self._collator,
            state=chain if chain is not None and innermost(chain) == {"epoch": epoch, "batch": start} else None,
        )
        if self._order is not None:
            self._order.prepare(epoch + 1)  # the next epoch's shuffle, in the background while this one runs
        self._live = weakref.ref(it)
        return it

    def _generic_iter(self):
        """torch's ``__iter__`` (persistent iterators kept in ``_iterator`` and reset each epoch), making each
        iterator with ``_get_iterator``, which a subclass may override as in torch."""
        if isinstance(self._iterator, WorkerIterator) and self._iterator._shutdown:
            self._iterator = None  # stopped by an error or Ctrl-C: the next epoch starts new workers
        try:
            return super().__iter__()
        except BaseException:
            if isinstance(self._iterator, WorkerIterator):  # a half-reset iterator must not be reused
                self._iterator._shutdown_workers()
            raise

    def _get_iterator(self):
        """The generic path's iterator: worker processes writing into shared-memory slots (``_generic/workers.py``),
        or torch's own where those cannot run (``fallback_reason``: no workers, pin_memory, DataPipes)."""
        if self._batcher is None and fallback_reason(self) is None:
            return WorkerIterator(self)
        return super()._get_iterator()

    def _device_slots(self) -> DeviceRing:
        if self._device_ring is None:
            self._device_ring = DeviceRing(self.device)
        return self._device_ring

    def stats(self) -> dict:
        """Counters since the loader was made: batches, time the loop waited for data, time filling
        batches, queue depth, slots in the ring, skipped samples (see ``stats_summary()``); with
        ``decoder="auto"`` pairing a GPU decoder, ``hybrid``: the CPU threads' share of each batch and the two
        halves' measured rates (samples/s; the GPU's from device timing events); for a ``fastload.mix`` on the fast
        path, ``mix``: the samples of the batches handed out from each of its datasets, by name (else None)."""
        return self._stats.as_dict() | {
            "slots": len(self._ring or ()),
            "slot_bytes": self._ring.nbytes if self._ring else 0,
            "skipped": self._batcher.skipped if self._batcher else 0,
            "fast_path": self.fast_path,
            "fast_path_reason": self.fast_path_reason,
            "num_workers": self.num_workers,
            "remote": getattr(self._fast_dataset, "remote_stats", lambda: None)(),
            "hybrid": self._batcher.images.split_stats() if self._batcher else None,
            "mix": self._stats.mix_counts(),
        }

    def stats_summary(self) -> str:
        """One line: throughput, the share of time the loop waited for data, whether it is input-bound."""
        return self._stats.summary()


def fill_parts(loader: DataLoader) -> tuple[Batcher, Order] | None:
    """(batcher, order) of a loader on the fast path with fastload's own order, for measuring fill rates
    (``fastload.doctor``'s num_workers finding); None otherwise."""
    if loader._batcher is None or loader._order is None:
        return None
    return loader._batcher, loader._order


# -- for fastload.accelerate: what it reads and changes of a loader, done here, by the loader's own module --
def accelerate_ready(loader: DataLoader) -> bool:
    """Whether ``fastload.accelerate.prepare`` has set this loader up already."""
    return loader.__dict__.get("_accelerate_ready", False)


def warned_of_rebuild(loader: DataLoader) -> None:
    """The caller has said that accelerate rebuilds this loader: ``_is_accelerate_prepared`` need not again."""
    loader.__dict__["_accelerate_warned"] = True


def mark_prepared(loader: DataLoader) -> None:
    """accelerate's mark: ``accelerator.prepare`` returns the loader as it is, and registers it."""
    loader._is_accelerate_prepared = True


def place_on(loader: DataLoader, device: torch.device) -> None:
    """Batches on ``device`` for a loader made without one: the batcher is made again, so its decoder is chosen
    for the device (decoder='auto' pairs a GPU decoder only with device='cuda'); slots made before go with it."""
    loader.device = check_device(device)
    if loader._batcher is not None:
        loader._batcher, loader._ring, loader._collator = loader._new_batcher(), None, None
    loader._device_ring = None


def sampler_replicas(loader: DataLoader) -> tuple[str, Any] | None:
    """(type name, ``num_replicas``) of the user's sampler driving the fast path; None with fastload's order."""
    if loader._sampled is None:
        return None
    sampler = loader._sampled.sampler
    return type(sampler).__name__, getattr(sampler, "num_replicas", None)


def retarget(loader: DataLoader, rank: int, world: int) -> None:
    """fastload's order for process ``rank`` of ``world`` (the same kind, seed and batching), at the position of a
    state loaded before if no iteration has started from it yet."""
    if loader._order is not None:
        source = loader._packed if loader._packed is not None else loader.dataset
        remote = loader._split_given is None and getattr(source, "remote", False)  # its default split: by world
        order = for_rank(loader._order, rank, world, source.reader.sizes if remote else None)
        if order is loader._order:
            return
        if loader._seed_given is None and not loader._seed_loaded and order.kind != "sequential":
            # a seed drawn by this process when the loader was built (before the process group): the ranks' draws
            # differ and their shares would overlap; they shuffle alike as a loader built under it does (__init__)
            order.seed = loader.seed = agreed_seed(loader.seed, world)
        loader._order = order
        if loader._loaded is not None:
            # a state loaded before and not iterated from yet (its position, seed and elastic split were the old
            # order's) goes into the new one, so the run goes on where it was saved; its seed= warning was given
            # at the first load
            given, loader._seed_given = loader._seed_given, None
            try:
                loader.load_state_dict(loader._loaded)
            finally:
                loader._seed_given = given


class LazyStart(_BaseDataLoaderIter):
    """What ``iter(loader)`` returns on the fast path: the iteration starts (its epoch fixed, the sampler drawn,
    the producer thread started) at the first ``next()`` or look inside, not at ``iter()`` (see
    ``DataLoader.__iter__``). A ``_BaseDataLoaderIter`` by type, as torch's iterators (Lightning checks it);
    its ``__init__`` does not run."""

    def __init__(self, loader: DataLoader):
        self._loader = loader  # dropped once started: a temporary loader then goes with its iterator
        self._inner = None

    def _started(self):
        loader = self._loader  # None once started (the order of the assignment below)
        if loader is not None:
            with loader._guard:  # one iterator shared by threads starts once
                if self._inner is None:
                    self._inner, self._loader = loader._start(), None
        return self._inner

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._inner if self._inner is not None else self._started())

    def __len__(self) -> int:
        return len(self._inner) if self._inner is not None else len(self._loader)

    def close(self) -> None:
        if self._inner is not None and hasattr(self._inner, "close"):
            self._inner.close()

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_inner", "_loader"):
            raise AttributeError(name)
        return getattr(self._started(), name)
