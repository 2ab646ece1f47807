"""The slot ring: batch buffers allocated once and reused, and the one protocol for who may touch them when.

Every buffer fastload hands out lives in a *slot*: the fast path's host slots (``Batcher.new_slot``,
pinned where CUDA is usable), the generic path's shared-memory slots (``_workers``, leased per batch)
and the prefetcher's device slots (``fast/device.py``). A ``SlotRing`` owns the slots of one producer and
grows instead of aliasing when every slot is busy; the device ring stops growing at its bound and reuses
a slot nobody holds in stream order instead (``fast/device.py`` ``DeviceRing``), and lets go of the slots an
epoch did not need at the next one. The fast path's host ring, when a device prefetcher reads it, stops
growing at its ``limit`` too: its producer thread waits for the oldest pending copy instead (``CopyHolds``,
``fast/fill.py``), a host wait that never happens in the training thread, and that gives up when the iteration
is abandoned (the training thread joins the producer then: it must not wait for the GPU through it).

The protocol (docs/ARCHITECTURE.md, "Stream ordering", says it with pictures):

1. **Held.** A slot is refilled only when no tensor or array viewing it is alive outside the ring: its
   buffers' storage use counts are back to the baseline taken when the slot was made (``Slot.held``).
   This covers the caller's batches and anything the pipeline still keeps, e.g. the prefetcher keeps
   a host batch referenced until the copy that reads it has completed, so a pinned host slot is never
   refilled under an in-flight DMA (rule 2 is rule 1 plus a reference).
2. **Host slot, read by a stream.** Whoever hands a host slot to a stream keeps it referenced until an
   event recorded after that stream's last use has completed, checked with a query, never a host wait.
3. **Device slot, written by the side stream.** Device buffers are allocated on the consumer's stream
   (the training loop's). Before the side stream writes a slot it waits on an event recorded on the
   consumer stream *after* the slot was acquired, which is after (a) every buffer's allocation: the
   caching allocator may hand the consumer stream a block that kernels still queued there use (memory
   Python freed, whose kernels have not run yet), and (b) the consumer's last use of the slot's previous
   batch (the caller dropped every view before the slot could be acquired). One event per batch, plus
   one on the stream the slot was last handed to when that is not the current one (a consumer that
   switches streams: its reads are queued there). Pageable sources are first copied into pinned staging
   of the slot: a copy from pageable memory would make the host wait for the side stream.
4. **Freeing.** A device buffer is marked as used by the side stream when it is allocated
   (``record_stream``), and by each stream it is handed to, so the caching allocator reuses its memory
   only once their work on it has completed, whenever the ring (or the caller's last view) lets it go.
5. **Hand-over.** The consumer stream waits on the side stream's copy event before the batch is handed
   out; the host never blocks.
6. **Fork.** Pinned memory does not survive ``fork``: the CUDA driver maps it shared, so every child
   forked after the parent pinned (or initialised CUDA) would write the same physical pages. A ring
   belongs to the process that made it (a child starts with an empty one), and a child forked after
   CUDA was initialised or memory was pinned never pins (``pinned_memory_usable``), with a warning.

Streams are reached through a small backend (``HostStreams`` for ``device='cpu'``, ``CudaStreams``) so
that tests/ can run the same code against a simulated GPU whose queued work runs late and whose checker
fails on any unordered pair of accesses to one buffer (tests/sim_streams.py).
"""

from __future__ import annotations

import collections
import mmap
import os
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Iterable

import torch


def use_count(t: torch.Tensor) -> int:
    """How many references ``t``'s storage has (tensors, views, numpy arrays over it)."""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


class Slot:
    """Named buffers for one batch, with the use counts they have while nobody else views them.

    ``arrays`` holds numpy views of the CPU buffers (what the native calls write into). ``copy_event`` is
    the device slot's: the event after the side stream's last work on the slot (the host memory that work
    reads is kept referenced until then by the ring's ``CopyHolds``, rules 2 and 4)."""

    def __init__(self, tensors: dict[Any, torch.Tensor] | None = None):
        self.tensors: dict[Any, torch.Tensor] = {}
        self.arrays: dict[Any, Any] = {}
        self.baseline: dict[Any, int] = {}
        self.copy_event = None
        self.receiver = None  # the stream the slot's latest batch was handed to (its reads are queued there)
        self.readers: set = set()  # streams the buffers were recorded for (record_stream)
        self.fenced: set = set()  # device rows a GPU decoder's stream has waited for (their allocation)
        for key, t in (tensors or {}).items():
            self.put(key, t)

    def put(self, key, t: torch.Tensor) -> torch.Tensor:
        self.tensors[key] = t
        if t.device.type == "cpu" and t.dtype != torch.bfloat16:  # numpy has no bfloat16
            self.arrays[key] = t.numpy()
        else:
            self.arrays.pop(key, None)
        self.baseline[key] = use_count(t)
        return t

    def held(self) -> bool:
        """True while any tensor or array viewing this slot is alive outside it."""
        return any(use_count(t) != self.baseline[k] for k, t in self.tensors.items())

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


class CopyHolds:
    """Host memory that queued copies still read, each kept referenced until its copy's event completed
    (rule 2): the host batches and parked pinned staging of a device ring.

    Shared by two threads: the one queueing the copies (the training thread: ``keep``, ``release``, both
    queries) and the producer thread filling the host slots those batches view, which may ``wait_oldest``
    when its ring is full. The lock guards the list only and is never held across a wait, so the training
    thread never waits for the GPU through it."""

    def __init__(self, streams):
        self.streams = streams
        self.items: collections.deque = collections.deque()  # (event, what it reads), oldest first
        self.lock = threading.Lock()

    def keep(self, event, obj) -> None:
        with self.lock:
            self.items.append((event, obj))

    def release(self) -> None:
        """Drop what completed copies read (a query per entry; a host slot nobody else views is free again)."""
        done: list = []
        with self.lock:
            pending: collections.deque = collections.deque()
            for item in self.items:
                (done if self.streams.done(item[0]) else pending).append(item)
            self.items = pending
        del done  # the references go here, outside the lock (freeing a batch may run finalisers)

    def wait_oldest(self, stop: Callable[[], bool] | None = None) -> bool:
        """The host waits for the oldest pending copy, then drops what completed; False when none was pending.
        Only in a producer thread (``fast/fill.py``): the copies are queued on one side stream, so waiting
        for the oldest frees at least its batch and is the shortest wait that frees anything.

        ``stop``: gives up as soon as it returns True (the iteration was abandoned: the training thread joins
        the producer and must not wait for the GPU through it). Giving up hands out nothing: what pending copies
        read stays here until their events completed, whoever asks next."""
        with self.lock:
            if not self.items:
                return False
            event = self.items[0][0]
        self.streams.wait_host(event, stop)
        self.release()
        return True

    def __len__(self) -> int:
        return len(self.items)


class SlotRing:
    """The slots of one producer: ``acquire`` returns one nobody holds (or a new one from ``make``).

    ``skip`` names slots (by ``id``) that are reserved although not held yet (filled, queued, not yet
    handed out). A ring made in another process (before a ``fork``) starts empty here (rule 6).

    ``pending`` (a device ring's ``CopyHolds``, given when a device prefetcher reads this ring's batches) and
    ``acquire(bound=n)``: with ``n`` slots or more and copies still pending, ``acquire`` returns None instead
    of growing; the caller waits for the oldest copy (``pending.wait_oldest``), outside its own locks, and
    asks again (``fast/fill.py``). Without pending copies the ring grows: slots the caller itself holds are
    never reused."""

    def __init__(self, make: Callable[[], Slot], pending: CopyHolds | None = None, limit: int | None = None):
        self.make = make
        self.slots: list[Slot] = []
        self.pid = os.getpid()
        self.pending = pending
        self.limit = limit  # the bound a producer thread fills under (None: grow), ``fast/fill.py``
        self.groups: dict[int, SlotRing] = {}  # group slots of several batches each, by batches (fast/group.py)

    def acquire(
        self, skip: Iterable[int] = (), ready: Callable[[Slot], bool] | None = None, bound: int | None = None
    ) -> Slot | None:
        if self.pid != os.getpid():
            self.slots, self.pid = [], os.getpid()  # the parent's memory may be shared with it: never reuse
        for slot in self.slots:
            if id(slot) not in skip and not slot.held() and (ready is None or ready(slot)):
                return slot
        if bound is not None and len(self.slots) >= bound and self.pending is not None and len(self.pending):
            return None
        slot = self.make()
        self.slots.append(slot)
        return slot

    def __len__(self) -> int:
        return len(self.slots) + sum(len(g) for g in self.groups.values())

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.slots) + sum(g.nbytes for g in self.groups.values())

    def clear(self) -> None:
        self.slots = []
        self.groups = {}


# -- pinned host memory, and fork -------------------------------------------------------------------
class _TorchPinned:
    """Page-locked host memory from torch's caching host allocator."""

    @staticmethod
    def available() -> bool:
        return cuda_available()

    @staticmethod
    def empty(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    @staticmethod
    def parent_initialised() -> bool:
        """True in a child forked after its parent initialised CUDA."""
        bad = getattr(torch.cuda, "_is_in_bad_fork", None)
        return bool(bad()) if bad is not None else False


def cuda_available() -> bool:
    """``torch.cuda.is_available()`` asked through NVML where the user did not choose: the default check
    initialises the CUDA runtime in this process, and a process forked after that (DataLoader workers,
    a forked child's torch ops) can no longer use CUDA and may hang. torch reads the variable per call."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    try:
        return torch.cuda.is_available()
    except Exception:  # a broken CUDA install must not break CPU loading
        return False


PINNED = _TorchPinned()  # replaced in tests by a pool that behaves like the driver's across fork
_pinned_by: int | None = None  # pid of the process that pinned memory; inherited by forked children
_warned: set[str] = set()


def warn_once(key: str, message: str, category=RuntimeWarning) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, category, stacklevel=3)


def pinned_memory_usable() -> bool:
    """Whether host slots should be pinned here: CUDA usable and this process not a child forked after
    its parent initialised CUDA or pinned memory (warns once when that is why not)."""
    if not PINNED.available():
        return False
    forked = _pinned_by is not None and _pinned_by != os.getpid()
    if forked or PINNED.parent_initialised():
        warn_once(
            "fork",
            f"fastload: process {os.getpid()} was forked after its parent initialised CUDA (or "
            f"pinned memory); pinned memory is shared with the parent after fork, so this process "
            f"uses unpinned batch slots (host-to-device copies are not asynchronous here). Use "
            f"the 'spawn' or 'forkserver' start method to keep pinned slots.",
        )
        return False
    return True


def host_empty(shape: tuple, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """A host buffer, page-locked when ``pin`` (and possible: a locked-memory limit falls back, warning once)."""
    global _pinned_by
    if pin:
        try:
            t = PINNED.empty(shape, dtype)
            _pinned_by = os.getpid()
            return t
        except RuntimeError as e:
            warn_once(
                "pin",
                f"fastload: could not pin a {tuple(shape)} {dtype} batch slot ({e}); using "
                f"unpinned memory, so host-to-device copies are not asynchronous",
            )
    return huge_empty(shape, dtype)


HUGE_PAGE = 2 << 20  # x86-64's and arm64's (4 KiB base pages) transparent huge page
HUGE_FROM = 4 << 20  # buffers from this size are backed by huge pages where the kernel allows


def huge_empty(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """``torch.empty``, backed by transparent huge pages when it is large (Linux).

    A batch slot of 64 raw 3x224x224 images (9.6 MB) is written by the native gather row by row: with 4 KiB
    pages each 150 KB row spans 37 pages, each a TLB miss, and the first epoch pays a page fault per 4 KiB.
    torch's allocator does not ask for huge pages (numpy does for its large arrays, which is what the in-RAM
    gather ceiling writes into); here a private anonymous mapping, rounded up to whole huge pages (the kernel
    then aligns it to one), is marked ``MADV_HUGEPAGE`` before anything touches it. Where the kernel has no
    THP or refuses the advice (``transparent_hugepage/enabled`` = ``never``), the mapping stays 4 KiB pages:
    the same buffer, as fast as ``torch.empty``'s."""
    nbytes = dtype.itemsize
    for d in shape:
        nbytes *= int(d)
    if nbytes < HUGE_FROM or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(shape, dtype=dtype)
    size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    try:
        mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:  # no address space for it: torch's allocator decides
        return torch.empty(shape, dtype=dtype)
    try:
        mm.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # a kernel without THP: 4 KiB pages
        pass
    return torch.frombuffer(mm, dtype=torch.uint8)[:nbytes].view(dtype).view(shape)


# -- streams ----------------------------------------------------------------------------------------
class HostStreams:
    """``device='cpu'``: no streams; work runs at once and every event is complete."""

    side = None

    def __init__(self, device: torch.device):
        self.device = device

    def consumer(self):
        return None

    def side_context(self):
        return _Null()

    def empty(self, shape: tuple, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        return torch.empty(shape, dtype=dtype, memory_format=fmt)

    def record_stream(self, t: torch.Tensor, stream) -> None:
        pass

    @staticmethod
    def is_pinned(t: torch.Tensor) -> bool:
        return True  # no copy engine to wait for

    @staticmethod
    def host_empty(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)

    def launch(self, fn: Callable[[], Any], reads: tuple = (), writes: tuple = (), what: str = "") -> Any:
        return fn()

    def record(self, stream, timing: bool = False):
        """No event (everything has run); a timing one is the host's clock: the work ran when it was called."""
        return time.perf_counter() if timing else None

    def wait(self, stream, event) -> None:
        pass

    def wait_host(self, event, stop: Callable[[], bool] | None = None) -> None:
        pass

    @staticmethod
    def done(event) -> bool:
        return True

    @staticmethod
    def elapsed(start, end) -> float:
        return end - start

    def synchronize(self, stream) -> None:
        pass

    def fork(self, name: str) -> "HostStreams":
        return self


# torch.cuda.Stream() is not a new stream: it hands out the next of a fixed pool of streams per device and priority,
# round robin (c10/cuda/CUDAStream.cpp, kStreamsPerPool), shared with every other caller in the process (the user's
# streams, NCCL's, torchvision's nvJPEG stream). Streams drawn often alias each other: fastload's would serialise a
# decoder behind the training loop, and a GPU decoder's output stream (decoders/nvjpeg.py) must share its caching
# allocator pool with no stream that frees memory its queued kernels still use. So fastload's backends keep their
# streams for their lifetime (a loader's decoders are kept across epochs, _fill/images.py) and draw each one past the
# streams fastload holds and the training loops' streams seen (``draw_stream``); ordering never depends on two
# streams being distinct (streams are compared with ==, never ``is``: torch.cuda.current_stream() is a new object
# per call).
POOL_SIZE = 32
_held: collections.Counter = collections.Counter()  # stream -> how many live backends hold it (== and hash: the stream)
_seen: tuple = ()  # the last 8 training loops' streams the prefetchers handed batches to (replaced, never changed)
_held_lock = threading.Lock()


def draw_stream(make: Callable[[], Any]) -> Any:
    """A stream from ``make`` (torch.cuda.Stream: the pool's next) that is none fastload holds and no training loop's
    stream seen, drawing again (the pool's next) while it is; held until ``let_go_stream``. All of the pool taken
    (more than 32 streams alive in fastload and the loops): the last one drawn, with a warning."""
    with _held_lock:
        avoid = set(_held) | set(_seen)
        for _ in range(POOL_SIZE):
            stream = make()
            if stream not in avoid:
                break
        else:
            warn_once(
                "stream-pool",
                f"fastload: every one of the {POOL_SIZE} CUDA streams torch's pool hands out "
                f"(torch.cuda.Stream()) is used by fastload or a training loop; a new loader's "
                f"stream shares one with them, which serialises their work",
            )
        _held[stream] += 1
    return stream


def let_go_stream(stream: Any) -> None:
    """A backend holding ``stream`` is gone (``weakref.finalize``)."""
    with _held_lock:
        _held[stream] -= 1
        if _held[stream] <= 0:
            del _held[stream]


def seen_consumer(stream: Any) -> None:
    """A training loop's stream (a prefetcher hands batches to it): later draws avoid it. Cheap: called per batch
    (a look-up in a tuple that is replaced, never changed, so that another thread may read it meanwhile)."""
    global _seen
    if stream is not None and stream not in _seen:
        with _held_lock:
            if stream not in _seen:
                _seen = (*_seen, stream)[-8:]


def same_stream(a: Any, b: Any) -> bool:
    """Whether two stream objects are one stream (``==``: torch.cuda.current_stream() makes a new object per call,
    so ``is`` tells two objects apart, never two streams; None is only None)."""
    return a is b or (a is not None and b is not None and a == b)


class CudaStreams:
    """One side stream per prefetcher; the consumer is whatever stream is current when a batch is asked for."""

    def __init__(self, device: torch.device):
        self.device = device
        self.side = draw_stream(lambda: torch.cuda.Stream(device=device))
        weakref.finalize(self, let_go_stream, self.side)

    def consumer(self):
        return torch.cuda.current_stream(self.device)

    def side_context(self):
        return torch.cuda.stream(self.side)

    def empty(self, shape: tuple, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        return torch.empty(shape, dtype=dtype, device=self.device, memory_format=fmt)  # on the current stream

    def record_stream(self, t: torch.Tensor, stream) -> None:
        try:
            t.record_stream(stream)
        except RuntimeError:  # memory torch's caching allocator does not own (DLPack): it cannot reuse it early
            pass

    @staticmethod
    def is_pinned(t: torch.Tensor) -> bool:
        return t.is_pinned()

    @staticmethod
    def host_empty(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """A pinned staging buffer (unpinned, with the warning, where pinning is impossible: rule 6)."""
        return host_empty(shape, dtype, pinned_memory_usable())

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)

    def launch(self, fn: Callable[[], Any], reads: tuple = (), writes: tuple = (), what: str = "") -> Any:
        return fn()  # torch queues the kernels on the current stream

    def record(self, stream, timing: bool = False) -> torch.cuda.Event:
        """An event on ``stream``; ``timing``: one whose time ``elapsed`` reads once it completed."""
        ev = torch.cuda.Event(enable_timing=timing)
        ev.record(stream)
        return ev

    def wait(self, stream, event) -> None:
        if event is not None:
            stream.wait_event(event)

    @staticmethod
    def wait_host(event, stop: Callable[[], bool] | None = None) -> None:
        """The host waits for ``event``, or until ``stop()`` is True: only in a producer thread, never the loop's.
        Polled with short sleeps rather than ``Event.synchronize``: an event made without ``blocking=True`` is
        waited for by spinning a core (CUDA's default schedule with fewer contexts than cores), the decode
        threads' core here; and a poll can give up when the training thread abandons the iteration, where a
        synchronize would make it wait for the GPU in ``join``."""
        while event is not None and not event.query():
            if stop is not None and stop():
                return
            time.sleep(2e-4)

    @staticmethod
    def done(event) -> bool:
        return event is None or event.query()

    @staticmethod
    def elapsed(start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        """Device seconds between two timing events; only once ``done(end)`` (``elapsed_time`` of an event not
        yet complete raises, and nothing here synchronises to make it so)."""
        return start.elapsed_time(end) / 1000.0

    @staticmethod
    def synchronize(stream) -> None:
        """The host waits for ``stream``: only in a producer thread (a GPU decoder's batch), never the loop's."""
        stream.synchronize()

    def fork(self, name: str) -> "CudaStreams":
        """The same device with a side stream of its own (a GPU decoder's)."""
        return CudaStreams(self.device)


def streams_for(device: torch.device):
    return CudaStreams(device) if device.type == "cuda" else HostStreams(device)


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
