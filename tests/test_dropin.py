"""Drop-in parity with torch's DataLoader (fastload/_front/dropin.py, the loader's pickling and typing): no silent
fallback, pickle and deepcopy on both paths, DataLoader[T], worker_init_fn, pin_memory, memory format."""

from __future__ import annotations

import copy
import multiprocessing
import pickle
import typing
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

import fastload
from fastload import transforms as T

from conftest import packed_image_folder


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return packed_image_folder(tmp_path_factory.mktemp("dropin"), classes=2, per_class=7)


def train(path, **kw):
    return fastload.open(path, transforms={"image": [T.RandomResizedCrop(16), T.RandomHorizontalFlip()]}, **kw)


def fast_path_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, fastload.FastPathWarning)]


# -- never degrade silently ---------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, reason", [
    (dict(collate_fn=lambda b: b), "custom collate_fn"),
    (dict(batch_size=None), "batch_size=None"),
    (dict(batch_size=1, batch_sampler=[[0, 1], [2]]), "custom batch_sampler"),
])
def test_a_refused_fast_path_warns_once_with_the_reason(images, kwargs, reason):
    ds = train(images)
    kwargs = {"batch_size": 4, **kwargs}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        dl = fastload.DataLoader(ds, **kwargs)
        for _ in range(2):
            for _ in dl:
                pass
    assert not dl.fast_path and reason in dl.fast_path_reason
    got = fast_path_warnings(record)
    assert len(got) == 1 and reason in got[0] and "FastPathWarning" in got[0]
    assert record[0].filename == __file__  # points at the line that built the loader


def test_an_image_field_without_a_fixed_size_warns_and_names_the_fix(images):
    with pytest.warns(fastload.FastPathWarning, match="no transform giving a fixed output size.*RandomResizedCrop"):
        fastload.DataLoader(fastload.open(images), batch_size=1)


def test_no_warning_on_the_fast_path_nor_for_other_datasets_nor_decode_false(images):
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastload.FastPathWarning)
        assert fastload.DataLoader(train(images), batch_size=4).fast_path
        assert not fastload.DataLoader(TensorDataset(torch.arange(4)), batch_size=2).fast_path
        assert not fastload.DataLoader(fastload.open(images, decode=False), batch_size=1).fast_path


def test_the_warning_can_be_silenced(images):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=fastload.FastPathWarning)
        fastload.DataLoader(train(images), batch_size=4, collate_fn=lambda b: b)
    assert not fast_path_warnings(record)


# -- pickle and deepcopy ------------------------------------------------------------------------------
def batches(dl):
    return [(b[0].clone(), b[1].clone()) for b in dl]


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))


@pytest.mark.parametrize("copier", [lambda dl: pickle.loads(pickle.dumps(dl)), copy.deepcopy],
                         ids=["pickle", "deepcopy"])
@pytest.mark.parametrize("persistent", [False, True])
def test_fast_path_pickles_and_copies_after_use(images, copier, persistent):
    dl = fastload.DataLoader(train(images), batch_size=4, shuffle=True, num_workers=2, seed=5,
                             persistent_workers=persistent)
    first = batches(dl)  # a thread pool, slots and (persistent) a kept pool now exist
    it = iter(dl)
    next(it)
    clone = copier(dl)
    assert clone.fast_path and clone.state_dict() == dl.state_dict()
    assert same(batches(clone), batches(dl))  # epoch 1 continues identically in both (from the start)
    dl.set_epoch(0)
    assert same(batches(dl), first)


@pytest.mark.parametrize("copier", [lambda dl: pickle.loads(pickle.dumps(dl)), copy.deepcopy],
                         ids=["pickle", "deepcopy"])
def test_generic_path_pickles_and_copies_with_live_persistent_workers(copier):
    ds = TensorDataset(torch.arange(20))
    dl = fastload.DataLoader(ds, batch_size=6, num_workers=2, persistent_workers=True)
    want = [b[0].tolist() for b in dl]  # persistent worker processes are alive now
    clone = copier(dl)
    assert [b[0].tolist() for b in clone] == want
    assert [b[0].tolist() for b in dl] == want


def _iterate_in_child(dl, out):
    out.put([b[1].tolist() for b in dl])


def test_a_spawned_process_gets_a_working_loader(images):
    dl = fastload.DataLoader(train(images), batch_size=4, shuffle=True, num_workers=1, seed=3)
    want = [b[1].tolist() for b in dl]
    dl.set_epoch(0)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_iterate_in_child, args=(dl, out))
    p.start()
    got = out.get(timeout=120)
    p.join(timeout=30)
    assert p.exitcode == 0 and got == want


# -- typing ---------------------------------------------------------------------------------------------
def test_dataloader_is_generic_like_torchs():
    alias = fastload.DataLoader[int]
    assert typing.get_origin(alias) is fastload.DataLoader and typing.get_args(alias) == (int,)

    def f(dl: fastload.DataLoader[tuple[torch.Tensor, torch.Tensor]]) -> None:  # annotations evaluate
        pass

    assert typing.get_type_hints(f)["dl"] == fastload.DataLoader[tuple[torch.Tensor, torch.Tensor]]


# -- worker_init_fn, pin_memory -------------------------------------------------------------------------
def _init(worker_id):
    pass


def test_worker_init_fn_on_the_fast_path_is_refused_with_the_fix(images):
    with pytest.raises(ValueError, match="worker_init_fn=_init cannot run on fastload's fast path.*Drop worker_init"):
        fastload.DataLoader(train(images), batch_size=4, worker_init_fn=_init)
    dl = fastload.DataLoader(train(images), batch_size=4)
    dl.worker_init_fn = _init  # set after construction, as frameworks do
    with pytest.raises(ValueError, match="cannot run on fastload's fast path"):
        iter(dl)
    # the generic path calls it in each worker, like torch
    assert fastload.DataLoader(TensorDataset(torch.arange(4)), num_workers=1, worker_init_fn=_init) is not None


def test_lightnings_seeding_worker_init_fn_is_accepted(images):
    import functools

    from lightning.fabric.utilities.seed import pl_worker_init_function

    dl = fastload.DataLoader(train(images), batch_size=4, seed=1)
    want = batches(dl)
    dl.worker_init_fn = functools.partial(pl_worker_init_function, rank=0)
    dl.set_epoch(0)
    assert same(batches(dl), want)


@pytest.mark.skipif(torch.accelerator.is_available(), reason="the warning is for machines without an accelerator")
def test_pin_memory_without_an_accelerator_warns_like_torch(images):
    torch_loader = torch.utils.data.DataLoader(TensorDataset(torch.arange(4)), pin_memory=True)
    with pytest.warns(UserWarning) as theirs:
        iter(torch_loader)
    dl = fastload.DataLoader(train(images), batch_size=4, pin_memory=True)
    assert dl.fast_path
    with pytest.warns(UserWarning) as ours:
        iter(dl)
    assert [str(w.message) for w in ours] == [str(w.message) for w in theirs]
    assert "no accelerator is found" in str(ours[0].message)


# -- memory format --------------------------------------------------------------------------------------
def test_memory_format_is_a_declared_choice(images):
    ds = train(images)
    default = next(iter(fastload.DataLoader(ds, batch_size=4, seed=0)))[0]
    assert default.is_contiguous(memory_format=torch.channels_last) and not default.is_contiguous()
    with pytest.raises(RuntimeError):
        default.view(4, -1)  # torch's own error; the batch says how to avoid it (see the docstring)
    dl = fastload.DataLoader(ds, batch_size=4, seed=0, memory_format=torch.contiguous_format, num_workers=1)
    flat = next(iter(dl))[0]
    assert flat.is_contiguous() and torch.equal(flat, default)
    assert flat.view(4, -1).shape == (4, 3 * 16 * 16)
    as_dict = fastload.open(images, transforms={"image": [T.Resize((8, 8))]}, as_dict=True)
    b = next(iter(fastload.DataLoader(as_dict, batch_size=2, memory_format=torch.contiguous_format)))
    assert b["image"].is_contiguous()
    with pytest.raises(ValueError, match="memory_format=torch.preserve_format should be torch.channels_last"):
        fastload.DataLoader(ds, batch_size=4, memory_format=torch.preserve_format)


def test_numpy_seed_untouched_by_the_fast_path(images):
    np.random.seed(0)
    want = np.random.rand()
    np.random.seed(0)
    list(fastload.DataLoader(train(images), batch_size=4, num_workers=2))
    assert np.random.rand() == want


def test_any_object_as_a_dataset_as_torch_takes_it():
    """Lightning's own test_auto_add_worker_init_fn builds DataLoader(unittest.mock.Mock()): every attribute of a
    Mock exists, so asking it for a fastload dataset's batch_transforms found "one" and refused the loader
    (found by scripts/upstream_suites.sh). torch's loader takes any object; so does fastload's generic path."""
    from unittest.mock import Mock

    loader = fastload.DataLoader(Mock())
    assert loader.worker_init_fn is None and loader.fast_path_reason
