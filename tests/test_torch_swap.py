"""fastload.DataLoader where torch's is expected (issue 18's causes A-E and G): swapped in for
torch.utils.data.DataLoader everywhere (a sitecustomize), subclassed the ways frameworks do, and its
iterators seen as torch's. Each test is the issue's reproduction, on the generic path unless it says."""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.data import BatchSampler, IterableDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

import fastload
from fastload import transforms as T

from conftest import make_image_folder

ROOT = Path(__file__).resolve().parent.parent
TORCH_LOADER = torch.utils.data.DataLoader


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return i * i


class Stream(IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        k, n = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(k, 400, n))


def values(loader) -> list[int]:
    return [int(v) for batch in loader for v in batch]


# -- A: torch.utils.data.DataLoader is fastload's class ------------------------------------------------
@pytest.fixture
def swapped(monkeypatch):
    monkeypatch.setattr(torch.utils.data, "DataLoader", fastload.DataLoader)
    monkeypatch.setattr(torch.utils.data.dataloader, "DataLoader", fastload.DataLoader)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_swapped_in_process(swapped, num_workers):
    dl = torch.utils.data.DataLoader(Squares(), batch_size=3, num_workers=num_workers, shuffle=True)
    assert type(dl) is fastload.DataLoader and len(dl) == 4
    assert sorted(values(dl)) == [i * i for i in range(10)]
    it = iter(dl)
    next(it)
    state = dl.state_dict()
    assert state["batches_done"] == 1
    del it
    again = pickle.loads(pickle.dumps(dl))
    assert sorted(values(again)) == [i * i for i in range(10)]
    fresh = torch.utils.data.DataLoader(Squares(), batch_size=3, num_workers=num_workers, shuffle=True)
    fresh.load_state_dict(state)
    assert len(values(fresh)) == 7  # the 3 batches after the first


SITE = """
import torch.utils.data, torch.utils.data.dataloader
import fastload
torch.utils.data.DataLoader = fastload.DataLoader
torch.utils.data.dataloader.DataLoader = fastload.DataLoader
"""

SCRIPT = """
import multiprocessing, pickle, sys
import torch
from torch.utils.data import DataLoader
import fastload
from test_torch_swap import Squares, values


def child(q):  # a spawned process runs the sitecustomize again: the swap is in place there too
    dl = torch.utils.data.DataLoader(Squares(), batch_size=4, num_workers=2)
    q.put((type(dl).__module__, values(dl), len(dl)))


if __name__ == "__main__":
    assert DataLoader is fastload.DataLoader
    for nw in (0, 2):
        dl = DataLoader(Squares(), batch_size=4, num_workers=nw)
        assert values(dl) == [i * i for i in range(10)] and len(dl) == 3, nw
        assert dl.state_dict()["epoch"] == 1
        assert values(pickle.loads(pickle.dumps(dl))) == [i * i for i in range(10)]
    spawned = DataLoader(Squares(), batch_size=4, num_workers=2, multiprocessing_context="spawn")
    assert values(spawned) == [i * i for i in range(10)]
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    got = q.get(timeout=120)
    p.join()
    assert got == ("fastload._front.loader", [i * i for i in range(10)], 3), got
    print("ok")
"""


@pytest.mark.timeout(300)
def test_swapped_by_sitecustomize(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SITE)
    (tmp_path / "run.py").write_text(textwrap.dedent(SCRIPT))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT), str(ROOT / "tests")]))
    proc = subprocess.run([sys.executable, str(tmp_path / "run.py")], capture_output=True, text=True, timeout=280,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout[-2000:] + proc.stderr[-4000:]


# -- B: a BatchSampler subclass without .sampler (accelerate's BatchSamplerShard, SkipBatchSampler) -------
class Pairs(BatchSampler):
    def __init__(self):  # sets nothing, not even batch_size
        pass

    def __iter__(self):
        return iter([[0, 1], [2, 3]])

    def __len__(self):
        return 2


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batch_sampler_without_sampler(num_workers):
    ours = fastload.DataLoader(Squares(), batch_sampler=Pairs(), num_workers=num_workers)
    state = ours.state_dict()  # accelerate asks for it at once
    assert state["batch_sampler"] == "Pairs"
    theirs = TORCH_LOADER(Squares(), batch_sampler=Pairs())
    assert [b.tolist() for b in ours] == [b.tolist() for b in theirs] == [[0, 1], [4, 9]]
    assert ours.state_dict()["epoch"] == 1


def test_batch_sampler_without_sampler_on_a_fastload_dataset(tmp_path):
    fastload.pack(make_image_folder(tmp_path / "src", classes=2, per_class=2), tmp_path / "ds", workers=0)
    ds = fastload.open(tmp_path / "ds", transforms={"image": [T.Resize(8), T.CenterCrop(8)]})
    with pytest.warns(fastload.FastPathWarning, match="batch_sampler"):
        dl = fastload.DataLoader(ds, batch_sampler=Pairs())
    assert [b[1].tolist() for b in dl] == [[ds[0][1], ds[1][1]], [ds[2][1], ds[3][1]]]


# -- C: a subclass that runs torch's __init__, not fastload's ------------------------------------------
class TorchInit(fastload.DataLoader):
    def __init__(self, *args, **kwargs):
        TORCH_LOADER.__init__(self, *args, **kwargs)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_subclass_running_torchs_init(num_workers):
    dl = TorchInit(Squares(), batch_size=4, num_workers=num_workers)
    assert not dl.fast_path and len(dl) == 3
    assert values(dl) == values(TORCH_LOADER(Squares(), batch_size=4))
    assert dl.state_dict()["epoch"] == 1 and dl.stats()["fast_path"] is False
    assert values(pickle.loads(pickle.dumps(dl))) == [i * i for i in range(10)]


def test_subclass_running_torchs_init_warns_like_torch():
    with pytest.warns(UserWarning, match="worker processes in total"):
        TorchInit(Squares(), num_workers=4096)


# -- D: a subclass's _get_iterator is honoured ---------------------------------------------------------
class OwnIterator(fastload.DataLoader):
    def _get_iterator(self):
        self.used = getattr(self, "used", 0) + 1
        return super()._get_iterator()


@pytest.mark.parametrize("num_workers, persistent", [(0, False), (2, False), (2, True)])
def test_subclass_get_iterator_override(num_workers, persistent):
    dl = OwnIterator(Squares(), batch_size=4, num_workers=num_workers, persistent_workers=persistent)
    it = iter(dl)
    assert dl.used == 1  # at iter(), as torch (Lightning's CombinedLoader tests count on it)
    del it
    assert values(dl) == values(dl) == [i * i for i in range(10)]
    assert dl.used == (1 if persistent else 3)  # torch makes a persistent iterator once and resets it


# -- E: iter(loader) is a torch DataLoader iterator, on every path ---------------------------------------
def test_iterators_are_torch_iterators(tmp_path):
    fastload.pack(make_image_folder(tmp_path / "src", classes=2, per_class=2), tmp_path / "ds", workers=0)
    ds = fastload.open(tmp_path / "ds", transforms={"image": [T.Resize(8), T.CenterCrop(8)]})
    loaders = [fastload.DataLoader(Squares()), fastload.DataLoader(Squares(), num_workers=2),
               fastload.DataLoader(Squares(), num_workers=2, persistent_workers=True),
               fastload.DataLoader(Stream(), num_workers=2), fastload.DataLoader(ds, batch_size=2),
               fastload.DataLoader(ds, batch_size=2, num_workers=2)]
    for dl in loaders:
        it = iter(dl)
        assert isinstance(it, _BaseDataLoaderIter), type(it)
        with pytest.raises(NotImplementedError):
            pickle.dumps(it)
        del it


def test_lightning_pickles_a_combined_loader_mid_epoch():
    pytest.importorskip("lightning")
    from lightning.pytorch.utilities import CombinedLoader

    combined = CombinedLoader([fastload.DataLoader(Squares(), batch_size=2, num_workers=2)], "max_size_cycle")
    it = iter(combined)
    next(it)
    pickle.loads(pickle.dumps(combined._iterator))  # Lightning leaves DataLoader iterators out of the pickle


# -- G: a persistent iterator of a temporary loader takes its workers with it ----------------------------
@pytest.mark.parametrize("dataset", [Squares, Stream])
def test_persistent_iterator_of_a_temporary_loader_stops_its_workers(dataset):
    gc.collect()
    gc.disable()  # torch's workers go with the last reference, not with a garbage collection
    try:
        it = iter(fastload.DataLoader(dataset(), num_workers=2, persistent_workers=True))
        for _ in range(5):
            next(it)
        workers = list(it.inner._workers)
        assert workers and all(w.is_alive() for w in workers)
        del it
        for w in workers:
            w.join(timeout=10)
        assert not any(w.is_alive() for w in workers)
    finally:
        gc.enable()


class _Forwarding:
    """accelerate's DataLoaderAdapter in short: unknown attributes go to the wrapped loader, and pickling
    re-makes the wrapper by calling its class (which builds a throwaway loader) and then restores its dict."""

    def __init__(self, dataset):
        self.base_dataloader = fastload.DataLoader(dataset, batch_size=2)

    def __getattr__(self, name):
        if name == "base_dataloader":
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)

    def __reduce__(self):
        return (_Forwarding, ([],), self.__dict__)


def test_a_forwarding_wrapper_pickles_with_its_own_loader():
    """issue 18 cause H (the upstream suites: accelerate's test_can_pickle_dataloader): pickle looked up
    __setstate__ through the wrapper's forwarding, got fastload's, and restored the wrapper's state into the
    throwaway loader; the wrapper kept the empty one."""
    again = pickle.loads(pickle.dumps(_Forwarding(list(range(10)))))
    assert len(again.base_dataloader.dataset) == 10 and len(again.base_dataloader) == 5
    assert [b.tolist() for b in again.base_dataloader][:2] == [[0, 1], [2, 3]]


def test_an_unpickled_fast_loader_is_on_the_fast_path_again(tmp_path):
    from conftest import packed_image_folder
    from fastload import transforms as T

    ds = fastload.open(packed_image_folder(tmp_path), transforms={"image": [T.Resize((8, 8))]})
    dl = fastload.DataLoader(ds, batch_size=4, seed=3)
    again = pickle.loads(pickle.dumps(dl))
    assert again.fast_path and again._batcher is not dl._batcher
    assert all(torch.equal(a[0], b[0]) for a, b in zip(dl, again))
    plain = pickle.loads(pickle.dumps(fastload.DataLoader(list(range(4)))))
    assert not plain.fast_path


class _StatefulIndices(torch.utils.data.BatchSampler):
    """A batch sampler whose iterator saves its position, as torchdata's stateful BatchSampler iterator does."""

    def __iter__(self):
        outer = self

        class It:
            done = 0

            def __iter__(self):
                return self

            def __next__(self):
                batches = list(torch.utils.data.BatchSampler.__iter__(outer))
                if self.done >= len(batches):
                    raise StopIteration
                self.done += 1
                return batches[self.done - 1]

            def state_dict(self):
                return {"done": self.done}

        return It()


class _OwnState(fastload.DataLoader):
    """torchdata's StatefulDataLoader in short: it keeps its own position, from its index sampler's iterator."""

    def state_dict(self):
        return {"sampler_iter": self._it.state_dict()}

    def load_state_dict(self, state):
        pass


def test_a_subclass_with_its_own_state_gets_torch_s_index_sampler():
    """issue 18 cause K (the upstream suites: torchdata's StatefulDataLoader tests): the generic path handed a
    subclass that saves its index sampler iterator's state a replaying wrapper whose iterator has none, so its
    mid-epoch resume drew the RandomSampler again."""
    data = list(range(10))
    dl = _OwnState(data, batch_sampler=_StatefulIndices(torch.utils.data.SequentialSampler(data), 2, False))
    assert dl._index_sampler is dl.batch_sampler
    dl._it = iter(dl._index_sampler)
    next(dl._it), next(dl._it)
    assert dl.state_dict() == {"sampler_iter": {"done": 2}}
    assert type(fastload.DataLoader(data)._index_sampler).__name__ == "IndexReplay"  # fastload's own resume
