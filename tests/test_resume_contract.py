"""The resume contract, torchdata's kind, over every configuration of the loader: save at every position of a short
epoch (before the first batch, between any two, after the last), restore into a fresh loader, and the rest of the
stream -- the epoch's remaining batches and the whole next epoch -- is identical, tensor for tensor. And the elastic
one: restored at every position into two ranks at another batch size, every sample of the epoch is read once."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler, RandomSampler

import fastload
from fastload import transforms as T
from fastload.fast.stage import innermost


N = 14


class Plain(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.full((2,), float(i)), i


class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.lengths = np.random.default_rng(0).integers(1, 20, size=30)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return {"tokens": np.arange(int(self.lengths[i]), dtype=np.int32) + 1000 * i, "label": i}


@pytest.fixture(scope="module")
def data(numbered, pack_once):
    tokens = pack_once("contract_tokens", Tokens, workers=0,
                       schema={"tokens": fastload.Field.ndarray("tokens", np.int32, (None,))})
    return numbered(N), tokens


def images(path, **kw):
    ds = fastload.open(path, transforms={"image": [T.RandomResizedCrop(8), T.RandomHorizontalFlip()]})
    return fastload.DataLoader(ds, **{"batch_size": 3, "seed": 5, **kw})


def sequences(path, spec, **kw):
    ds = fastload.open(path, transforms={"tokens": spec})
    return fastload.DataLoader(ds, batch_size=3, shuffle=True, seed=5, **kw)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


CONFIGS = {
    "sequential": lambda d: images(d[0]),
    "random": lambda d: images(d[0], shuffle=True),
    "quasi": lambda d: images(d[0], order="quasi"),
    "drop_last": lambda d: images(d[0], shuffle=True, drop_last=True),
    "threads": lambda d: images(d[0], shuffle=True, num_workers=2),
    "rank 1 of 2": lambda d: images(d[0], shuffle=True, rank=1, world_size=2),
    "RandomSampler": lambda d: images(d[0], sampler=RandomSampler(range(N), generator=seeded(1))),
    "DistributedSampler": lambda d: images(d[0], sampler=DistributedSampler(range(N), 2, 1, seed=3)),
    "generic": lambda d: fastload.DataLoader(Plain(), batch_size=3, shuffle=True, seed=5),
    "generic DistributedSampler": lambda d: fastload.DataLoader(Plain(), batch_size=3,
                                                                sampler=DistributedSampler(range(N), 2, 1, seed=3)),
    "generic RandomSampler": lambda d: fastload.DataLoader(Plain(), batch_size=3,
                                                           sampler=RandomSampler(range(N), generator=seeded(1))),
    "Bucket": lambda d: sequences(d[1], T.Bucket([8, 20])),
    "PackSequences": lambda d: sequences(d[1], T.PackSequences(16, drop_fields=["label"])),
}


def equal(x, y) -> bool:
    """Batches (tensors, arrays, numbers, or lists/tuples/dicts of them) equal, value for value."""
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(equal(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return isinstance(y, (list, tuple)) and len(x) == len(y) and all(equal(a, b) for a, b in zip(x, y))
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and torch.equal(x, y)
    return bool(np.array_equal(x, y))


def same(a, b) -> bool:
    return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_restored_at_every_position_the_rest_of_the_stream_is_identical(data, name):
    make = CONFIGS[name]
    whole = make(data)
    ref = [list(whole), list(whole)]  # epochs 0 and 1
    assert len(ref[0]) >= 3
    for p in range(len(ref[0]) + 1):
        first = make(data)
        it = iter(first)
        for _ in range(p):
            next(it)
        state = first.state_dict()
        if first.fast_path and 0 < p < len(ref[0]):  # mid-epoch: the chain's state, its first stage at the position
            assert innermost(state["stages"]) == {"epoch": 0, "batch": state["batches_done"]}, name
        del it
        restored = make(data)
        restored.load_state_dict(state)
        rest = list(restored)
        if p < len(ref[0]):
            assert same(rest, ref[0][p:]), f"{name}: the rest of epoch 0 differs after a restore at batch {p}"
            rest = list(restored)
        if name in ("RandomSampler", "generic RandomSampler") and p == len(ref[0]):
            # an end-of-epoch state holds no generator state: the next epoch is drawn from the user's generator
            # as the restored loader has it (a fresh one here), as torch's RandomSampler would (known; see report)
            continue
        assert same(rest, ref[1]), f"{name}: epoch 1 differs after a restore at batch {p}"


@pytest.mark.parametrize("name", ["sequential", "random", "quasi", "drop_last", "threads"])
def test_restored_at_every_position_on_two_ranks_at_another_batch_size(data, name):
    make = CONFIGS[name]
    n = len(make(data))
    for p in range(n + 1):
        first = make(data)
        it = iter(first)
        read = [int(i) for _ in range(p) for i in next(it)[2]]
        state = first.state_dict()
        del it
        rest = []
        for rank in range(2):
            like = CONFIGS[name](data)  # the same order, on 2 ranks at batch size 2
            kind = like._order.kind
            restored = images(data[0], batch_size=2, rank=rank, world_size=2, shuffle=kind != "sequential", order=kind,
                              drop_last=like.drop_last, num_workers=like.num_workers)
            restored.load_state_dict(state)
            rest += [int(i) for b in restored for i in b[2]]
        if p == n:  # an end-of-epoch state: the next epoch, whole, on the new ranks
            assert state["epoch"] == 1 and (restored.drop_last or set(rest) == set(range(N)))
            continue
        assert not set(read) & set(rest), f"{name}: a sample read before batch {p} was read again"
        if not restored.drop_last:
            assert set(read) | set(rest) == set(range(N)), f"{name}: a sample was never read (restore at {p})"
            assert len(rest) - len(set(rest)) < 2
        if restored.drop_last:
            assert len(rest) == len(set(rest))


def test_a_state_of_another_seed_goes_on_with_its_seed_said_and_shown(data):
    """The order goes on with the state's seed (its batches count positions of that seed's permutation): a seed=
    given to the loader that the state replaces is said, and ``loader.seed`` is the seed in use (it kept showing
    the given one)."""
    import warnings

    rest = list(images(data[0], shuffle=True, seed=5))[1:]  # the uninterrupted epoch after its first batch
    first = images(data[0], shuffle=True, seed=5)
    it = iter(first)
    next(it)
    state = first.state_dict()
    del it
    other = images(data[0], shuffle=True, seed=6)
    with pytest.warns(UserWarning, match=r"resumes with the state's seed=5, not this loader's seed=6"):
        other.load_state_dict(state)
    assert other.seed == 5
    assert same(list(other), rest)
    alike = images(data[0], shuffle=True, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        alike.load_state_dict(state)  # its own seed: nothing to say


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_restored_loader_saved_again_before_its_first_batch_gives_the_same_state(data, name):
    """Preempted again before the first batch after a resume: the state saved then is the one loaded (a RandomSampler's
    lost its generator state, and loading it was refused: "the state has no 'rng_state'")."""
    make = CONFIGS[name]
    ref = list(make(data))
    first = make(data)
    it = iter(first)
    for _ in range(2):
        next(it)
    state = first.state_dict()
    del it
    restored = make(data)
    restored.load_state_dict(state)
    again = make(data)
    again.load_state_dict(restored.state_dict())
    assert same(list(again), ref[2:]), f"{name}: the rest of the epoch differs after a second restore"


@pytest.mark.parametrize("name", ["random", "generic", "Bucket"])
def test_the_state_after_set_epoch_is_where_the_next_iteration_starts(data, name):
    """A checkpoint taken after set_epoch(e) and before the epoch's first batch resumes epoch e from its start; it
    said the previous position (a loaded mid-epoch one: that epoch's rest again, read twice)."""
    make = CONFIGS[name]
    first = make(data)
    it = iter(first)
    next(it)
    state = first.state_dict()
    del it
    restored = make(data)
    restored.load_state_dict(state)
    restored.set_epoch(3)
    saved = restored.state_dict()
    assert (saved["epoch"], saved["batches_done"]) == (3, 0)
    ref = make(data)
    ref.set_epoch(3)
    assert (ref.state_dict()["epoch"], ref.state_dict()["batches_done"]) == (3, 0)
    again = make(data)
    again.load_state_dict(saved)
    assert same(list(again), list(ref))


def test_an_elastic_resume_that_leaves_no_batch_keeps_its_epoch(data):
    """Saved near an epoch's end and resumed where the rest fills no batch (drop_last, more ranks): the epoch is over
    on the new ranks, and a loop that says which epoch it is (set_epoch with the saved epoch, as Lightning does)
    gets nothing more of it. The order jumped to the next epoch, and set_epoch(saved epoch) then read that whole
    epoch again."""
    first = images(data[0], shuffle=True, drop_last=True, batch_size=2)
    it = iter(first)
    for _ in range(len(first) - 1):
        next(it)
    state = first.state_dict()  # 12 of 14 read: 2 left
    del it
    for rank in range(2):
        resumed = images(data[0], shuffle=True, drop_last=True, batch_size=2, rank=rank, world_size=2)
        resumed.load_state_dict(state)
        resumed.set_epoch(0)
        assert list(resumed) == [], "a sample read before the checkpoint was read again"
        assert len(list(resumed)) == len(resumed)  # then epoch 1, whole


def test_a_mid_epoch_state_is_the_chains_and_restores_each_stage_from_its_part(data, monkeypatch):
    """The saved position is the chain's: the first stage's next batch, under the nested state of every stage
    (``stages``); a restored loader's first iteration resets its chain from that state, stage by stage."""
    from fastload.fast.chain import FastIterator

    loader = CONFIGS["threads"](data)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    at = state["stages"]
    depth = 0
    while "source" in at:
        at, depth = at["source"], depth + 1
    assert at == {"epoch": 0, "batch": 2} == {"epoch": state["epoch"], "batch": state["batches_done"]}
    assert depth >= 4  # Count -> Collate -> Produce -> Fill -> Jobs
    del it
    resets = []
    real = FastIterator.reset
    monkeypatch.setattr(FastIterator, "reset", lambda self, s=None: (resets.append(s), real(self, s))[1])
    restored = CONFIGS["threads"](data)
    restored.load_state_dict(state)
    rest = list(restored)
    assert resets == [state["stages"]] and len(rest) == len(restored) - 2
    assert "stages" not in restored.state_dict()  # between epochs the position alone says it


def test_the_chain_with_a_device_stage_on_a_simulated_gpu_resumes_at_every_position(data, monkeypatch):
    from sim_streams import SimGpu
    from test_ring import install_sim

    sim = install_sim(monkeypatch, SimGpu())

    def make():
        return images(data[0], shuffle=True, num_workers=2, device="cuda")

    def run(loader_or_it, k=None):
        out = []
        for b in itertools.islice(loader_or_it, k):
            sim.run_all()
            out.append([t.clone() for t in b])
        return out

    whole = make()
    ref, after = run(whole), run(whole)  # epochs 0 and 1
    for p in range(len(ref) + 1):
        first = make()
        it = iter(first)
        run(it, p)
        state = first.state_dict()
        assert p in (0, len(ref)) or "stages" in state
        del it
        restored = make()
        restored.load_state_dict(state)
        assert same(run(restored), ref[p:] if p < len(ref) else after), f"device: restored at batch {p}"
    assert not sim.races
