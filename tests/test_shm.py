"""fastload/_generic/shm.py: the generic path's shared-memory batch slots. Batches collated into a slot and pickled as
slot descriptors come back as default_collate's batch, as views of the slot (zero copy), keeping a dense
layout's strides; a larger batch moves to a bigger slot and retires the old one; through the loader, held
batches are never overwritten and outlive it, and slots are reused, not made per batch."""

from __future__ import annotations

import gc
import mmap
import multiprocessing
import os

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset
from torch.utils.data import default_collate

import fastload
from fastload._generic.shm import ALIGN, Arena, SlotUnpickler, map_slot

from workers_common import Samples, both, memfd_mappings, same

pytestmark = pytest.mark.timeout(60)


class Lane:
    """A worker's Arena and the main process's side of its slots, in one process: what _workers does with
    a batch, less the socket."""

    def __init__(self):
        self.arena = Arena()
        self.mapped = {}  # sid -> MappedSlot, as main maps them

    def ship(self, batch=None, samples=None):
        """Collate ``samples`` into a slot (or take ``batch`` as built), seal it, map the slots the worker
        announced and rebuild the batch; returns (batch, the slot's bytes as a tensor or None, sealed)."""
        self.arena.begin()
        if samples is not None:
            batch = self.arena.collate(samples)
        sealed = sid, payload, new, retired = self.arena.seal(batch)
        for s, cap, fd in new:
            self.mapped[s] = map_slot(0, s, fd, cap)
            os.close(fd)
        for s in retired:
            del self.mapped[s]
        if sid is None:
            return SlotUnpickler(payload, None).load(), None, sealed
        view = torch.frombuffer(self.mapped[sid].mm, dtype=torch.uint8)
        return SlotUnpickler(payload, view.untyped_storage()).load(), view, sealed

    def give_back(self, sid):
        self.arena.release([sid], [])


def in_slot(t: torch.Tensor, view: torch.Tensor) -> bool:
    start = view.data_ptr()
    return start <= t.data_ptr() < start + view.numel()


def dict_samples(n: int, base: int = 0) -> list:
    return [{"x": torch.arange(6, dtype=torch.float32).reshape(2, 3) + i, "label": i, "w": i / 4,
             "name": f"s{i}", "raw": bytes([i % 256]) * 3, "arr": np.full(5, i, np.int16)}
            for i in range(base, base + n)]


def test_a_collated_batch_comes_back_as_default_collate_gives_it_in_the_slot():
    lane = Lane()
    samples = dict_samples(4)
    got, view, (sid, _, new, retired) = lane.ship(samples=samples)
    assert same(got, default_collate(samples))
    assert sid == 0 and [s for s, _, _ in new] == [0] and retired == []
    for name in ("x", "label", "w", "arr"):  # every tensor a view of the slot, aligned
        assert in_slot(got[name], view), name
        assert got[name].data_ptr() % ALIGN == 0, name
    assert view.numel() % mmap.PAGESIZE == 0


def test_tensors_from_elsewhere_are_copied_in_keeping_a_dense_layout():
    lane = Lane()
    cl = torch.rand(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    strided = torch.arange(40, dtype=torch.int64).reshape(4, 10)[:, ::3]  # not dense: stored compact
    grad = torch.ones(3, requires_grad=True)  # pickled as usual
    empty = torch.empty(0, 7)
    batch = {"cl": cl, "strided": strided, "grad": grad, "empty": empty, "again": cl}
    got, view, _ = lane.ship(batch=batch)
    assert torch.equal(got["cl"], cl) and got["cl"].stride() == cl.stride() and in_slot(got["cl"], view)
    assert torch.equal(got["strided"], strided) and got["strided"].is_contiguous() and in_slot(got["strided"], view)
    assert got["again"].data_ptr() == got["cl"].data_ptr()  # one tensor twice: copied once
    assert got["grad"].requires_grad and not in_slot(got["grad"], view)
    assert got["empty"].shape == (0, 7)


def test_a_larger_batch_moves_to_a_bigger_slot_and_retires_the_old_one():
    lane = Lane()
    small, view, (sid, *_) = lane.ship(samples=dict_samples(2))
    first_cap = view.numel()
    del small, view
    lane.give_back(sid)  # main is done with the batch: the slot is the worker's again
    reused, view, (again, _, new, retired) = lane.ship(samples=dict_samples(2, base=10))
    assert again == sid and new == [] and retired == []  # same size: the same slot
    assert same(reused, default_collate(dict_samples(2, base=10)))
    del reused, view
    lane.give_back(sid)
    big_samples = [{**s, "x": torch.full((64, 64), float(i))} for i, s in enumerate(dict_samples(8))]
    big, view, (bigger, _, new, retired) = lane.ship(samples=big_samples)
    assert bigger != sid and [s for s, _, _ in new] == [bigger] and retired == [sid]
    assert view.numel() >= 8 * 64 * 64 * 4 * 5 // 4 and view.numel() > first_cap  # with 25% headroom
    assert same(big, default_collate(big_samples))
    assert sid not in lane.arena.slots and sid not in lane.mapped


class Growing(Dataset):
    """Sample i is a (i + 1, 5) float tensor: later batches need bigger slots."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.full((i + 1, 5), float(i)), torch.full((64 * (i + 1),), i, dtype=torch.uint8)


def test_held_batches_are_never_overwritten():
    ds = Samples("dict", 120)
    t, f = both(ds, seed=3, batch_size=4, shuffle=True, num_workers=2)  # f holds all 30 batches at once
    assert same(t, f)
    # hold every other batch, some only through numpy arrays or views
    g = torch.Generator()
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, generator=g)
    g.manual_seed(3)
    kept = []
    for k, b in enumerate(loader):
        if k % 3 == 0:
            kept.append(b["x"].numpy())
        elif k % 3 == 1:
            kept.append(b["x"][1:])
    want = [b["x"].numpy() if k % 3 == 0 else b["x"][1:] for k, b in enumerate(t) if k % 3 != 2]
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(kept, want))


def test_larger_later_batches_regrow_slots():
    # samples of one batch share a shape; batches grow (and shrink) as the epoch goes on
    batches = [[i] * n for i, n in enumerate([1, 2, 4, 3, 8, 2, 16, 5, 39, 1])]
    t, f = both(Growing(), batch_sampler=batches, num_workers=2)
    assert same(t, f)
    loader = fastload.DataLoader(Growing(), batch_sampler=batches, num_workers=1, persistent_workers=True)
    sizes = [b[0].numel() * 4 + b[1].numel() for b in loader]
    caps = [s.mm.size() for s in loader._iterator._slots.values()]
    assert max(caps) >= max(sizes) and len(caps) <= loader.prefetch_factor + 2  # regrown, old ones retired
    del loader


def test_ring_is_reused_and_batches_outlive_the_loader():
    gc.collect()
    maps = memfd_mappings()
    loader = fastload.DataLoader(Samples("tuple", 160), batch_size=4, num_workers=2, persistent_workers=True)
    for _ in range(2):
        for batch in loader:
            pass
    del batch
    it = loader._iterator
    assert len(it._slots) <= 2 * (loader.prefetch_factor + 2)  # slots are recycled, not one per batch
    x, i = next(iter(loader))
    del loader, it
    gc.collect()
    assert multiprocessing.active_children() == []
    assert torch.equal(x, torch.arange(6.0).reshape(2, 3).expand(4, 2, 3) + i.view(4, 1, 1).float())
    del x, i
    gc.collect()
    assert memfd_mappings() == maps
