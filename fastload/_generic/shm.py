"""Shared-memory batch slots for the generic path: the memfd slot ring, and batches pickled into slots.

Slots: anonymous shared memory (``os.memfd_create`` + ``mmap``: nothing in /dev/shm, and not bound by its
size), a small ring per worker. The first batch sizes a slot (to the page); a larger batch gets a new
slot with 25% headroom and the old one is retired. A new slot's file descriptor follows the result that
announces it over the worker's socket (SCM_RIGHTS, sent by ``_workers``); both sides map it once.

Worker side (``Arena``): with the default collate the worker runs torch's ``collate`` with one rule
replaced: tensors are ``torch.stack``-ed with ``out=`` a view of the slot (numpy arrays become tensors
first, as in torch). The batch is then pickled with a ``persistent_id`` that turns every plain CPU tensor
into ``(offset, dtype, shape, stride)``: tensors already in the slot cost nothing; any other (ints and
floats collated by torch's rules, a custom ``collate_fn``'s output) is copied in once, keeping a dense
layout's strides (e.g. channels_last). Everything else (str, bytes, objects, tensors that require grad) is
pickled as usual, so any picklable batch works. If the in-slot collate raises, torch's ``default_collate``
runs instead, so errors are torch's own.

Main side (``MappedSlot``, ``map_slot``, ``SlotUnpickler``; leases are ``_ring.Slot``). Ownership: a slot is the
worker's until its result is sent, then the main process's. The main process rebuilds the batch as views of a
per-batch ``torch.frombuffer`` over the slot (zero copy) and hands the slot back only once that storage's
use count is back to baseline (the slot ring's rule 1): no tensor, view or numpy array of the batch is alive. A
worker with no free slot maps another (holding batches never blocks nor aliases; memory then grows like torch's
per-batch shared memory); a slot coming back to a worker that already owns ``prefetch_factor + 1`` is unmapped. A
mapping goes with its last view, so batches stay valid after the iterator, loader and workers are gone.
"""

from __future__ import annotations

import io
import math
import mmap
import os
import pickle

import torch
from torch.utils.data._utils import collate as _collate

from .._ring import use_count  # noqa: F401  (re-exported for the tests)

ALIGN = 64  # byte alignment of every tensor in a slot
WORKER, PENDING, LENT = range(3)  # who owns a slot, as the main process sees it


def _round_page(n: int) -> int:
    return max(mmap.PAGESIZE, -(-n // mmap.PAGESIZE) * mmap.PAGESIZE)


def _dense_strides(t: torch.Tensor) -> tuple | None:
    """``t``'s strides if they lay it out densely in some dimension order (e.g. channels_last), else None."""
    expect = 1
    for stride, size in sorted((st, n) for n, st in zip(t.shape, t.stride()) if n != 1):
        if stride != expect:
            return None
        expect *= size
    return t.stride()


def shared_buffer(cap: int) -> tuple[int, mmap.mmap]:
    """``cap`` bytes of anonymous shared memory: ``(fd, mapping)``; the caller closes ``fd`` (the mapping stays).
    Also the per-sample transforms' staging rows (``_augment/fallback_workers.py``), shared with forked workers."""
    fd = os.memfd_create("fastload-slot", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, cap)
        return fd, mmap.mmap(fd, cap)
    except BaseException:
        os.close(fd)
        raise


# -- worker side -----------------------------------------------------------------------------------
class Arena:
    """The slots one worker owns, and a bump allocator for the batch being built.

    Offsets are planned past the end of the current slot when a batch does not fit; those tensors are
    built in private memory and copied into a bigger slot by ``seal`` (only when batches grow).
    """

    def __init__(self):
        self.slots: dict[int, tuple[int, torch.Tensor]] = {}  # sid -> (capacity, uint8 view of the mapping)
        self.free: list[int] = []
        self.unannounced: list[tuple[int, int, int]] = []  # (sid, capacity, fd) not yet sent to main
        self.retired: list[int] = []
        self.next_sid = 0
        self.max_cap = 0
        self.fn_map = dict(_collate.default_collate_fn_map)
        self.fn_map[torch.Tensor] = self.collate_tensor
        self.begin(pick=False)

    def _create(self, cap: int) -> int:
        fd, mm = shared_buffer(cap)
        sid, self.next_sid = self.next_sid, self.next_sid + 1
        self.slots[sid] = (cap, torch.frombuffer(mm, dtype=torch.uint8))  # keeps mm alive; never close() it
        self.unannounced.append((sid, cap, fd))
        self.max_cap = max(self.max_cap, cap)
        return sid

    def _retire(self, sid: int) -> None:
        del self.slots[sid]
        for k, (s, _, fd) in enumerate(self.unannounced):
            if s == sid:  # main never heard of it
                os.close(fd)
                del self.unannounced[k]
                return
        self.retired.append(sid)

    def release(self, frees: list, drops: list) -> None:
        self.free.extend(frees)
        for sid in drops:
            self.slots.pop(sid, None)

    def begin(self, pick: bool = True) -> None:
        sid = None
        if pick and self.free:
            sid = max(self.free, key=lambda s: self.slots[s][0])
            self.free.remove(sid)
        elif pick and self.max_cap:
            sid = self._create(self.max_cap)
        self.sid = sid
        self.cap, self.base = self.slots[sid] if sid is not None else (0, None)
        self.base_ptr = self.base.data_ptr() if self.base is not None else None
        self.bump = self.fit = 0
        self.pending: list[tuple[int, torch.Tensor]] = []
        self.pending_at: dict[int, int] = {}
        self.pids: dict[int, tuple] = {}

    def abort(self) -> None:
        if self.sid is not None:
            self.free.append(self.sid)
        self.begin(pick=False)

    def alloc(self, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
        n = math.prod(shape) * dtype.itemsize
        if n == 0:
            return torch.empty(shape, dtype=dtype)
        off = -(-self.bump // ALIGN) * ALIGN
        self.bump = off + n
        if self.bump <= self.cap:
            self.fit = self.bump
            return self.base[off : self.bump].view(dtype).view(shape)
        t = torch.empty(shape, dtype=dtype)
        self.pending.append((off, t))
        self.pending_at[t.untyped_storage().data_ptr()] = off
        return t

    def collate_tensor(self, batch, *, collate_fn_map=None):
        elem = batch[0]
        if (
            type(elem) is not torch.Tensor
            or elem.layout != torch.strided
            or elem.device.type != "cpu"
            or elem.is_nested
            or elem.is_quantized
            or elem.requires_grad
        ):
            return _collate.collate_tensor_fn(batch, collate_fn_map=collate_fn_map)
        return torch.stack(batch, 0, out=self.alloc(elem.dtype, (len(batch), *elem.shape)))

    def collate(self, batch):
        """``default_collate``'s exact structure, with tensors stacked into the slot."""
        mark = (self.bump, self.fit, len(self.pending))
        try:
            return _collate.collate(batch, collate_fn_map=self.fn_map)
        except Exception:  # retry with torch's own rules: its result, or its error
            self.bump, self.fit = mark[0], mark[1]
            del self.pending[mark[2] :]
            self.pending_at = {t.untyped_storage().data_ptr(): o for o, t in self.pending}
            return _collate.default_collate(batch)

    def _locate(self, t: torch.Tensor) -> int | None:
        ptr = t.untyped_storage().data_ptr()
        if ptr == self.base_ptr:
            return 0
        return self.pending_at.get(ptr)

    def pid(self, t: torch.Tensor):
        """The persistent id of a tensor placed in the slot, or None to pickle it as usual."""
        if t.device.type != "cpu" or t.layout != torch.strided or t.requires_grad or t.is_quantized or t.is_nested:
            return None
        got = self.pids.get(id(t))
        if got is not None:
            return got
        if t.numel() == 0:
            pid = (-1, t.dtype, tuple(t.shape), t.stride())
        else:
            src, at = t, (None if t.is_conj() or t.is_neg() else self._locate(t))
            if at is None:  # not in the slot yet: copy it in once, keeping a dense layout's strides
                strides = _dense_strides(src)
                if strides is None:
                    t = self.alloc(src.dtype, tuple(src.shape))
                else:
                    t = self.alloc(src.dtype, (src.numel(),)).as_strided(src.shape, strides)
                t.copy_(src)
                at = self._locate(t)
            pid = (at + t.storage_offset() * t.element_size(), t.dtype, tuple(t.shape), t.stride())
            t = src
        self.pids[id(t)] = pid
        return pid

    def seal(self, batch) -> tuple[int | None, bytes, list[tuple[int, int, int]], list[int]]:
        """Pickle ``batch`` into the slot and end it: ``(sid, payload, new, retired)``, ``sid`` None when no
        tensor went into a slot. ``new`` lists the slots main has not heard of as ``(sid, capacity, fd)``:
        the caller sends their fds after the result and closes them; ``retired`` lists slots main unmaps."""
        buf = io.BytesIO()
        _SlotPickler(buf, self).dump(batch)
        sid = self.sid
        if self.bump > self.cap:  # first batch, or a larger one: move it into a bigger slot
            cap = _round_page(self.bump if self.max_cap == 0 else max(self.bump * 5 // 4, self.max_cap))
            new = self._create(cap)
            dst = self.slots[new][1]
            if self.fit:
                dst[: self.fit].copy_(self.base[: self.fit])
            for off, t in self.pending:
                flat = t.reshape(-1).view(torch.uint8)
                dst[off : off + flat.numel()].copy_(flat)
            if sid is not None:
                self._retire(sid)
            sid = new
        elif self.bump == 0 and sid is not None:
            self.free.append(sid)
            sid = None
        new, self.unannounced = self.unannounced, []
        retired, self.retired = self.retired, []
        self.begin(pick=False)
        return sid, buf.getvalue(), new, retired


class _SlotPickler(pickle.Pickler):
    """Pickles a batch with every plain CPU tensor as its slot descriptor ``(offset, dtype, shape, stride)``."""

    def __init__(self, file, arena: Arena):
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.arena = arena

    def persistent_id(self, obj):
        return self.arena.pid(obj) if type(obj) is torch.Tensor else None


# -- main side -------------------------------------------------------------------------------------
class MappedSlot:
    """A worker's slot as the main process maps it; ``state`` says who owns it (WORKER, PENDING, LENT)."""

    __slots__ = ("wid", "sid", "mm", "state")

    def __init__(self, wid: int, sid: int, mm: mmap.mmap):
        self.wid, self.sid, self.mm, self.state = wid, sid, mm, WORKER


def map_slot(wid: int, sid: int, fd: int, cap: int) -> MappedSlot:
    """Map the slot a worker announced with ``fd`` (the caller closes ``fd``; the mapping outlives it)."""
    return MappedSlot(wid, sid, mmap.mmap(fd, cap))


class SlotUnpickler(pickle.Unpickler):
    """Rebuilds a batch pickled by ``Arena.seal``: slot tensors become views of ``storage`` (zero copy)."""

    def __init__(self, data: bytes, storage):
        super().__init__(io.BytesIO(data))
        self.storage = storage

    def persistent_load(self, pid):
        off, dtype, shape, stride = pid
        if off < 0:
            return torch.empty(shape, dtype=dtype)
        return torch.empty(0, dtype=dtype).set_(self.storage, off // dtype.itemsize, shape, stride)
