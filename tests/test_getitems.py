"""fastload/_front/getitems.py: ``Dataset.__getitems__`` decodes one batch natively for torch's own DataLoader (and
anything built on its fetchers). Items equal ``[ds[i] for i in idx]``; torch's loader at 0 and 2 workers gives
the fast path's batches; randomness comes from torch's generators (workers, batches and epochs differ, a
seeded run repeats); slots are never overwritten while an item is alive; forked workers make their own state;
errors are ds[i]'s."""

from __future__ import annotations

import gc
import os
import pickle
import sys
import threading
import weakref
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader as TorchLoader

import fastload
from fastload import transforms as T
from fastload._fill.batcher import Batcher
from fastload._front import getitems

from conftest import jpeg_bytes
from forking import in_child
from getitems_common import DETERMINISTIC, EVERY_KIND, RANDOM, assert_same_sample, expected_batches

@pytest.mark.parametrize("as_dict", [False, True])
@pytest.mark.parametrize("tokens", [T.Pad(6, value=-1), T.Bucket([2, 4, 8], value=-1)])
def test_items_are_ds_i_exactly(every_kind_each_format, as_dict, tokens):
    ds = fastload.open(every_kind_each_format, as_dict=as_dict, transforms={**EVERY_KIND, "tokens": tokens})
    for idx in ([0, 5, 12, 3], [7], list(range(13)), [-1, 2, -13]):
        assert_same_sample(ds.__getitems__(idx), [ds[i] for i in idx])
    assert ds.__getitems__([]) == []
    assert isinstance(ds.batch_items.batcher, Batcher)  # the batch path, not ds[i] in a loop


def test_uint8_images_and_numpy_or_tensor_indices(packed_images):
    ds = fastload.open(packed_images, transforms=DETERMINISTIC)
    want = [ds[i] for i in (3, 40, 7)]
    for idx in (
        [3, 40, 7],
        np.array([3, 40, 7]),
        torch.tensor([3, 40, 7]),
        (np.int64(3), 40, 7),
        (i for i in [3, 40, 7]),
    ):
        assert_same_sample(ds.__getitems__(idx), want)
    with pytest.raises(IndexError, match="sample index 99 out of range"):  # read once, then ds[i]'s error
        ds.__getitems__(i for i in [3, 99])


def test_one_native_call_per_batch(packed_images, monkeypatch):
    ds = fastload.open(packed_images, transforms=DETERMINISTIC)
    fills = []
    real = Batcher.fill
    monkeypatch.setattr(Batcher, "fill", lambda self, *a: fills.append(len(a[1])) or real(self, *a))
    monkeypatch.setattr(type(ds), "__getitem__", lambda self, i: pytest.fail("decoded sample by sample"))
    items = ds.__getitems__(list(range(10)))
    assert fills == [10] and len(items) == 10


def test_a_batch_held_is_never_overwritten_and_a_dropped_one_is_reused(packed_images):
    ds = fastload.open(packed_images, transforms=DETERMINISTIC)
    first = ds.__getitems__([0, 1, 2, 3])
    kept = [x[0].clone() for x in first]
    second = ds.__getitems__([10, 11, 12, 13])  # `first` is alive: another slot
    assert all(torch.equal(x[0], k) for x, k in zip(first, kept))
    assert len(ds.batch_items.ring) == 2
    del first, second
    for start in range(0, 40, 4):
        torch.utils.data.default_collate(ds.__getitems__(list(range(start, start + 4))))  # what torch does
    assert len(ds.batch_items.ring) == 2
    bigger = ds.__getitems__(list(range(9)))  # a bigger batch than the slots hold: new slots, right values
    assert_same_sample(bigger, [ds[i] for i in range(9)])


def test_bad_indices_and_samples_raise_what_ds_i_raises(packed_images, tmp_path):
    ds = fastload.open(packed_images, transforms=DETERMINISTIC)
    with pytest.raises(IndexError, match="sample index 48 out of range for a dataset of 48 samples"):
        ds.__getitems__([1, 48])
    with pytest.raises(TypeError, match="dataset indices must be integers, got str"):
        ds.__getitems__([1, "2"])
    with pytest.raises(TypeError, match="dataset indices must be integers, got bool"):
        ds.__getitems__([True])
    root = tmp_path / "src" / "c"
    root.mkdir(parents=True)
    for i in range(6):
        data = bytearray(jpeg_bytes(48, 64, seed=i))
        if i == 2:
            data[-150:-50] = bytes(100)  # inside the scan: the header check at pack time lets it in
        (root / f"{i}.jpg").write_bytes(bytes(data))
    fastload.pack(tmp_path / "src", tmp_path / "ds", workers=0, image_mode="passthrough", check="header")
    bad = fastload.open(tmp_path / "ds", transforms=DETERMINISTIC)
    with pytest.raises(fastload.DecodeError) as one:
        bad[2]
    with pytest.raises(fastload.DecodeError) as batch:
        bad.__getitems__([1, 2, 3])
    assert str(batch.value) == str(one.value) and "sample 2" in str(one.value)
    assert "on_error" not in str(batch.value)  # the loader's option means nothing to a dataset


def test_no_fixed_size_falls_back_to_ds_i_with_a_warning(packed_images):
    ds = fastload.open(packed_images)  # full-size images: no slot can hold them
    with pytest.warns(fastload.FastPathWarning, match=r"__getitems__ decodes .* sample by sample.*fixed output size"):
        items = ds.__getitems__([0, 1])
    assert_same_sample(items, [ds[0], ds[1]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per dataset and process
        ds.__getitems__([2])
        raw = fastload.open(packed_images, decode=False)  # nothing to decode: no warning
        assert raw.__getitems__([0, 5]) == [raw[0], raw[5]]


def torch_batches(ds, **kw) -> list:
    return list(TorchLoader(ds, batch_size=8, **kw))


@pytest.mark.parametrize("workers", [0, 2])
def test_torch_loader_gives_the_fast_path_batches(packed_images, workers):
    ds = fastload.open(packed_images, transforms=DETERMINISTIC)
    fast = list(fastload.DataLoader(ds, batch_size=8))
    theirs = torch_batches(ds, num_workers=workers)
    assert len(theirs) == len(fast) == 6
    for (a_img, a_lab), (b_img, b_lab) in zip(theirs, fast):
        assert a_img.shape == b_img.shape == (8, 3, 20, 30) and a_img.dtype == torch.uint8
        assert torch.equal(a_img, b_img) and a_lab.tolist() == b_lab.tolist()


def test_a_sample_s_draws_depend_on_the_iterator_s_seed_and_its_index_only(packed_images):
    ds = fastload.open(packed_images, transforms=RANDOM)
    once = [[0, 5], [1, 6], [2, 7], [3, 4]]  # each sample once: batches 0, 2 go to worker 0 and 1, 3 to worker 1

    def run(workers=2, batches=once):
        loader = TorchLoader(ds, batch_sampler=batches, num_workers=workers)
        return [torch.cat([b[0] for b in loader]) for _ in range(2)]  # two epochs

    torch.manual_seed(0)
    first = run()
    torch.manual_seed(0)
    again = run()
    torch.manual_seed(1)
    other = run()
    torch.manual_seed(0)
    in_main = run(workers=0)
    assert not torch.equal(first[0], first[1])  # a new iterator (epoch), a new base seed: new draws
    assert all(torch.equal(x, y) for x, y in zip(first, again))  # a seeded run repeats
    assert all(torch.equal(x, y) for x, y in zip(first, in_main))  # at any num_workers
    assert not torch.equal(first[0], other[0])
    # a sample read again in one epoch draws anew (repeated augmentation): the one index batch four times, read
    # by one process; a first read keeps the pixels of a sample read once
    torch.manual_seed(0)
    same = run(workers=0, batches=[list(range(8))] * 4)
    order = [i for b in once for i in b]
    for epoch, ref in zip(same, first):
        reads = epoch.view(4, 8, *epoch.shape[1:])
        assert torch.equal(reads[0][order], ref)
        assert all(not torch.equal(reads[a][k], reads[b][k]) for a in range(4) for b in range(a) for k in range(8))
    torch.manual_seed(0)
    loader = TorchLoader(ds, batch_sampler=once, num_workers=2, persistent_workers=True)
    persistent = [
        torch.cat([b[0] for b in loader]) for _ in range(3)
    ]  # the workers keep their seed: they count the epochs
    assert torch.equal(persistent[0], first[0])  # its first epoch: any other's
    assert all(not torch.equal(persistent[e], persistent[f]) for e, f in ((0, 1), (1, 2), (0, 2)))
    # called outside torch's loader: one seed per call from torch's generator, as ds[i] draws
    torch.manual_seed(0)
    a = ds.__getitems__(list(range(8)))
    b = ds.__getitems__(list(range(8)))
    torch.manual_seed(0)
    c = ds.__getitems__(list(range(8)))
    assert any(not torch.equal(x[0], y[0]) for x, y in zip(a, b))
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a, c))


class _Stream(torch.utils.data.IterableDataset):
    """A user's IterableDataset over a fastload dataset, reading the same batch of indices twice per pass through
    ``__getitems__`` in a worker (not through torch's map-style fetcher)."""

    def __init__(self, ds):
        self.ds = ds

    def __iter__(self):
        for _ in range(2):
            yield from self.ds.__getitems__([0, 1, 2, 3])


def test_called_in_a_worker_other_than_by_torch_s_fetcher_each_call_draws_anew(image_shards):
    """In a worker, a call not made by torch's map-style fetcher took the worker's base seed with epoch 0 and no
    occurrence: every call on the same indices gave the same crops, and a persistent worker gave them again every
    epoch. Like any call outside torch's fetcher it draws one seed of torch's generator (the worker's, seeded by
    torch) per call."""
    ds = fastload.open(image_shards, transforms=RANDOM)
    loader = TorchLoader(_Stream(ds), batch_size=4, num_workers=1, persistent_workers=True,
                         generator=torch.Generator().manual_seed(0))
    epochs = [[b[0] for b in loader] for _ in range(2)]
    assert len(epochs[0]) == 2
    assert not torch.equal(epochs[0][0], epochs[0][1]), "two calls on the same indices gave the same crops"
    assert not torch.equal(epochs[0][0], epochs[1][0]), "a persistent worker's next epoch gave the same crops"


def test_native_threads_follow_torch_s_budget(packed_images):
    ds = fastload.open(packed_images, transforms=DETERMINISTIC)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        ds.__getitems__([0])
        assert ds.batch_items.batcher.num_threads == 3
        torch.set_num_threads(1)
        ds2 = fastload.open(packed_images, transforms=DETERMINISTIC)
        ds2.__getitems__([0])
        assert ds2.batch_items.batcher.num_threads == 0  # one thread: the caller's own, no hand-off
    finally:
        torch.set_num_threads(before)


def test_forked_workers_make_their_own_state(packed_images):
    ds = fastload.open(packed_images, transforms=DETERMINISTIC)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ds.__getitems__([0, 1])  # the parent's pool (2 threads), slots and lock now exist
    finally:
        torch.set_num_threads(before)
    parent = ds.batch_items

    def collate(items):  # runs in the worker, on its copy of the dataset
        return torch.utils.data.default_collate(items), ds.batch_items.pid, ds.batch_items.batcher.num_threads

    with parent.lock:  # another thread of the parent is mid-batch when the workers fork
        batches = list(
            TorchLoader(ds, batch_size=8, num_workers=2, collate_fn=collate, multiprocessing_context="fork", timeout=20)
        )
    pids = {pid for _, pid, _ in batches}
    assert len(pids) == 2 and parent.pid not in pids
    assert {threads for _, _, threads in batches} == {0}  # torch gives each worker one thread
    assert all(
        torch.equal(b[0][0], torch.stack([ds[i][0] for i in range(8 * k, 8 * k + 8)])) for k, b in enumerate(batches)
    )


def test_a_forked_child_never_destroys_its_parent_s_pool(packed_images):
    import fastload._front.getitems as getitems

    ds = fastload.open(packed_images, transforms=DETERMINISTIC)
    ds.__getitems__([0, 1])
    parent = ds.batch_items.batcher

    def child():
        ds.__getitems__([2, 3])  # replaces the parent's state: the parent's batcher must stay alive
        assert ds.batch_items.pid == os.getpid() and getitems._INHERITED == [parent]
        ds.batch_items = None  # and a state of this process goes as usual
        assert getitems._INHERITED == [parent]

    assert in_child(child) == 0
    assert getitems._INHERITED == []


def test_no_cycle_keeps_a_dataset_s_slots_alive(packed_images):
    ds = fastload.open(packed_images, transforms=DETERMINISTIC)
    ds.__getitems__([0, 1])
    slots = weakref.ref(ds.batch_items.ring)
    gc.disable()
    try:
        del ds
        assert slots() is None  # freed at once, not by a garbage collection (which may run in a forked worker)
    finally:
        gc.enable()


def test_pickling_leaves_the_process_state_behind(packed_images):
    ds = fastload.open(packed_images, transforms=DETERMINISTIC)
    ds.__getitems__([0, 1])
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.batch_items is None
    assert_same_sample(clone.__getitems__([4, 5]), ds.__getitems__([4, 5]))


def test_threads_calling_at_once_each_get_their_own_batch(packed_images):
    ds = fastload.open(packed_images, transforms=DETERMINISTIC)
    want = {k: [ds[i] for i in range(k, k + 6)] for k in range(0, 40, 6)}
    got: dict = {}

    def call(k):
        for _ in range(5):
            got[k] = [
                tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in s)
                for s in ds.__getitems__(list(range(k, k + 6)))
            ]

    threads = [threading.Thread(target=call, args=(k,)) for k in want]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in want:
        assert_same_sample(got[k], want[k])


def test_accelerate_s_rebuilt_loader_decodes_in_batches(packed_images, monkeypatch):
    accelerate = pytest.importorskip("accelerate")
    import fastload._front.getitems as getitems

    calls = []
    real = getitems.get_items
    monkeypatch.setattr(getitems, "get_items", lambda ds, idx: calls.append(len(idx)) or real(ds, idx))
    from accelerate.state import AcceleratorState

    ds = fastload.open(packed_images, transforms=DETERMINISTIC)
    try:
        accelerator = accelerate.Accelerator(cpu=True)
        loader = accelerator.prepare(TorchLoader(ds, batch_size=8))
        assert type(loader).__name__ == "DataLoaderShard"
        batches = list(loader)
        assert calls == [8] * 6 and len(batches) == 6
        # a fastload.DataLoader rebuilt by plain prepare: the warning says what is lost, and decoding is not
        with pytest.warns(fastload.FastPathWarning) as record:
            rebuilt = accelerator.prepare(fastload.DataLoader(ds, batch_size=12, seed=1))
        said = str(record[0].message)
        assert "Decoding stays native" in said and all(w in said for w in ("slot ring", "device prefetch", "resume"))
        assert "per-sample" not in said
        calls.clear()
        assert len(list(rebuilt)) == 4 and calls == [12] * 4
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def test_the_loader_says_once_what_its_generic_path_costs(packed_images, capfd):
    """fastload.DataLoader off the fast path says what decoding costs there: with a custom collate_fn each batch
    is still one native call (__getitems__); a dataset with no fixed output size decodes sample by sample, said
    once by the loader and not again by __getitems__ here or in each worker."""
    ds = fastload.open(packed_images, transforms=DETERMINISTIC)
    with pytest.warns(fastload.FastPathWarning, match=r"collate_fn.*one native call .*__getitems__") as seen:
        loader = fastload.DataLoader(ds, batch_size=4, collate_fn=lambda items: len(items))
    assert len(seen) == 1 and "much slower" not in str(seen[0].message)
    assert list(loader)[:2] == [4, 4]

    ds = fastload.open(packed_images)  # full-size images
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loader = fastload.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=lambda items: len(items))
        assert sum(list(loader)) == len(ds)
        ds.__getitems__([0, 1])
    said = [str(w.message) for w in seen if issubclass(w.category, fastload.FastPathWarning)]
    assert len(said) == 1 and "per-sample decoding" in said[0], said
    assert "sample by sample" not in capfd.readouterr().err  # nor in the workers


def _say_warnings_on_stderr(worker_id):
    """A worker's warnings, each printed (pytest records the parent's where the child cannot hand them back)."""
    warnings.simplefilter("always")
    warnings.showwarning = lambda message, category, *a, **k: print(
        f"WARNED {category.__name__}: {message}", file=sys.stderr, flush=True
    )


def batches_and_warnings(ds) -> list[str]:
    """The FastPathWarnings torch's loader (0 workers, batches of 8) over ``ds`` gave, once its batches were
    checked to be ``default_collate`` of ``ds[i]``'s rows."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = torch_batches(ds)
    for a, b in zip(got, expected_batches(ds, 8), strict=True):
        assert_same_sample(a, b)
    return [str(w.message) for w in seen if issubclass(w.category, fastload.FastPathWarning)]


def test_without_torch_s_fetcher_it_says_why_once_and_its_batches_stay_right(packed_images, monkeypatch):
    """torch's private fetcher gone (or changed): __getitems__ says so once, with the reason, and its batches are
    still ds[i]'s, under torch's loader as called directly."""
    fetch = torch.utils.data._utils.fetch
    with monkeypatch.context() as m:
        m.delattr(fetch, "_MapDatasetFetcher")
        code, why = getitems._fetch_code()
    assert code is None and "has no torch.utils.data._utils.fetch._MapDatasetFetcher" in why
    with monkeypatch.context() as m:
        m.setattr(fetch._MapDatasetFetcher, "fetch", lambda self, index: [self.dataset[i] for i in index])
        assert "does not call dataset.__getitems__ itself" in getitems._fetch_code()[1]

    monkeypatch.setattr(getitems, "_FETCH_CODE", None)
    monkeypatch.setattr(getitems, "_FETCH_PROBLEM", why)
    monkeypatch.setattr(getitems, "_SAID", set())
    ds = fastload.open(packed_images, transforms=DETERMINISTIC)
    said = batches_and_warnings(ds)
    assert len(said) == 1 and why in said[0] and "cannot find the torch DataLoader" in said[0], said
    assert_same_sample(ds.__getitems__([3, 40, 7]), [ds[3], ds[40], ds[7]])


def test_a_worker_that_finds_no_fetcher_frame_says_why_once_and_its_batches_stay_right(packed_images, monkeypatch,
                                                                                      capfd):
    """torch's fetcher no longer among the frames above __getitems__ (its internals changed): each worker says so
    once, and the batches are still the fast path's."""
    monkeypatch.setattr(getitems, "_FETCH_CODE", (lambda: None).__code__)  # what torch's fetch no longer is
    monkeypatch.setattr(getitems, "_SAID", set())
    ds = fastload.open(packed_images, transforms=DETERMINISTIC)
    fast = list(fastload.DataLoader(ds, batch_size=8))
    got = torch_batches(ds, num_workers=2, worker_init_fn=_say_warnings_on_stderr, multiprocessing_context="fork")
    assert len(got) == len(fast) == 6
    for (a_img, a_lab), (b_img, b_lab) in zip(got, fast):
        assert torch.equal(a_img, b_img) and a_lab.tolist() == b_lab.tolist()
    said = [line for line in capfd.readouterr().err.splitlines() if line.startswith("WARNED FastPathWarning")]
    assert len(said) == 2, said  # once in each worker, not at each of its 3 batches
    assert all("no frame of torch's _MapDatasetFetcher.fetch within 6 frames" in line for line in said), said


def test_without_torch_s_iterator_class_the_main_process_says_why_once(packed_images, monkeypatch):
    """No ``_BaseDataLoaderIter`` to read the iterator's seed from (num_workers=0): said once, batches still right."""
    monkeypatch.setattr(getitems, "_ITERATOR", None)
    monkeypatch.setattr(getitems, "_SAID", set())
    said = batches_and_warnings(fastload.open(packed_images, transforms=DETERMINISTIC))
    assert len(said) == 1 and "has no torch.utils.data.dataloader._BaseDataLoaderIter" in said[0], said


def test_the_fetcher_found_through_a_wrapper_then_directly_keys_the_same_draws(packed_images):
    """The frame depth cached from a call through ``Subset`` (one frame deeper) is checked, not trusted: the next
    loader, straight over the dataset, still finds its fetcher and iterator seed."""
    ds = fastload.open(packed_images, transforms=RANDOM)
    subset = torch.utils.data.Subset(ds, list(range(len(ds))))
    seeded = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastload.FastPathWarning)  # nothing degraded
        through_subset = torch_batches(subset, generator=seeded())
        assert ds.batch_items.depth == 2  # Subset.__getitems__ between torch's fetch and ds.__getitems__
        direct = torch_batches(ds, generator=seeded())
    assert ds.batch_items.depth == 1
    fresh = torch_batches(fastload.open(packed_images, transforms=RANDOM), generator=seeded())
    for a, b, c in zip(through_subset, direct, fresh, strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(b[0], c[0]) and a[1].tolist() == c[1].tolist()
