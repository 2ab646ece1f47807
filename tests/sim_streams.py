"""A simulated GPU for the slot ring's stream protocol: queued work runs late, and a checker fails on races.

``SimGpu`` implements the streams backend of ``fastload._ring`` (``HostStreams``/``CudaStreams``) with:

- **Late execution.** Copies and kernels are queued on their stream and run only when the test calls
  ``run(stream)``/``run_all()``; an event completes when its stream has run past it. A test keeps the
  consumer stream lagging (as a real model does) while the side stream races ahead.
- **A caching allocator with the CUDA allocator's hazard.** Device memory is one CPU arena; a block is
  allocated on the current stream and, when Python frees it (its last view dies), is at once reusable by
  later allocations on *that* stream, although kernels queued on it may still use it (stream order makes
  that safe on that stream only). ``record_stream`` defers reuse until the recorded stream's work done
  at free time has run.
- **A happens-before checker.** Every queued op reads and writes byte ranges; vector clocks follow
  stream order, event waits and host queries (``done``). Two accesses to overlapping bytes, at least one
  a write, that are not ordered are recorded in ``races`` (and by default raise at once).

Device tensors are CPU tensors over the arena, so data races also corrupt data as on a GPU. Queued ops
reach memory by address and keep no tensor alive (a GPU kernel does not either), so use counts see what
they would on a GPU. Host memory a queued copy reads must stay allocated until the copy runs: with CUDA,
torch's caching host allocator defers reusing a freed pinned block until its copies' events completed
(and a copy from pageable memory returns only once it has read it); the tests keep their loaders alive.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
from typing import Any, Callable

import numpy as np
import torch

_ROUND = 512  # the CUDA allocator rounds small blocks to 512 bytes


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
    def __init__(self, name: str):
        self.name = name
        self.ops: collections.deque = collections.deque()
        self.clock: dict[str, int] = {}
        self.queued = 0  # ops ever queued (positions)
        self.ran = 0  # ops ever run

    def __repr__(self) -> str:
        return f"<stream {self.name}>"


class SimEvent:
    def __init__(self, stream: SimStream, position: int):
        self.stream, self.position = stream, position
        self.clock: dict | None = None  # set when the stream runs past it

    @property
    def complete(self) -> bool:
        return self.clock is not None


class _Block(np.ndarray):
    """A view of the arena that tells the allocator when its last user (tensor, view) is gone."""

    def __del__(self):
        sim = getattr(self, "_sim", None)
        if sim is not None:
            sim._freed(self._addr)


class SimGpu:
    """The streams backend of ``fastload._ring`` on a simulated device (see the module docstring)."""

    def __init__(self, arena_bytes: int = 64 << 20, raise_on_race: bool = True):
        self.device = torch.device("cuda", 0)
        self.default = SimStream("consumer")
        self.side = SimStream("side")
        self.streams = [self.default, self.side]
        self._current = self.default
        self.host_clock: dict[str, int] = {"host": 0}
        self.arena = np.zeros(arena_bytes, dtype=np.uint8)
        self.base = self.arena.ctypes.data
        self.top = 0
        self.pools: dict[str, dict[int, list[int]]] = {}  # stream -> size -> free addresses
        self.blocks: dict[int, tuple[int, SimStream, set]] = {}  # addr -> (size, stream, streams recorded)
        self.pending_frees: list[tuple[int, int, SimStream, list[SimEvent]]] = []
        self.accesses: list[tuple[int, int, bool, str, dict, str]] = []
        self.races: list[str] = []
        self.raise_on_race = raise_on_race
        self.syncs = 0

    # -- the backend interface used by fastload ---------------------------------------------------------
    def consumer(self) -> SimStream:
        return self._current if self._current is not self.side else self.default

    def side_context(self):
        @contextlib.contextmanager
        def ctx():
            prev, self._current = self._current, self.side
            try:
                yield
            finally:
                self._current = prev
        return ctx()

    def empty(self, shape: tuple, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
        return self.alloc(shape, dtype, channels_last)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        d, s = _describe(dst), _describe(src)
        self.launch(lambda: _raw(d).copy_(_raw(s)), reads=(src,), writes=(dst,), what="copy")

    def launch(self, fn: Callable[[], Any], reads: tuple = (), writes: tuple = (), what: str = "kernel") -> None:
        self._enqueue(self._current, ("kernel", fn, [_span(t) for t in reads], [_span(t) for t in writes], what))

    def record(self, stream: SimStream) -> SimEvent:
        ev = SimEvent(stream, stream.queued)
        self._enqueue(stream, ("record", ev))
        return ev

    def wait(self, stream: SimStream, event: SimEvent | None) -> None:
        if event is not None:
            self._enqueue(stream, ("wait", event))

    def done(self, event: SimEvent | None) -> bool:
        if event is None:
            return True
        if event.complete:
            self.host_clock = _join(self.host_clock, event.clock)  # the host learned it
        return event.complete

    # -- allocator -------------------------------------------------------------------------------------
    def alloc(self, shape: tuple, dtype: torch.dtype, channels_last: bool = False) -> torch.Tensor:
        """A device tensor allocated on the current stream, as ``torch.empty(device='cuda')`` would be."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
        size = max(_ROUND, -(-nbytes // _ROUND) * _ROUND)
        stream = self._current
        self._settle_frees()
        pool = self.pools.setdefault(stream.name, {}).setdefault(size, [])
        if pool:
            addr = pool.pop()
        else:
            if self.top + size > len(self.arena):
                raise MemoryError("simulated device memory exhausted")
            addr, self.top = self.top, self.top + size
        self.blocks[addr] = (size, stream, set())
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
            self.blocks[addr][2].add(stream)

    def _block_of(self, t: torch.Tensor) -> int | None:
        off = t.untyped_storage().data_ptr() - self.base
        return off if off in self.blocks else None

    def _freed(self, addr: int) -> None:
        size, stream, recorded = self.blocks.pop(addr)
        others = [s for s in recorded if s is not stream]
        if others:
            events = [SimEvent(s, s.queued) for s in others]
            for s, ev in zip(others, events):
                self._enqueue(s, ("record", ev))
            self.pending_frees.append((addr, size, stream, events))
        else:
            self.pools.setdefault(stream.name, {}).setdefault(size, []).append(addr)

    def _settle_frees(self) -> None:
        keep = []
        for addr, size, stream, events in self.pending_frees:
            if all(ev.complete for ev in events):
                self.pools.setdefault(stream.name, {}).setdefault(size, []).append(addr)
            else:
                keep.append((addr, size, stream, events))
        self.pending_frees = keep

    # -- execution -------------------------------------------------------------------------------------
    def _enqueue(self, stream: SimStream, op: tuple) -> None:
        self.host_clock["host"] += 1
        stream.ops.append((op, dict(self.host_clock)))
        stream.queued += 1

    def run(self, stream: SimStream | None = None, ops: int | None = None) -> int:
        """Run up to ``ops`` queued ops of ``stream`` (default: the consumer), stopping at a wait on an
        event that has not completed. Returns how many ran."""
        stream = stream or self.default
        ran = 0
        while stream.ops and (ops is None or ran < ops):
            (op, host), kind = stream.ops[0], stream.ops[0][0][0]
            if kind == "wait" and not op[1].complete:
                break
            stream.ops.popleft()
            stream.ran += 1
            stream.clock = _join(stream.clock, host)
            stream.clock[stream.name] = stream.clock.get(stream.name, 0) + 1
            if kind == "wait":
                stream.clock = _join(stream.clock, op[1].clock)
            elif kind == "record":
                op[1].clock = dict(stream.clock)
            else:
                _, fn, reads, writes, what = op
                for lo, hi in reads:
                    self._access(lo, hi, False, stream, what)
                for lo, hi in writes:
                    self._access(lo, hi, True, stream, what)
                fn()
            ran += 1
        return ran

    def run_all(self) -> None:
        """Run every stream until nothing is queued (round robin, so waits resolve)."""
        while any(s.ops for s in self.streams):
            if not sum(self.run(s) for s in self.streams):
                raise RuntimeError("simulated streams deadlocked: " + ", ".join(
                    f"{s.name} waits" for s in self.streams if s.ops))

    def synchronize(self) -> None:
        self.syncs += 1
        self.run_all()

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
