"""A simulated GPU for the slot ring's stream protocol: queued work runs late, and a checker fails on races.

``SimGpu`` implements the streams backend of ``fastload._ring`` (``HostStreams``/``CudaStreams``) with:

- **Late execution.** Copies and kernels are queued on their stream and run only when the test calls
  ``run(stream)``/``run_all()``; an event completes when its stream has run past it. A test keeps the
  consumer stream lagging (as a real model does) while the side stream races ahead.
- **A caching allocator with the CUDA allocator's hazard.** Device memory is one CPU arena; a block is
  allocated on the current stream and, when Python frees it (its last view dies), is at once reusable by
  later allocations on *that* stream, although kernels queued on it may still use it (stream order makes
  that safe on that stream only). ``record_stream`` defers reuse until the recorded stream's work done
  at free time has run (the allocator's event query then orders the block's next use after that work).
- **Device time.** Each stream has a simulated clock: a kernel or copy advances it by ``cost(what, bytes
  written)`` seconds when it *runs* (late), a wait moves it to the awaited event's time, and every event
  carries the time its stream reached it, so ``elapsed(start, end)`` between two events reports the simulated
  execution time, as ``torch.cuda.Event(enable_timing=True).elapsed_time`` does, and raises while either has
  not completed (CUDA's cudaErrorNotReady). A test makes one stream's kernels slow with ``cost``.
- **A happens-before checker.** Every queued op reads and writes byte ranges; vector clocks follow
  stream order, event waits and host queries (``done``). Two accesses to overlapping bytes, at least one
  a write, that are not ordered are recorded in ``races`` (and by default raise at once).

- **torch's stream objects.** ``current_stream()`` (and a backend's ``consumer()``) returns a new object per call
  for the same stream (``StreamRef``: ``==`` and ``hash`` as the stream, never ``is``), as
  ``torch.cuda.current_stream()`` does; ``new_stream`` hands out a pool's streams, round robin, as
  ``torch.cuda.Stream()`` does (``SimGpu(pool=32)``, torch's size, by default; ``None``: always a new one): after
  ``pool`` of them streams alias (the same object). fastload's backends draw theirs through ``fastload._ring.draw_stream``, as ``CudaStreams`` does.
- **A library with a stream of its own** (``PrivateStreamLibrary``): torchvision's ``decode_jpeg(device='cuda')``
  allocates its outputs on the caller's current stream and writes them on a private stream that waits for
  nothing, synchronises that stream on the host and makes the current stream wait on it.

Device tensors are CPU tensors over the arena, so data races also corrupt data as on a GPU. Queued ops
reach memory by address and keep no device tensor alive (a GPU kernel does not either; ``launch`` swaps what a
production function captured for raw views), so use counts, and the slot ring, see what they would on a GPU.
Host memory a queued copy reads must stay allocated until the copy runs: with CUDA,
torch's caching host allocator defers reusing a freed pinned block until its copies' events completed
(and a copy from pageable memory returns only once it has read it); the tests keep their loaders alive.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import itertools
import threading
import types
import weakref
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from fastload import _ring

_ROUND = 512  # the CUDA allocator rounds every request to 512 bytes
_SMALL = 1 << 20  # requests up to this come from the small pool ...
_SMALL_SEGMENT = 2 << 20  # ... in segments of 2 MiB
_LARGE_SEGMENT = 20 << 20  # large requests under _MIN_LARGE_ALLOC share 20 MiB segments
_MIN_LARGE_ALLOC = 10 << 20
_ROUND_LARGE = 2 << 20  # larger ones get a segment of their own, rounded to 2 MiB


class Race(AssertionError):
    pass


def _join(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        if out.get(k, 0) < v:
            out[k] = v
    return out


def _before(a: dict, b: dict) -> bool:
    """a happens-before-or-equals b."""
    return all(b.get(k, 0) >= v for k, v in a.items())


def _span(t: torch.Tensor) -> tuple[int, int]:
    lo = t.data_ptr()
    if t.numel() == 0:
        return lo, lo
    extent = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return lo, lo + extent * t.element_size()


def _describe(t: torch.Tensor) -> tuple:
    """What a queued op needs to reach ``t``'s bytes later without keeping ``t`` alive: a GPU kernel does
    not keep a Python tensor alive either, so a test must see the memory, not the object."""
    lo, hi = _span(t)
    return lo, hi - lo, tuple(t.shape), tuple(t.stride()), t.dtype


def _raw(desc: tuple) -> torch.Tensor:
    ptr, nbytes, shape, stride, dtype = desc
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    buf = (ctypes.c_uint8 * nbytes).from_address(ptr)
    return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).as_strided(shape, stride)


class SimStream:
    _made = itertools.count()

    def __init__(self, name: str, blocking: bool = False):
        self.name = name
        # its vector clock entry: two loaders' streams of one name (each decoder's 'rows', 'nvjpeg') are two
        # streams; keyed by name, what the host learned of one ordered the other's work (hiding their races)
        self.key = f"{name}#{next(SimStream._made)}"
        self.blocking = blocking  # synchronises implicitly with the legacy default stream (cudaStreamDefault)
        self.ops: collections.deque = collections.deque()
        self.clock: dict[str, int] = {}
        self.queued = 0  # ops ever queued (positions)
        self.ran = 0  # ops ever run
        self.time = 0.0  # simulated device seconds this stream has reached

    def __repr__(self) -> str:
        return f"<stream {self.name}>"


class StreamRef:
    """What ``torch.cuda.current_stream()`` returns: a new object per call, equal to (and hashed as) its stream."""

    __slots__ = ("stream",)

    def __init__(self, stream: SimStream):
        self.stream = stream

    def __eq__(self, other: Any) -> bool:
        return _real(other) is self.stream

    def __hash__(self) -> int:
        return hash(self.stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    def __repr__(self) -> str:
        return f"<current {self.stream!r}>"


def _real(stream: Any) -> Any:
    return stream.stream if isinstance(stream, StreamRef) else stream


class SimEvent:
    def __init__(self, stream: SimStream, position: int):
        self.stream, self.position = stream, position
        self.clock: dict | None = None  # set when the stream runs past it
        self.time: float | None = None  # the stream's simulated time then

    @property
    def complete(self) -> bool:
        return self.clock is not None


class HostWait(NamedTuple):
    """The host blocked on ``stream`` in ``thread`` (a pageable copy, a synchronize); ``ran``: how many
    queued ops (any stream) had to run before it could go on: > 0 means it waited for GPU work."""
    thread: str
    stream: str
    why: str
    ran: int
    on: frozenset = frozenset()  # the streams whose ops had to run


class _Block(np.ndarray):
    """A view of the arena that tells the allocator when its last user (tensor, view) is gone."""

    def __del__(self):
        sim = getattr(self, "_sim", None)
        if sim is not None:
            sim._freed(self._addr)


class _FreeBlock(NamedTuple):
    size: int
    segment: tuple[int, int]  # the segment's [start, end): blocks merge only within one
    stream: SimStream
    pool: str


class SimView:
    """The simulated device as another owner of a side stream sees it (a GPU decoder, ``fork``)."""

    def __init__(self, sim: "SimGpu", name: str):
        self._sim = sim
        self.side = _ring.draw_stream(lambda: sim.new_stream(name))  # as CudaStreams draws torch.cuda.Stream()
        weakref.finalize(self, _ring.let_go_stream, self.side)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sim, name)

    def side_context(self):
        return self._sim.stream(self.side)

    def consumer(self) -> StreamRef:
        cur = self._sim._current
        return StreamRef(cur if cur is not self.side else self._sim.default)


class SimGpu:
    """The streams backend of ``fastload._ring`` on a simulated device (see the module docstring)."""

    def __init__(self, arena_bytes: int = 256 << 20, raise_on_race: bool = True, pool: int | None = 32):
        self.device = torch.device("cuda", 0)
        # the legacy default stream: every thread's current stream until it picks another (torch's
        # default stream); streams torch makes are non-blocking, so it orders nothing implicitly with them
        self.default = SimStream("default", blocking=True)
        self.streams = [self.default]
        self.pool, self._drawn = pool, 0  # torch.cuda.Stream()'s pool: None, every stream a new one
        self.side = _ring.draw_stream(lambda: self.new_stream("side"))  # the prefetcher's (CudaStreams.side)
        weakref.finalize(self, _ring.let_go_stream, self.side)
        self._tls = threading.local()
        self._lock = threading.RLock()
        self.host_clock: dict[str, int] = {"host": 0}
        self.arena = np.zeros(arena_bytes, dtype=np.uint8)
        self.base = self.arena.ctypes.data
        self.top = 0
        self.free: dict[int, _FreeBlock] = {}  # addr -> a cached free block (the caching allocator's pools)
        self.blocks: dict[int, tuple[int, SimStream, set, tuple, str]] = {}  # addr -> (size, stream, recorded, segment, pool)
        self.pending_frees: list[tuple[int, list[SimEvent]]] = []
        self.accesses: list[tuple[int, int, bool, str, dict, str]] = []
        self.races: list[str] = []
        self.raise_on_race = raise_on_race
        self.syncs = 0
        self.host_waits: list[HostWait] = []
        self.pinned: set[int] = set()  # storage addresses of page-locked host memory
        self._drained: set[str] = set()
        # simulated seconds an op takes when it runs: a launch, plus a byte rate (a test slows one kernel down)
        self.cost: Callable[[str, int], float] = lambda what, nbytes: 1e-6 + nbytes * 1e-9

    # -- per-thread current stream -----------------------------------------------------------------------
    @property
    def _current(self) -> SimStream:
        return getattr(self._tls, "stream", self.default)

    @_current.setter
    def _current(self, stream: SimStream) -> None:
        self._tls.stream = stream

    @contextlib.contextmanager
    def stream(self, stream: SimStream):
        """``torch.cuda.stream(s)``: ``stream`` is this thread's current stream inside."""
        stream = _real(stream)
        prev, self._current = self._current, stream
        try:
            yield stream
        finally:
            self._current = prev

    def new_stream(self, name: str, blocking: bool = False) -> SimStream:
        """``torch.cuda.Stream()`` (non-blocking, as torch makes them) or a ``cudaStreamDefault`` one. With a
        ``pool``: the pool's next stream, round robin (the ``pool`` first ones are new, then they alias)."""
        if self.pool is not None and not blocking:
            k, self._drawn = self._drawn % self.pool, self._drawn + 1
            pooled = [st for st in self.streams if getattr(st, "pool_index", None) == k]
            if pooled:
                return pooled[0]
        s = SimStream(name, blocking)
        if self.pool is not None and not blocking:
            s.pool_index = k
        self.streams.append(s)
        return s

    def current_stream(self) -> StreamRef:
        """``torch.cuda.current_stream()``: a new object per call."""
        return StreamRef(self._current)

    def fork(self, name: str) -> SimView:
        """This device with a side stream of its own (``CudaStreams.fork``)."""
        return SimView(self, name)

    # -- the backend interface used by fastload ---------------------------------------------------------
    def consumer(self) -> StreamRef:
        return StreamRef(self._current if self._current is not self.side else self.default)

    def side_context(self):
        return self.stream(self.side)

    def empty(self, shape: tuple, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
        return self.alloc(shape, dtype, channels_last)

    def is_pinned(self, t: torch.Tensor) -> bool:
        """Memory a copy reads in stream order without the host staging it: page-locked host memory, or the
        simulated device's own (a GPU decoder's rows: device tensors here are CPU tensors over the arena)."""
        return t.device.type == "cpu" and (t.untyped_storage().data_ptr() in self.pinned or self._in_arena(t))

    def host_empty(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """Page-locked host memory (``torch.empty(pin_memory=True)``): copies from it run late, as DMA."""
        t = torch.empty(shape, dtype=dtype)
        self.pinned.add(t.untyped_storage().data_ptr())
        return t

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        d = _describe(dst)
        if src.device.type == "cpu" and not self.is_pinned(src) and not self._in_arena(src):
            # cudaMemcpyAsync from pageable memory: the host first waits for the stream, then stages the
            # bytes (read now, so the caller may reuse them at once) and the DMA runs in stream order
            self._host_wait(self._current, "copy from pageable memory")
            staged = src.clone()
            self.launch(lambda: _raw(d).copy_(staged), reads=(), writes=(dst,), what="copy")
            return
        s = _describe(src)
        self.launch(lambda: _raw(d).copy_(_raw(s)), reads=(src,), writes=(dst,), what="copy")

    def launch(self, fn: Callable[[], Any], reads: tuple = (), writes: tuple = (), what: str = "kernel") -> None:
        """Queue ``fn`` on the current stream. On CUDA ``fn`` runs at once (it queues kernels) and the tensors it
        captured die with it; here it runs late, so the device tensors it captured (closure cells, default
        arguments) are swapped for raw views of their bytes (``_detached``): a slot whose rows a queued kernel
        writes is free again as soon as Python lets go of it, as on a GPU."""
        spans = [_span(t) for t in reads], [_span(t) for t in writes]
        self._enqueue(self._current, ("kernel", self._detached(fn), *spans, what))

    def _loose(self, v: Any) -> Any:
        """``v`` with its simulated-device tensors (also inside tuples, lists, dicts) as raw views that keep no
        storage alive; host tensors stay referenced (a queued copy's pinned source, see the module docstring). A
        container is copied only when it holds such a tensor: one the function fills (a list of what a kernel saw)
        stays the caller's."""
        if isinstance(v, torch.Tensor):
            return _raw(_describe(v)) if self._in_arena(v) else v
        if type(v) is dict:
            loose = {k: self._loose(x) for k, x in v.items()}
            return v if all(loose[k] is x for k, x in v.items()) else loose
        if type(v) in (list, tuple) or (isinstance(v, tuple) and hasattr(v, "_fields")):  # a named tuple too
            items = [self._loose(x) for x in v]
            if all(a is b for a, b in zip(items, v)):
                return v
            return type(v)(*items) if hasattr(v, "_fields") else type(v)(items)
        return v

    def _detached(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """A copy of function ``fn`` whose captured device tensors are raw views (``_loose``), in new cells (the
        function that made ``fn`` keeps its own variables). Other callables are queued as they are."""
        if not isinstance(fn, types.FunctionType):
            return fn
        cells = []
        for cell in fn.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # not yet bound: the maker binds it later, share it
                cells.append(cell)
                continue
            cells.append(types.CellType(self._loose(value)))
        defaults = None if fn.__defaults__ is None else tuple(self._loose(v) for v in fn.__defaults__)
        out = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, defaults, tuple(cells) or None)
        if fn.__kwdefaults__ is not None:
            out.__kwdefaults__ = {k: self._loose(v) for k, v in fn.__kwdefaults__.items()}
        return out

    def record(self, stream: SimStream, timing: bool = False) -> SimEvent:
        """An event on ``stream`` (every one carries its simulated time, timing or not)."""
        stream = _real(stream)
        ev = SimEvent(stream, stream.queued)
        self._enqueue(stream, ("record", ev))
        return ev

    @staticmethod
    def elapsed(start: SimEvent, end: SimEvent) -> float:
        """Simulated device seconds from ``start`` to ``end`` (``Event.elapsed_time``, in seconds)."""
        if not (start.complete and end.complete):
            raise RuntimeError("elapsed_time of an event that has not completed (cudaErrorNotReady)")
        return end.time - start.time

    def wait(self, stream: SimStream, event: SimEvent | None) -> None:
        if event is not None:
            self._enqueue(_real(stream), ("wait", event))

    def wait_host(self, event: SimEvent | None, stop=None) -> None:
        """``Event.synchronize()``: the host blocks until ``event``'s stream ran past it (here: its work, and
        what its waits need, runs now, in the waiting thread), recorded in ``host_waits``. ``stop`` (give up
        when it returns True) has nothing to interrupt here; tests/test_abandon_sim.py's device waits."""
        if event is None:
            return
        with self._lock:
            self._drained = set()
            ran = self._drain(event.stream, event.position + 1)
            self.host_clock = _join(self.host_clock, event.clock)
            self.host_waits.append(HostWait(threading.current_thread().name, event.stream.name,
                                            "event synchronize", ran, frozenset(self._drained)))

    def done(self, event: SimEvent | None) -> bool:
        if event is None:
            return True
        if event.complete:
            self.host_clock = _join(self.host_clock, event.clock)  # the host learned it
        return event.complete

    # -- allocator: torch's caching allocator, per stream, a small and a large pool ------------------------
    def alloc(self, shape: tuple, dtype: torch.dtype, channels_last: bool = False) -> torch.Tensor:
        """A device tensor allocated on the current stream, as ``torch.empty(device='cuda')`` would be.

        As CUDACachingAllocator.cpp: sizes round to 512 bytes; requests <= 1 MiB come from the small pool
        (2 MiB segments), larger ones from the large pool (20 MiB segments below 10 MiB, else rounded to
        2 MiB); the smallest cached block of the stream's pool that fits is taken and split when the rest
        is worth keeping (>= 512 bytes small, > 1 MiB large); freed neighbours merge again. A block freed by
        Python is cached at once for its stream, although kernels queued there may still use it."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
        size = max(_ROUND, -(-nbytes // _ROUND) * _ROUND)
        pool = "small" if size <= _SMALL else "large"
        stream = self._current
        with self._lock:
            self._settle_frees()
            fits = [(b.size, a) for a, b in self.free.items() if b.stream is stream and b.pool == pool and b.size >= size]
            if fits:
                _, addr = min(fits)
                block = self.free.pop(addr)
            else:
                seg = _SMALL_SEGMENT if pool == "small" else \
                    _LARGE_SEGMENT if size < _MIN_LARGE_ALLOC else -(-size // _ROUND_LARGE) * _ROUND_LARGE
                if self.top + seg > len(self.arena):
                    raise MemoryError("simulated device memory exhausted")
                addr, self.top = self.top, self.top + seg
                block = _FreeBlock(seg, (addr, addr + seg), stream, pool)
            rest = block.size - size
            if rest >= _ROUND if pool == "small" else rest > _SMALL:
                self.free[addr + size] = block._replace(size=rest)
            else:
                size = block.size  # the whole block: its tail stays unused until it is freed
            self.blocks[addr] = (size, stream, set(), block.segment, pool)
        raw = self.arena[addr:addr + size].view(_Block)
        raw._sim, raw._addr = self, addr
        flat = torch.from_numpy(raw)[:nbytes].view(dtype)
        if channels_last and len(shape) == 4:
            n, c, h, w = shape
            return flat.view(n, h, w, c).permute(0, 3, 1, 2)
        return flat.view(shape)

    def record_stream(self, t: torch.Tensor, stream: SimStream) -> None:
        addr = self._block_of(t)
        if addr is not None:
            self.blocks[addr][2].add(_real(stream))

    def _in_arena(self, t: torch.Tensor) -> bool:
        return 0 <= t.untyped_storage().data_ptr() - self.base < len(self.arena)

    def _block_of(self, t: torch.Tensor) -> int | None:
        off = t.untyped_storage().data_ptr() - self.base
        return off if off in self.blocks else None

    def _freed(self, addr: int) -> None:
        with self._lock:
            size, stream, recorded, segment, pool = self.blocks.pop(addr)
            others = [s for s in recorded if s is not stream]
            if others:
                events = [SimEvent(s, s.queued) for s in others]
                for s, ev in zip(others, events):
                    self._enqueue(s, ("record", ev))
                self.pending_frees.append((addr, events, _FreeBlock(size, segment, stream, pool)))
            else:
                self._cache(addr, _FreeBlock(size, segment, stream, pool))

    def _cache(self, addr: int, block: _FreeBlock) -> None:
        """A free block back in its pool, merged with free neighbours of its segment."""
        after = self.free.get(addr + block.size)
        if after is not None and after.segment == block.segment:
            del self.free[addr + block.size]
            block = block._replace(size=block.size + after.size)
        before = [a for a, b in self.free.items() if a + b.size == addr and b.segment == block.segment]
        if before:
            a = before[0]
            block = block._replace(size=self.free.pop(a).size + block.size)
            addr = a
        self.free[addr] = block

    def _settle_frees(self) -> None:
        """Blocks whose recorded streams' events completed go back to their pool. The allocator learned that by
        querying the events: what runs on the block's stream from now on comes after that work."""
        keep = []
        for addr, events, block in self.pending_frees:
            if all(ev.complete for ev in events):
                for ev in events:
                    self.host_clock = _join(self.host_clock, ev.clock)
                self._cache(addr, block)
            else:
                keep.append((addr, events, block))
        self.pending_frees = keep

    # -- execution -------------------------------------------------------------------------------------
    def _enqueue(self, stream: SimStream, op: tuple) -> None:
        with self._lock:
            if stream.blocking:  # the legacy default stream and cudaStreamDefault streams order each other
                for other in self.streams:
                    if other is not stream and other.blocking and self.default in (stream, other) and other.queued:
                        ev = SimEvent(other, other.queued)
                        self._queue(other, ("record", ev))
                        self._queue(stream, ("wait", ev))
            self._queue(stream, op)

    def _queue(self, stream: SimStream, op: tuple) -> None:
        self.host_clock["host"] += 1
        stream.ops.append((op, dict(self.host_clock)))
        stream.queued += 1

    def _drain(self, stream: SimStream, upto: int) -> int:
        """Run ``stream`` until it has run ``upto`` ops, and whatever its waits need first; returns how
        many ops ran (on any stream)."""
        ran = 0
        while stream.ran < upto:
            step = self.run(stream, ops=upto - stream.ran)
            if step:
                self._drained.add(stream.name)
            ran += step
            if stream.ran < upto:
                ev = stream.ops[0][0][1]  # stopped at a wait on an event not yet complete
                ran += self._drain(ev.stream, ev.position + 1)
        return ran

    def _host_wait(self, stream: SimStream, why: str) -> None:
        """The host blocks until ``stream``'s queued work has run (``cudaStreamSynchronize``)."""
        with self._lock:
            self._wait_stream(_real(stream), why)

    def _wait_stream(self, stream: SimStream, why: str) -> None:
        self._drained = set()
        ran = self._drain(stream, stream.queued)
        self.host_clock = _join(self.host_clock, stream.clock)
        self.host_waits.append(HostWait(threading.current_thread().name, stream.name, why, ran,
                                        frozenset(self._drained)))

    def waits_in(self, thread: str | None = None, busy: bool = False) -> list[HostWait]:
        """Host waits in ``thread`` (default: this one), every one by default: a wait on an idle GPU (the first
        batch of a process, a stream with nothing queued yet) ran no queued work here but is a host sync all the
        same (``set_sync_debug_mode('error')`` refuses it, and under load it waits). ``busy``: only those that
        waited for queued work."""
        thread = thread or threading.current_thread().name
        return [w for w in self.host_waits if w.thread == thread and (w.ran or not busy)]

    def run(self, stream: SimStream | None = None, ops: int | None = None) -> int:
        """Run up to ``ops`` queued ops of ``stream`` (default: the consumer), stopping at a wait on an
        event that has not completed. Returns how many ran."""
        with self._lock:  # a producer thread's host wait runs queued work too (wait_host)
            return self._run(_real(stream) or self.default, ops)

    def _run(self, stream: SimStream, ops: int | None) -> int:
        ran = 0
        while stream.ops and (ops is None or ran < ops):
            (op, host), kind = stream.ops[0], stream.ops[0][0][0]
            if kind == "wait" and not op[1].complete:
                break
            stream.ops.popleft()
            stream.ran += 1
            stream.clock = _join(stream.clock, host)
            stream.clock[stream.key] = stream.clock.get(stream.key, 0) + 1
            if kind == "wait":
                stream.clock = _join(stream.clock, op[1].clock)
                stream.time = max(stream.time, op[1].time)
            elif kind == "record":
                op[1].clock = dict(stream.clock)
                op[1].time = stream.time
            else:
                _, fn, reads, writes, what = op
                for lo, hi in reads:
                    self._access(lo, hi, False, stream, what)
                for lo, hi in writes:
                    self._access(lo, hi, True, stream, what)
                fn()
                stream.time += self.cost(what, sum(hi - lo for lo, hi in writes))
            ran += 1
        return ran

    def run_all(self) -> None:
        """Run every stream until nothing is queued (round robin, so waits resolve)."""
        while any(s.ops for s in self.streams):
            if not sum(self.run(s) for s in self.streams):
                raise RuntimeError("simulated streams deadlocked: " + ", ".join(
                    f"{s.name} waits" for s in self.streams if s.ops))

    def synchronize(self, stream: SimStream | None = None) -> None:
        """``torch.cuda.synchronize()`` (every stream) or ``stream.synchronize()``."""
        self.syncs += 1
        if stream is not None:
            self._host_wait(_real(stream), "stream synchronize")
            return
        ran = 0
        self._drained = set()
        for s in self.streams:
            ran += self._drain(s, s.queued)
            self.host_clock = _join(self.host_clock, s.clock)
        self.host_waits.append(HostWait(threading.current_thread().name, "device", "synchronize", ran,
                                        frozenset(self._drained)))

    def _access(self, lo: int, hi: int, write: bool, stream: SimStream, what: str) -> None:
        if hi <= lo:
            return
        clock = dict(stream.clock)
        for plo, phi, pwrite, pstream, pclock, pwhat in self.accesses:
            if plo < hi and lo < phi and (write or pwrite) and not _before(pclock, clock):
                msg = (f"unordered {'write' if pwrite else 'read'} by {pwhat} on {pstream} and "
                       f"{'write' if write else 'read'} by {what} on {stream.name} of bytes "
                       f"[{max(lo, plo) - self.base}, {min(hi, phi) - self.base})")
                self.races.append(msg)
                if self.raise_on_race:
                    raise Race(msg)
        self.accesses.append((lo, hi, write, stream.name, clock, what))

    # -- a training step ---------------------------------------------------------------------------------
    def model_step(self, batch: list[torch.Tensor], seen: list, scratch: bool = True) -> None:
        """Queue one step of a model on the consumer stream: a kernel that reads the batch (its values, as
        the kernel sees them when it runs, are appended to ``seen``) and writes activations the size of
        each batch tensor, which Python then frees at once while the kernel is still queued."""
        acts = [self.alloc(tuple(t.shape), t.dtype) for t in batch] if scratch else []
        reads, writes = [_describe(t) for t in batch], [_describe(a) for a in acts]
        snapshot: list = []
        seen.append(snapshot)

        def step():
            snapshot.extend(_raw(d).clone() for d in reads)
            for d in writes:
                _raw(d).view(torch.uint8).fill_(0xA5)

        self.launch(step, reads=tuple(batch), writes=tuple(acts), what="model step")
        del acts  # freed by Python: the allocator may hand these blocks out again on this stream


class PrivateStreamLibrary:
    """torchvision's ``decode_jpeg(datas, device='cuda')`` on the simulated GPU, as decode_jpegs_cuda.cpp does it:
    the outputs are allocated on the caller's current stream, written on a stream of the library's own (one from
    the pool, made once) that waits for nothing of the caller's, which the host then synchronises
    (``cudaStreamSynchronize``), and the current stream waits on an event recorded there (``event.block``).
    ``decode_host(datas)`` gives each image's pixels as (3, H, W) uint8 host tensors (RuntimeError for a corrupt
    one, before anything is allocated, as nvjpegGetImageInfo fails first). ``host_sync=False``: a version that
    leaves out the host synchronisation and relies on ``event.block`` alone (its writes then run late, whenever its
    stream runs)."""

    def __init__(self, sim: SimGpu, decode_host: Callable[[list], list], host_sync: bool = True):
        self.sim, self.decode_host, self.host_sync = sim, decode_host, host_sync
        self.stream = sim.new_stream("torchvision")  # getStreamFromPool: not one fastload knows

    def __call__(self, datas: list) -> list:
        sim = self.sim
        pixels = self.decode_host(datas)
        outs = [sim.alloc(tuple(p.shape), torch.uint8) for p in pixels]  # on the caller's current stream
        with sim.stream(self.stream):
            for p, o in zip(pixels, outs):
                d = _describe(o)
                sim.launch(lambda d=d, p=p: _raw(d).copy_(p), writes=(o,), what="torchvision decode")
        if self.host_sync:
            sim._host_wait(self.stream, "torchvision's stream synchronize")
        sim.wait(sim._current, sim.record(self.stream))
        return outs
