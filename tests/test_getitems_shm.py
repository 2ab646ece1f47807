"""fastload/_front/getitems_shm.py: in torch's DataLoader workers, ``__getitems__``'s batch is collated once from the
slot into reused shared memory. What the user receives is exactly ``default_collate([ds[i] ...])`` (type, dtype,
shape, strides, values) at 0 and 2 workers, persistent or not, with pin_memory; a batch the main process still
holds is never overwritten, however many it holds; a buffer it let go of is reused; a user's collate_fn gets
rows equal to ds[i] and its result, and changes it makes to the rows are in default_collate's batch."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import default_collate
from torch.utils.data._utils.fetch import _MapDatasetFetcher

import fastload
from fastload._front import getitems_shm as _getitems_shm
from fastload._native import native

from getitems_common import DETERMINISTIC, EVERY_KIND, assert_same_sample, expected_batches

@pytest.mark.parametrize("as_dict", [False, True])
@pytest.mark.parametrize("workers, persistent, pin", [(0, False, False), (2, False, False), (2, True, True)])
def test_the_loader_s_batches_are_default_collate_s_exactly(every_kind, as_dict, workers, persistent, pin):
    ds = fastload.open(every_kind, as_dict=as_dict, transforms=EVERY_KIND)
    expected = expected_batches(ds, 4)
    loader = TorchLoader(ds, batch_size=4, num_workers=workers, persistent_workers=persistent, pin_memory=pin)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastload.FastPathWarning)  # the worker's first-batch comparison: no difference
        warnings.filterwarnings("ignore", "'pin_memory' argument is set as true")  # torch, on a CPU-only machine
        for _ in range(2 if persistent else 1):
            got = list(loader)
            assert len(got) == len(expected) == 4
            for a, b in zip(got, expected):
                assert_same_sample(a, b)


def test_images_are_written_by_one_native_pass_as_torch_s_copy():
    for c in (1, 3, 4):
        src = torch.randint(0, 256, (3, 17, 35, c), dtype=torch.uint8)
        out = torch.empty(3, c, 17, 35, dtype=torch.uint8)
        native().hwc_to_chw_u8(src.numpy(), out.numpy())
        assert torch.equal(out, src.permute(0, 3, 1, 2).contiguous())
    with pytest.raises(ValueError, match=r"out: expected uint8 \(N, C, H, W\)"):
        native().hwc_to_chw_u8(np.zeros((2, 4, 5, 3), np.uint8), np.zeros((2, 3, 5, 4), np.uint8))
    with pytest.raises(ValueError, match="overlaps src"):
        buf = np.zeros((2, 4, 5, 3), np.uint8)
        native().hwc_to_chw_u8(buf, buf.reshape(2, 3, 4, 5))


def worker_report(rows):
    """A collate_fn: default_collate's batch, with what the worker's pool looked like and what the batch was."""
    out = default_collate(rows)
    shared = getattr(getattr(rows, "state", None), "shared", None)  # None once the worker left the pool
    if shared is None:
        return out, type(out).__name__, 0, 0
    return out, type(out).__name__, sum(len(slots) for slots, _ in shared.pools.values()), shared.fresh


@pytest.fixture
def pooled(monkeypatch):
    """worker_report and change_every_other get the pool's rows as torch's default_collate does (set before the
    workers fork: they inherit it); any other collate_fn gets plain rows."""
    monkeypatch.setattr(_getitems_shm, "POOLED_COLLATES", [default_collate, worker_report, change_every_other])
    from fastload._front import getitems

    monkeypatch.setattr(getitems, "POOLED_COLLATES", _getitems_shm.POOLED_COLLATES)


def test_a_buffer_the_main_process_let_go_of_is_reused(packed_images, pooled):
    ds = fastload.open(packed_images, transforms=DETERMINISTIC)
    expected = expected_batches(ds, 2)
    reports = []
    for i, (batch, kind, buffers, fresh) in enumerate(TorchLoader(ds, batch_size=2, num_workers=1,
                                                                   collate_fn=worker_report)):
        assert type(batch) is list  # a plain list in the main process, as default_collate's
        assert_same_sample(batch, expected[i])
        reports.append((kind, buffers, fresh))
        del batch
    assert len(reports) == 24
    assert {kind for kind, _, _ in reports} == {"SharedList"}  # every batch went through the pool
    # the worker keeps prefetch_factor (2) batches out and the loop holds one: the pool stops at a few buffers
    assert max(buffers for _, buffers, _ in reports) <= 4 < _getitems_shm.POOL_SIZE
    assert reports[-1][2] == 0


@pytest.mark.parametrize("workers", [1, 2])
def test_batches_held_past_the_pool_are_never_overwritten(packed_images, workers, pooled):
    ds = fastload.open(packed_images, transforms=DETERMINISTIC)
    expected = expected_batches(ds, 2)
    reports = []
    held = []
    for batch, kind, buffers, fresh in TorchLoader(ds, batch_size=2, num_workers=workers, collate_fn=worker_report):
        held.append(batch)  # all 24 batches, 4 times the pool's buffers
        reports.append((kind, buffers))
    for got, want in zip(held, expected):
        assert_same_sample(got, want)
    assert [kind for kind, _ in reports[:4]] == ["SharedList"] * 4
    assert max(buffers for _, buffers in reports) == _getitems_shm.POOL_SIZE  # full: the rest in fresh memory
    del held
    # let go, the buffers are reused by the next epoch (a new iterator: new workers, new pools)
    assert all(kind == "SharedList" for _, kind, _, _ in TorchLoader(ds, batch_size=2, num_workers=1,
                                                                     collate_fn=worker_report))


def test_a_user_collate_fn_gets_rows_equal_to_ds_i_and_what_it_returns_is_kept(packed_images):
    ds = fastload.open(packed_images, transforms=DETERMINISTIC, as_dict=True)

    def rows_as_given(rows):
        assert all(isinstance(r, dict) for r in rows)
        # copies: the rows view the worker's slot (torch would move the slot itself to shared memory)
        return [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in r.items()} for r in rows]

    got = list(TorchLoader(ds, batch_size=5, num_workers=2, collate_fn=rows_as_given))
    assert [len(b) for b in got] == [5] * 9 + [3]
    for i, rows in enumerate(got):
        for j, row in enumerate(rows):
            assert_same_sample(row, ds[i * 5 + j])


CALLS = itertools.count()  # a worker's own, after the fork


def change_every_other(rows):
    """A collate_fn: every other call (per worker) changes the rows, then default_collate."""
    changed = next(CALLS) % 2 == 1
    if changed:
        rows[0]["image"].zero_()  # in place, through the view of the slot
        rows[1]["label"] = 99  # a value replaced
    out = default_collate(rows)
    return out, changed, type(out).__name__


def rows_themselves(rows):
    return rows


@pytest.mark.parametrize("as_dict", [False, True])
def test_a_collate_fn_that_returns_the_rows_themselves_sends_plain_copies(packed_images, as_dict):
    ds = fastload.open(packed_images, transforms=DETERMINISTIC, as_dict=as_dict)
    got = list(TorchLoader(ds, batch_size=5, num_workers=2, collate_fn=rows_themselves))
    assert [len(b) for b in got] == [5] * 9 + [3] and all(type(b) is list for b in got)
    for i, rows in enumerate(got):
        for j, row in enumerate(rows):
            assert_same_sample(row, ds[i * 5 + j])  # a plain dict/tuple, equal to ds[i]


def test_what_a_collate_fn_changes_in_the_rows_is_in_default_collate_s_batch(packed_images, pooled):
    ds = fastload.open(packed_images, transforms=DETERMINISTIC, as_dict=True)
    kinds = set()
    for i, (batch, changed, kind) in enumerate(TorchLoader(ds, batch_size=4, num_workers=2,
                                                           collate_fn=change_every_other)):
        want = default_collate([ds[j] for j in range(i * 4, i * 4 + 4)])
        if changed:
            want["image"][0].zero_()
            want["label"][1] = 99
        assert_same_sample(batch, want)
        kinds.add((changed, kind))
    # a replaced value sends the batch to torch's collate; the others stay on the pool
    assert kinds == {(False, "SharedDict"), (True, "dict")}


def test_a_list_the_user_built_goes_to_torch_s_collate(packed_images):
    ds = fastload.open(packed_images, transforms=DETERMINISTIC)

    def flipped(rows):
        return default_collate([(img.flip(-1), label) for img, label in rows[::-1]])

    for i, batch in enumerate(TorchLoader(ds, batch_size=4, num_workers=2, collate_fn=flipped)):
        want = default_collate([(ds[j][0].flip(-1), ds[j][1]) for j in range(i * 4 + 3, i * 4 - 1, -1)])
        assert_same_sample(batch, want)


def test_a_worker_whose_first_batch_differs_from_torch_s_says_so_and_collates_as_torch(packed_images, monkeypatch,
                                                                                       pooled):
    ds = fastload.open(packed_images, transforms=DETERMINISTIC)
    expected = expected_batches(ds, 4)

    def wrong_copy(src, out):  # a pool copy gone wrong: the worker's first-batch comparison must catch it
        out.zero_()

    monkeypatch.setattr(_getitems_shm, "_copy", wrong_copy)  # before the fork: the workers inherit it
    got = list(TorchLoader(ds, batch_size=4, num_workers=2, collate_fn=worker_report))
    for (batch, kind, _, _), want in zip(got, expected):
        assert_same_sample(batch, want)
        assert kind == "list"  # torch's own collate, from the first batch on

    # the warning, seen in this process posing as a worker (a forked worker's is caught by pytest's recorder there)
    from torch.utils.data._utils import worker as torch_worker

    monkeypatch.setattr(torch_worker, "_worker_info", torch_worker.WorkerInfo(id=0, num_workers=1, seed=0, dataset=None))
    ds = fastload.open(packed_images, transforms=DETERMINISTIC)
    fetcher = _MapDatasetFetcher(ds, True, default_collate, False)  # what a worker calls: __getitems__, collate_fn
    with pytest.warns(fastload.FastPathWarning, match=r"differs from torch's default_collate .*\(batch\[0\]: other"):
        assert_same_sample(fetcher.fetch([0, 1, 2, 3]), expected[0])
    assert ds.batch_items.shared is None  # this worker has left the pool: torch's collate from now on
    assert_same_sample(fetcher.fetch([4, 5, 6, 7]), expected[1])
