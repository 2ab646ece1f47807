"""Which epoch a loader runs after a framework restarts it (issue 18 cause F): the epoch is an input, as for
DistributedSampler. Lightning calls ``set_epoch`` on ``loader.sampler`` at every epoch's start and restores no
loader state after an end-of-epoch checkpoint, so a new loader in a resumed process must run the epoch
Lightning names, not its own count from 0. Here with Lightning's own ``_set_sampler_epoch``; real Trainer runs
are in test_lightning.py."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DistributedSampler

import fastload
from fastload import transforms as T

lightning_data = pytest.importorskip("lightning.fabric.utilities.data")


class Plain(torch.utils.data.Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return i


def fast(path, **kw):
    ds = fastload.open(path, transforms={"image": [T.RandomResizedCrop(8), T.RandomHorizontalFlip()]})
    return fastload.DataLoader(ds, batch_size=4, seed=5, **kw)


def epoch_of(loader, epoch):
    """One epoch as Lightning runs it: set_epoch on the loader's samplers, then iterate."""
    lightning_data._set_sampler_epoch(loader, epoch)
    return [[t.tolist() for t in (b if isinstance(b, (list, tuple)) else [b])] for b in loader]


MAKERS = {
    "fast, fastload's order": lambda p: fast(p, shuffle=True),
    "fast, DistributedSampler": lambda p: fast(p, sampler=DistributedSampler(range(12), 2, 1, seed=3)),
    "generic, fastload's order": lambda p: fastload.DataLoader(Plain(), batch_size=4, shuffle=True, seed=5),
    "generic, sequential": lambda p: fastload.DataLoader(Plain(), batch_size=4),
    "generic, DistributedSampler": lambda p: fastload.DataLoader(
        Plain(), batch_size=4, sampler=DistributedSampler(range(12), 2, 1, seed=3)),
    "generic, workers": lambda p: fastload.DataLoader(Plain(), batch_size=4, shuffle=True, seed=5, num_workers=2),
    "fast, threads": lambda p: fast(p, shuffle=True, num_workers=2),
}


def first_epoch_of_a_run(loader, epoch):
    """A run's first epoch as Lightning runs it: iter() in setup_data, set_epoch after, then the batches."""
    it = iter(loader)
    lightning_data._set_sampler_epoch(loader, epoch)
    return [[t.tolist() for t in (b if isinstance(b, (list, tuple)) else [b])] for b in it]


@pytest.mark.parametrize("name", list(MAKERS))
def test_a_new_loader_runs_the_epoch_lightning_names(small_images, name):
    make = MAKERS[name]
    whole = make(small_images)
    seen = [epoch_of(whole, e) for e in range(4)]
    resumed = make(small_images)  # a new process after an end-of-epoch checkpoint at epoch 1: nothing loaded
    assert [first_epoch_of_a_run(resumed, 2), epoch_of(resumed, 3)] == seen[2:]
    assert resumed.state_dict() == whole.state_dict()  # what Lightning saves next is the same too
    if "sequential" not in name:
        assert seen[2] != seen[3]


@pytest.mark.parametrize("name", list(MAKERS))
def test_mid_epoch_state_survives_lightnings_set_epoch(small_images, name):
    make = MAKERS[name]
    whole = make(small_images)
    want = [epoch_of(whole, e) for e in range(2)][1][1:]
    first = make(small_images)
    epoch_of(first, 0)
    lightning_data._set_sampler_epoch(first, 1)
    it = iter(first)
    next(it)
    state = first.state_dict()
    del it
    resumed = make(small_images)
    resumed.load_state_dict(state)  # Lightning loads the state, then sets the epoch, then iterates
    assert epoch_of(resumed, 1) == want


@pytest.mark.parametrize("seed", [1, None])  # fastload's order; torch's RandomSampler, replayed after a load
def test_set_epoch_to_another_epoch_drops_a_loaded_position(seed):
    dl = fastload.DataLoader(Plain(), batch_size=4, shuffle=True, seed=seed)
    it = iter(dl)
    next(it)
    state = dl.state_dict()
    del it
    again = fastload.DataLoader(Plain(), batch_size=4, shuffle=True, seed=seed)
    again.load_state_dict(state)
    again.set_epoch(0)  # the loaded epoch: its position holds
    assert len([b for b in again]) == 2
    again.load_state_dict(state)
    again.set_epoch(1)  # another epoch: all of it
    assert sorted(i for b in again for i in b.tolist()) == list(range(12))
