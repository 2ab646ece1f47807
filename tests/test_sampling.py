"""fastload/_front/sampling.py: a user's sampler driving the fast path (the sampler's order, fastload's batches, resume
as a position in the sampler's order), the generic path resuming the same way, and the generic path under
fastload's Order."""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DistributedSampler, RandomSampler, SequentialSampler
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import default_collate

import fastload
from fastload import transforms as T
from fastload.fast.order import Order

from conftest import packed_image_folder


@pytest.fixture(scope="module")
def arrays(tmp_path_factory):
    root = tmp_path_factory.mktemp("sampled")
    rng = np.random.default_rng(0)
    data = {"x": rng.random((53, 4), dtype=np.float32), "y": np.arange(53)}
    fastload.pack(data, root / "ds", shard_size="1K")
    return root / "ds"


# 18 pictures, not conftest's 12: the resume test needs more than the 2 batches of 3 it skips on each of 2 ranks
@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return packed_image_folder(tmp_path_factory.mktemp("sampled_images"), classes=2, per_class=9)


def labels(loader) -> list[int]:
    return torch.cat([b[1] for b in loader]).tolist()


@contextlib.contextmanager
def no_fast_path_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastload.FastPathWarning)
        yield


def test_default_collate_is_not_a_custom_collate(arrays):
    ds = fastload.open(arrays)
    with no_fast_path_warning():
        dl = fastload.DataLoader(ds, batch_size=8, collate_fn=default_collate)
    assert dl.fast_path, dl.fast_path_reason
    assert labels(dl) == list(range(53))
    # what Lightning does: build a loader from another loader's attributes
    again = fastload.DataLoader(ds, batch_size=8, collate_fn=dl.collate_fn)
    assert again.fast_path


@pytest.mark.parametrize("make", [
    lambda ds: dict(sampler=SequentialSampler(ds)),
    lambda ds: dict(sampler=RandomSampler(ds, generator=torch.Generator().manual_seed(4))),
    lambda ds: dict(sampler=DistributedSampler(ds, num_replicas=3, rank=1, shuffle=True, seed=9)),
    lambda ds: dict(batch_sampler=BatchSampler(RandomSampler(ds, generator=torch.Generator().manual_seed(4)), 8,
                                               drop_last=True)),
], ids=["sequential", "random", "distributed", "batch_sampler"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_drives_the_fast_path_in_its_own_order(arrays, make, workers):
    ds = fastload.open(arrays)
    size = {} if "batch_sampler" in make(ds) else dict(batch_size=8)
    with no_fast_path_warning():
        ours = fastload.DataLoader(ds, num_workers=workers, collate_fn=default_collate, **size, **make(ds))
    theirs = TorchLoader(ds, **size, **make(ds))
    assert ours.fast_path and len(ours) == len(theirs)
    for epoch in range(2):  # the sampler's own order, epoch after epoch (its generator moves on)
        if isinstance(ours.sampler, DistributedSampler):
            ours.sampler.set_epoch(epoch)
            theirs.sampler.set_epoch(epoch)
        got, want = list(ours), list(theirs)
        assert [b[1].tolist() for b in got] == [b[1].tolist() for b in want]
        assert all(torch.equal(a[0], b[0]) for a, b in zip(got, want))


def test_distributed_ranks_are_disjoint_and_complete(arrays):
    ds = fastload.open(arrays)
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=1)
        dl = fastload.DataLoader(ds, batch_size=5, sampler=sampler)
        assert dl.fast_path
        seen.append(labels(dl))
    assert len(seen[0]) == len(seen[1]) == 27
    assert set(seen[0]) | set(seen[1]) == set(range(53))
    assert len(set(seen[0]) & set(seen[1])) == 1  # DistributedSampler pads 53 to 54 by repeating one sample


@pytest.mark.parametrize("make", [
    lambda ds: RandomSampler(ds),  # draws from torch's global generator
    lambda ds: RandomSampler(ds, generator=torch.Generator().manual_seed(2)),
    lambda ds: DistributedSampler(ds, num_replicas=2, rank=0, seed=3),
    lambda ds: SequentialSampler(ds),
], ids=["random_global", "random_generator", "distributed", "sequential"])
def test_resume_mid_epoch_in_the_samplers_order_bit_for_bit(images, make):
    def loader():
        ds = fastload.open(images, transforms={"image": [T.RandomResizedCrop(24), T.RandomHorizontalFlip()]})
        return fastload.DataLoader(ds, batch_size=3, sampler=make(ds), num_workers=1, seed=11)

    torch.manual_seed(0)
    ref_loader = loader()
    next(iter(ref_loader))  # epoch 0, so that the checkpoint is in epoch 1
    if isinstance(ref_loader.sampler, DistributedSampler):
        ref_loader.sampler.set_epoch(1)
    ref = [(b[0].clone(), b[1].clone()) for b in ref_loader]
    torch.manual_seed(0)
    dl = loader()
    next(iter(dl))
    if isinstance(dl.sampler, DistributedSampler):
        dl.sampler.set_epoch(1)
    it = iter(dl)
    for _ in range(2):
        next(it)
    state = dl.state_dict()
    after_checkpoint = torch.get_rng_state()
    del it
    assert state["epoch"] == 1 and state["batches_done"] == 2

    torch.manual_seed(123)  # a new process: a different global generator, until the checkpoint restores it
    restored = loader()
    torch.set_rng_state(after_checkpoint)
    restored.load_state_dict(state)
    rest = [(b[0].clone(), b[1].clone()) for b in restored]
    assert len(rest) == len(ref) - 2
    for (a, la), (b, lb) in zip(rest, ref[2:]):
        assert torch.equal(la, lb) and torch.equal(a, b)
    # replaying the epoch's draw leaves torch's global generator where the checkpoint put it
    assert torch.equal(torch.get_rng_state(), after_checkpoint)


def test_end_of_epoch_state_starts_the_next_epoch(arrays):
    ds = fastload.open(arrays)
    dl = fastload.DataLoader(ds, batch_size=10, sampler=DistributedSampler(ds, num_replicas=1, rank=0, seed=5))
    list(dl)
    state = dl.state_dict()
    assert (state["epoch"], state["batches_done"]) == (1, 0)


def test_a_sampler_that_cannot_be_replayed_resumes_only_at_epoch_ends(arrays):
    ds = fastload.open(arrays)
    weighted = torch.utils.data.WeightedRandomSampler(torch.ones(53), 53)
    dl = fastload.DataLoader(ds, batch_size=10, sampler=weighted)
    assert dl.fast_path
    it = iter(dl)
    next(it)
    state = dl.state_dict()
    assert state["replayable"] is False
    with pytest.raises(ValueError, match="cannot resume mid-epoch.*WeightedRandomSampler.*end-of-epoch"):
        fastload.DataLoader(ds, batch_size=10, sampler=weighted).load_state_dict(state)
    list(it)
    fastload.DataLoader(ds, batch_size=10, sampler=weighted).load_state_dict(dl.state_dict())  # epoch end: fine


def test_a_state_from_another_sampler_is_refused_naming_the_difference(arrays):
    ds = fastload.open(arrays)
    dl = fastload.DataLoader(ds, batch_size=10, sampler=DistributedSampler(ds, num_replicas=2, rank=0))
    state = dl.state_dict()
    other = fastload.DataLoader(ds, batch_size=10, sampler=DistributedSampler(ds, num_replicas=4, rank=0))
    with pytest.raises(ValueError, match="num_replicas=2 \\(this loader: 4\\)"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="sampler drove the order"):
        fastload.DataLoader(ds, batch_size=10).load_state_dict(state)


def test_bad_indices_and_oversized_batches_are_refused(arrays):
    ds = fastload.open(arrays)
    with pytest.raises(IndexError, match="index 60, out of range for a dataset of 53"):
        list(fastload.DataLoader(ds, batch_size=4, sampler=[1, 60]))

    class Greedy(BatchSampler):
        def __iter__(self):
            yield list(range(self.batch_size + 1))

    with pytest.raises(ValueError, match="batch of 5 indices, but its batch_size is 4"):
        list(fastload.DataLoader(ds, batch_sampler=Greedy(SequentialSampler(ds), 4, False)))


# -- the generic path resumes the same way --------------------------------------------------------------
class Plain(torch.utils.data.Dataset):
    def __len__(self):
        return 29

    def __getitem__(self, i):
        return torch.full((2,), float(i)), i


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(10))


@pytest.mark.parametrize("make", [
    lambda ds: dict(shuffle=True),  # torch's RandomSampler over torch's default generator
    lambda ds: dict(shuffle=True, generator=torch.Generator().manual_seed(6)),
    lambda ds: dict(sampler=DistributedSampler(ds, num_replicas=2, rank=1, seed=2)),
    lambda ds: dict(shuffle=False),
], ids=["random_global", "random_generator", "distributed", "sequential"])
@pytest.mark.parametrize("workers, persistent", [(0, False), (2, False), (2, True)])
def test_generic_path_resumes_mid_epoch_in_the_samplers_order(make, workers, persistent):
    def loader():
        ds = Plain()
        return fastload.DataLoader(ds, batch_size=3, num_workers=workers, persistent_workers=persistent, **make(ds))

    torch.manual_seed(0)
    ref_loader = loader()
    list(ref_loader)
    if isinstance(ref_loader.sampler, DistributedSampler):
        ref_loader.sampler.set_epoch(1)
    ref = [b[1].tolist() for b in ref_loader]
    torch.manual_seed(0)
    dl = loader()
    assert not dl.fast_path
    list(dl)
    if isinstance(dl.sampler, DistributedSampler):
        dl.sampler.set_epoch(1)
    it = iter(dl)
    got = [next(it)[1].tolist() for _ in range(4)]
    state = dl.state_dict()
    after_checkpoint = torch.get_rng_state()
    del it
    assert state["driver"] == "generic" and (state["epoch"], state["batches_done"]) == (1, 4)

    torch.manual_seed(99)
    restored = loader()
    torch.set_rng_state(after_checkpoint)
    restored.load_state_dict(state)
    rest = [b[1].tolist() for b in restored]
    assert got + rest == ref
    assert restored.state_dict()["epoch"] == 2 and restored.state_dict()["batches_done"] == 0
    assert [b[1].tolist() for b in restored]  # and the epoch after goes on normally


def test_generic_path_iterable_dataset_resumes_only_at_epoch_ends():
    dl = fastload.DataLoader(Stream(), batch_size=4)
    it = iter(dl)
    next(it)
    state = dl.state_dict()
    assert state["batches_done"] == 1 and state["replayable"] is False
    with pytest.raises(ValueError, match="cannot resume mid-epoch.*_InfiniteConstantSampler"):
        fastload.DataLoader(Stream(), batch_size=4).load_state_dict(state)
    list(it)
    end = dl.state_dict()
    assert (end["epoch"], end["batches_done"]) == (1, 0)
    again = fastload.DataLoader(Stream(), batch_size=4)
    again.load_state_dict(end)
    assert len(list(again)) == 3


# -- the generic path under fastload's Order (issue 17 row 3): rank, world_size, seed and order on a plain Dataset
# mean what they mean on the fast path (the same Order, fast/order.py), resume included; a fastload.Dataset that
# falls off the fast path keeps its order and says what it keeps (_front/sampling.py's GenericPlan and OrderIndices;
# real torch.distributed: test_distributed.py)
N = 23


class Indices(torch.utils.data.Dataset):
    """A plain Dataset of N samples, sample i being i."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return i


def flat(loader) -> list[int]:
    out = []
    for b in loader:
        out.extend(b.tolist() if isinstance(b, torch.Tensor) and b.ndim else [int(b)])
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["sequential", "random", "quasi"])
def test_the_fast_paths_order_per_rank(num_workers, kind):
    for rank in range(3):
        dl = fastload.DataLoader(Indices(), batch_size=4, order=kind, seed=11, rank=rank, world_size=3,
                                 num_workers=num_workers)
        want = Order(N, 4, kind=kind, seed=11, rank=rank, world_size=3)
        assert not dl.fast_path and len(dl) == len(want) == 2
        for epoch in range(2):
            assert flat(dl) == want.indices(epoch).tolist()


def test_shuffle_and_seed_without_a_split():
    a = flat(fastload.DataLoader(Indices(), batch_size=5, shuffle=True, seed=4))
    assert a == flat(fastload.DataLoader(Indices(), batch_size=5, shuffle=True, seed=4)) != list(range(N))
    assert sorted(a) == list(range(N))


def test_no_automatic_batching():
    dl = fastload.DataLoader(Indices(), batch_size=None, seed=2, shuffle=True, rank=1, world_size=2)
    assert len(dl) == 12 and flat(dl) == Order(N, 1, kind="random", seed=2, rank=1, world_size=2).indices(0).tolist()


def test_torchs_samplers_when_nothing_is_asked():
    torch.manual_seed(0)
    ours = flat(fastload.DataLoader(Indices(), batch_size=5, shuffle=True))
    torch.manual_seed(0)
    assert ours == flat(torch.utils.data.DataLoader(Indices(), batch_size=5, shuffle=True))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_mid_epoch(num_workers):
    def make():
        return fastload.DataLoader(Indices(), batch_size=3, order="random", seed=8, rank=1, world_size=2,
                                   num_workers=num_workers)

    whole = make()
    flat(whole)
    second = flat(whole)
    dl = make()
    flat(dl)
    it = iter(dl)
    next(it), next(it)
    state = dl.state_dict()
    del it
    again = make()
    again.load_state_dict(state)
    assert flat(again) == second[6:]


def test_fell_off_the_fast_path_keeps_its_order(small_images):
    ds = fastload.open(small_images, transforms={"image": [T.Resize(8), T.CenterCrop(8)]})
    fast = fastload.DataLoader(ds, batch_size=2, shuffle=True, seed=3, rank=1, world_size=2)
    with pytest.warns(fastload.FastPathWarning, match=r"stay fastload's \(random, seed=3, rank 1 of 2\)"):
        slow = fastload.DataLoader(ds, batch_size=2, shuffle=True, seed=3, rank=1, world_size=2,
                                   collate_fn=lambda samples: [s[1] for s in samples])
    assert fast.fast_path and not slow.fast_path
    assert [b[1].tolist() for b in fast] == list(slow)
    it = iter(slow)
    next(it)
    state = slow.state_dict()
    assert state == fast.state_dict() | {"epoch": 1, "batches_done": 1}  # the fast path's state, loadable there


class _OneOfTwoRanks:
    """torch.distributed as rank 0 of 2 sees it, with every collective refused: a loader that only rank 0 builds
    (or that the ranks build in another order) would wait forever in a real collective."""

    def __init__(self, monkeypatch):
        import torch.distributed as dist

        def collective(*a, **k):
            raise AssertionError("a collective call while building a loader: it hangs when only rank 0 builds it")

        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_world_size", lambda *a: 2)
        monkeypatch.setattr(dist, "get_rank", lambda *a: 0)
        for name in ("broadcast_object_list", "broadcast", "all_gather_object", "barrier"):
            monkeypatch.setattr(dist, name, collective)


@pytest.mark.parametrize("plain", [False, True])
def test_shuffling_ranks_with_no_seed_agree_without_a_collective(arrays, monkeypatch, plain):
    """Under torch.distributed a shuffled loader with no seed= used to broadcast rank 0's draw while being built:
    a loader built on rank 0 only hung. Now it shuffles with DistributedSampler's default seed 0 on every rank,
    the fast path and the generic path alike."""
    _OneOfTwoRanks(monkeypatch)
    ds = fastload.open(arrays) if not plain else torch.utils.data.TensorDataset(torch.arange(53))
    # a plain dataset asked for nothing gets torch's own samplers: order= asks for fastload's split
    shuffle = {"order": "random"} if plain else {"shuffle": True}
    unseeded = fastload.DataLoader(ds, batch_size=4, **shuffle)
    assert unseeded.seed == 0
    seeded = fastload.DataLoader(ds, batch_size=4, seed=0, rank=0, world_size=2, **shuffle)
    assert [b[-1].tolist() for b in unseeded] == [b[-1].tolist() for b in seeded]
