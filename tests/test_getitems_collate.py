"""fastload/_front/getitems.py under torch's own DataLoader with a user's ``collate_fn``: whatever it does with the
rows (copies them, returns them raw, wraps their memory in new tensors or arrays, stashes them across batches
and epochs), no worker crashes and every batch the main process holds keeps ``ds[i]``'s values, epoch after
epoch; the rows it gets are exactly ``ds[i]``'s types; and a sample's random draws depend on the iterator's
seed and the sample's index only, whichever path, worker, batch and ``num_workers`` it goes through."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import default_collate

import fastload
from fastload import transforms as T
from fastload._front import getitems_shm as _getitems_shm

from getitems_common import DETERMINISTIC, EVERY_KIND, RANDOM, assert_same_sample


def _map(obj, fn):
    """``obj`` (rows: dicts, tuples, lists) with ``fn`` applied to each tensor."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(v, fn) for v in obj)
    return obj


def plain(rows):
    return [dict(r) if isinstance(r, dict) else tuple(r) for r in rows]


# -- collate_fns of several shapes (module level: picklable by any start method) -------------------------
def copied_then_collated(rows):
    return default_collate(plain(rows))


def returned_raw(rows):
    return plain(rows)


def rewrapped_tensors(rows):  # new tensors over the rows' memory
    return [_map(r, lambda t: torch.from_numpy(t.numpy())) for r in rows]


def as_arrays(rows):  # numpy views of the rows' memory
    return [_map(r, lambda t: t.numpy()) for r in rows]


STASH: list = []  # a worker's own (after the fork): rows kept across batches (and epochs, persistent workers)


def stashing(rows):
    """Keeps the last 3 batches' rows as given, with copies; says how many stashed values changed since."""
    STASH.append((rows, [_map(r, torch.clone) for r in rows]))
    del STASH[:-3]
    changed = 0
    for kept, copies in STASH:
        changed += sum(not _equal(r, c) for r, c in zip(kept, copies))
    return plain(rows), changed


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return all(_equal(x, y) for x, y in zip(a, b))
    return a == b


COLLATES = {
    "copied_then_collated": copied_then_collated,
    "returned_raw": returned_raw,
    "rewrapped_tensors": rewrapped_tensors,
    "as_arrays": as_arrays,
    "stashing": stashing,
}


def expected(ds, name: str, start: int, stop: int):
    rows = [ds[i] for i in range(start, stop)]
    if name == "copied_then_collated":
        return default_collate(rows)
    if name == "as_arrays":
        return [_map(r, lambda t: t.numpy()) for r in rows]
    return rows


UINT8 = {"image": [T.Resize((24, 20))], "tokens": T.Pad(6, value=-1)}  # rows view the slot itself


@pytest.mark.parametrize("name", list(COLLATES))
@pytest.mark.parametrize("transforms, as_dict", [(UINT8, True), (EVERY_KIND, True), (EVERY_KIND, False)],
                         ids=["uint8-dict", "float-dict", "float-tuple"])
@pytest.mark.parametrize("persistent", [False, True])
def test_whatever_a_collate_fn_does_with_the_rows_no_worker_crashes_and_no_batch_changes(
    every_kind, name, transforms, as_dict, persistent
):
    ds = fastload.open(every_kind, as_dict=as_dict, transforms=transforms)
    loader = TorchLoader(ds, batch_size=2, num_workers=2, collate_fn=COLLATES[name], persistent_workers=persistent)
    held = []  # every batch of three epochs, held in the main process to the end
    for _ in range(3):
        held.append(list(loader))
    for epoch in held:
        assert len(epoch) == 7
        for b, batch in enumerate(epoch):
            if name == "stashing":
                batch, changed = batch
                assert changed == 0  # nothing a worker kept changed under it
            assert_same_sample(batch, expected(ds, name, b * 2, min(13, b * 2 + 2)), strides=False)


def test_what_torch_sends_of_a_row_is_a_copy_and_the_slot_stays_where_it_is(image_shards):
    """The mechanism: pickling a row's tensor for another process (torch's ``share_memory_()``) moves that tensor's
    storage to shared memory; the slot's buffers, which the native fill writes through numpy views, stay put."""
    import io
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers torch's reductions)

    ds = fastload.open(image_shards, transforms=DETERMINISTIC, as_dict=True)
    rows = ds.__getitems__([0, 1, 2, 3])
    slots = ds.batch_items.ring.slots
    want = [ds[i] for i in range(4)]
    before = [(k, t.untyped_storage().data_ptr()) for s in slots for k, t in s.tensors.items()]
    assert len(slots) == 1 and slots[0].held()  # the rows view it
    ForkingPickler(io.BytesIO()).dump(plain(rows))
    assert rows[0]["image"].is_shared()  # the rows' own storage moved to shared memory, with their values
    assert_same_sample(plain(rows), want)
    after = [(k, t.untyped_storage().data_ptr()) for s in slots for k, t in s.tensors.items()]
    assert after == before  # the slot did not move
    assert all(s.arrays[k].ctypes.data == t.data_ptr() for s in slots for k, t in s.tensors.items() if k in s.arrays)
    assert not slots[0].held()  # the rows view their copy now: the slot is free for the next batch
    ds.__getitems__([4, 5, 6, 7])
    assert len(slots) == 1  # and is reused
    assert_same_sample(plain(rows), want)


def types_seen(rows):
    return type(rows), [type(r) for r in rows]


@dataclasses.dataclass
class TypesSeen:  # a collator object as Hugging Face's: a dataclass, so unhashable
    pad: int = 0

    def __call__(self, rows):
        return types_seen(rows)


@pytest.mark.parametrize("collate_fn", [types_seen, TypesSeen()], ids=["function", "dataclass"])
@pytest.mark.parametrize("as_dict", [True, False])
def test_a_user_collate_fn_gets_exactly_ds_i_s_types(image_shards, as_dict, collate_fn):
    ds = fastload.open(image_shards, transforms=DETERMINISTIC, as_dict=as_dict)
    for kind, row_kinds in TorchLoader(ds, batch_size=4, num_workers=2, collate_fn=collate_fn):
        assert row_kinds == [dict if as_dict else tuple] * 4  # type(row) is dict: not a subclass
        assert kind is list


def test_torch_s_default_collate_still_collates_from_the_pool(image_shards, monkeypatch):
    received = []

    class Counted(_getitems_shm._Held):  # made in this (the main) process for each pooled batch that arrives
        def __init__(self, *args):
            received.append(1)
            super().__init__(*args)

    monkeypatch.setattr(_getitems_shm, "_Held", Counted)
    ds = fastload.open(image_shards, transforms=DETERMINISTIC)
    got = list(TorchLoader(ds, batch_size=4, num_workers=2))
    assert len(got) == len(received) == 12


# -- a sample's draws: (the iterator's base seed, the sample's index) --------------------------------
def per_sample(batches, order) -> dict:
    """{sample index: its image} from batches of ``(images, labels)`` read in ``order``."""
    images = [img for b in batches for img in (b[0] if isinstance(b, (list, tuple)) and isinstance(b[0], torch.Tensor)
                                                 else [r[0] for r in b])]
    return {i: img.contiguous() for i, img in zip(order, images)}


def wrong_copy(src, out):  # a pool copy gone wrong: the worker's first-batch check leaves the pool
    out.zero_()


def test_a_sample_gets_the_same_pixels_whichever_path_batch_and_worker_it_goes_through(image_shards, monkeypatch):
    ds = fastload.open(image_shards, transforms=RANDOM)
    n = len(ds)
    seed = 7
    base = int(torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(seed)).item())

    def gen():
        return torch.Generator().manual_seed(seed)

    order = list(range(n))
    shuffled = [int(i) for i in np.random.default_rng(1).permutation(n)]
    uneven = [shuffled[s:s + 5] for s in range(0, n, 5)]
    paths = {
        "the pool (default_collate, 2 workers)": per_sample(
            TorchLoader(ds, batch_size=8, num_workers=2, generator=gen()), order),
        "plain rows (a user's collate_fn), other batches": per_sample(
            TorchLoader(ds, batch_sampler=uneven, num_workers=2, generator=gen(), collate_fn=returned_raw), shuffled),
        "the main process": per_sample(TorchLoader(ds, batch_size=3, generator=gen()), order),
        "fastload's own loader, seed = torch's base seed, epoch 0": per_sample(
            fastload.DataLoader(ds, batch_size=8, seed=base), order),
    }
    from fastload._front import getitems
    from fastload.fields import NotFastPath

    def no_batches(self, *args, **kwargs):
        raise NotFastPath("a test's")

    with monkeypatch.context() as m, warnings.catch_warnings():
        m.setattr(getitems.BatchItems, "_make", no_batches)  # before the fork: every sample as ds[i] reads it
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        paths["sample by sample (ds[i]'s reads)"] = per_sample(
            TorchLoader(fastload.open(image_shards, transforms=RANDOM), batch_size=8, num_workers=2, generator=gen()),
            order)
    monkeypatch.setattr(_getitems_shm, "_copy", wrong_copy)  # before the fork: the workers inherit it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)  # the workers' (caught there, not here)
        paths["the pool left (torch's collate)"] = per_sample(
            TorchLoader(ds, batch_size=6, num_workers=2, generator=gen()), order)
    reference = paths.pop("the pool (default_collate, 2 workers)")
    assert len(reference) == n
    flipped = sum(torch.equal(reference[i], reference[i].flip(-1)) for i in range(n))
    assert flipped < n  # real images, not a constant
    for path, images in paths.items():
        assert sorted(images) == order, path
        assert all(torch.equal(images[i], reference[i]) for i in range(n)), path
    # a new iterator draws a new base seed: other draws
    again = per_sample(TorchLoader(ds, batch_size=8, num_workers=2, generator=torch.Generator().manual_seed(8)), order)
    assert any(not torch.equal(again[i], reference[i]) for i in range(n))


class _VaryingEpochs(torch.utils.data.Sampler):
    """Epoch 0 (``epoch`` 0): one batch, so worker 1 of 2 gets none; later epochs: two batches, the second (samples
    0 and 1 again) to worker 1."""

    epoch = 0

    def __iter__(self):
        return iter([[0, 1]] if self.epoch == 0 else [[2, 3], [0, 1]])

    def __len__(self) -> int:
        return 1 if self.epoch == 0 else 2


@pytest.mark.xfail(strict=True, reason="known limit (getitems.py): a persistent worker counts only the epochs it was "
                   "handed a batch in, so one left idle in an epoch keys later epochs as earlier ones")
def test_a_persistent_worker_idle_for_an_epoch_still_draws_anew_in_the_next(image_shards):
    ds = fastload.open(image_shards, transforms=RANDOM)
    sampler = _VaryingEpochs()
    loader = TorchLoader(ds, batch_sampler=sampler, num_workers=2, persistent_workers=True,
                         generator=torch.Generator().manual_seed(5))
    first = [b[0] for b in loader]
    sampler.epoch = 1
    second = [b[0] for b in loader]
    assert not torch.equal(first[0], second[1])  # samples 0 and 1: epoch 1 gave them epoch 0's crops


@pytest.mark.parametrize("prefetch", [1, 5])
def test_the_pool_s_batches_held_across_epochs_of_persistent_workers_keep_their_values(every_kind, prefetch):
    """torch's default_collate (the pool), persistent workers, more batches in flight than the pool holds
    (prefetch_factor 5 x 2 workers): every batch of three epochs held to the end keeps default_collate's values."""
    ds = fastload.open(every_kind, as_dict=True, transforms=EVERY_KIND)
    want = [default_collate([ds[i] for i in range(s, min(13, s + 2))]) for s in range(0, 13, 2)]
    loader = TorchLoader(ds, batch_size=2, num_workers=2, persistent_workers=True, prefetch_factor=prefetch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastload.FastPathWarning)
        held = [list(loader) for _ in range(3)]
    for epoch in held:
        for got, expect in zip(epoch, want, strict=True):
            assert_same_sample(got, expect)


def test_a_subset_of_the_dataset_still_collates_from_the_pool_and_keys_its_draws(image_shards, monkeypatch):
    """torch's Subset calls the dataset's __getitems__ from its own: the fetcher is found above both."""
    received = []

    class Counted(_getitems_shm._Held):
        def __init__(self, *args):
            received.append(1)
            super().__init__(*args)

    monkeypatch.setattr(_getitems_shm, "_Held", Counted)
    ds = fastload.open(image_shards, transforms=RANDOM)
    picked = list(range(0, len(ds), 2))
    sub = torch.utils.data.Subset(ds, picked)
    got = list(TorchLoader(sub, batch_size=4, num_workers=2, generator=torch.Generator().manual_seed(3)))
    assert len(received) == len(got) == 6
    whole = per_sample(TorchLoader(ds, batch_size=4, num_workers=2, generator=torch.Generator().manual_seed(3)),
                       list(range(len(ds))))
    images = [img for b in got for img in b[0]]
    assert all(torch.equal(img, whole[i]) for img, i in zip(images, picked, strict=True))


def test_a_dataset_read_sample_by_sample_keys_its_draws_too(image_shards):
    """No fixed output size: ``__getitems__`` reads each sample as ds[i] does (with one warning), and under torch's
    loader each sample's flip is still drawn from (the iterator's seed, its index), not from a worker's stream."""
    ds = fastload.open(image_shards, transforms={"image": [T.RandomHorizontalFlip()]})
    n = len(ds)
    shuffled = [int(i) for i in np.random.default_rng(2).permutation(n)]

    def read(seed, **kw):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fastload.FastPathWarning)  # sample by sample: said once
            loader = TorchLoader(ds, generator=torch.Generator().manual_seed(seed), collate_fn=returned_raw, **kw)
            return per_sample(loader, shuffled if "batch_sampler" in kw else list(range(n)))

    a = read(5, batch_size=4, num_workers=2)
    b = read(5, batch_sampler=[shuffled[s:s + 7] for s in range(0, n, 7)], num_workers=0)
    c = read(6, batch_size=4, num_workers=2)
    unflipped = fastload.open(image_shards)
    originals = [unflipped[i][0] for i in range(n)]
    for x in (a, c):
        assert all(torch.equal(x[i], originals[i]) or torch.equal(x[i], originals[i].flip(-1)) for i in range(n))
        assert 0 < sum(torch.equal(x[i], originals[i].flip(-1)) for i in range(n)) < n  # some flipped, some not
    assert all(torch.equal(a[i], b[i]) for i in range(n))
    assert any(not torch.equal(a[i], c[i]) for i in range(n))


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_workers_started_by_spawn_or_forkserver_collate_from_the_pool_with_the_same_draws(
    image_shards, monkeypatch, context
):
    received = []

    class Counted(_getitems_shm._Held):  # in this process: a spawned worker's module is its own
        def __init__(self, *args):
            received.append(1)
            super().__init__(*args)

    monkeypatch.setattr(_getitems_shm, "_Held", Counted)
    ds = fastload.open(image_shards, transforms=RANDOM)
    order = list(range(len(ds)))

    def read(**kw):
        return per_sample(TorchLoader(ds, batch_size=8, num_workers=1, generator=torch.Generator().manual_seed(4),
                                      **kw), order)

    forked = read()
    received.clear()
    started = read(multiprocessing_context=context)
    assert len(received) == 6  # every batch through the pool
    assert all(torch.equal(forked[i], started[i]) for i in order)
