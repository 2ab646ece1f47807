"""Under real torch.distributed (gloo, two processes on localhost, started here): each rank's share on the fast
path, on the generic path (a plain Dataset given fastload's seed= or order=), and for a fastload.Dataset that
fell off the fast path (a custom collate_fn), with rank and world_size taken from torch.distributed: disjoint, complete, equal-length, the same
permutation for the same seed (and a new one each epoch), and the same on both paths (issue 17 row 3)."""

from __future__ import annotations

import warnings

import pytest
import torch

import fastload
from fastload import transforms as T
from gloo_common import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
N = 22  # not a multiple of the world size: the last rank's share wraps around, as DistributedSampler's does


class Plain(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.zeros(2), i


def by_id(samples):
    return samples  # a custom collate_fn: the fastload.Dataset leaves the fast path


def ids(loader, key) -> list[int]:
    return [int(i) for batch in loader for i in key(batch)]


def _rank(rank: int, root: str) -> dict:
    warnings.simplefilter("ignore", fastload.FastPathWarning)
    ds = fastload.open(root, transforms={"image": [T.Resize(8), T.CenterCrop(8)]})
    label = lambda b: b[2]  # noqa: E731  (the packed samples' id field)
    made = {
        "fast": lambda seed, nw: fastload.DataLoader(ds, batch_size=3, shuffle=True, seed=seed, num_workers=nw),
        "fell_off": lambda seed, nw: fastload.DataLoader(ds, batch_size=3, shuffle=True, seed=seed,
                                                         num_workers=nw, collate_fn=by_id),
        "plain": lambda seed, nw: fastload.DataLoader(Plain(), batch_size=3, shuffle=True, seed=seed,
                                                      num_workers=nw),
        "plain_unseeded": lambda seed, nw: fastload.DataLoader(Plain(), batch_size=3, order="random",
                                                               num_workers=nw),
    }
    made["torch_semantics"] = lambda seed, nw: fastload.DataLoader(Plain(), batch_size=3, shuffle=False,
                                                                   num_workers=nw)
    keys = {"fast": label, "fell_off": lambda b: [s[2] for s in b], "plain": lambda b: b[1],
            "plain_unseeded": lambda b: b[1], "torch_semantics": lambda b: b[1]}
    result = {}
    for name, make in made.items():
        for nw in (0, 2):
            dl = make(7, nw)
            epochs = [ids(dl, keys[name]) for _ in range(2)]
            result[(name, nw)] = dict(fast=dl.fast_path, len=len(dl), epochs=epochs,
                                      again=ids(make(7, nw), keys[name]))
    return result


@pytest.fixture(scope="module")
def per_rank(numbered):
    # Numbered: (image, label, id), the id tells which sample a rank saw
    return run_ranks(_rank, 2, str(numbered(N)))


@pytest.mark.parametrize("name", ["fast", "fell_off", "plain", "plain_unseeded"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_ranks_disjoint_complete_equal(per_rank, name, num_workers):
    a, b = per_rank[0][(name, num_workers)], per_rank[1][(name, num_workers)]
    assert a["fast"] == b["fast"] == (name == "fast")
    assert a["len"] == b["len"] == 4  # ceil(ceil(22 / 2) / 3) batches each
    for e in range(2):
        mine, theirs = a["epochs"][e], b["epochs"][e]
        assert len(mine) == len(theirs) == N // 2
        assert not set(mine) & set(theirs) and set(mine) | set(theirs) == set(range(N))
    assert a["epochs"][0] != a["epochs"][1]  # a new permutation each epoch
    assert a["again"] == a["epochs"][0] or name == "plain_unseeded"  # the same seed, the same order


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_plain_loader_asked_for_nothing_is_torch_s(per_rank, num_workers):
    """A plain Dataset with none of fastload's arguments is torch's DataLoader under torch.distributed too:
    every rank reads every sample (the frameworks add their own DistributedSampler; accelerate's test_cpu
    failed when fastload split it by rank by itself)."""
    for rank in range(2):
        got = per_rank[rank][("torch_semantics", num_workers)]
        assert got["len"] == 8 and got["epochs"] == [list(range(N))] * 2


def test_paths_agree(per_rank):
    # a fastload.Dataset off the fast path keeps its order: the same batches as its fast path
    for rank in range(2):
        assert per_rank[rank][("fell_off", 0)]["epochs"] == per_rank[rank][("fast", 0)]["epochs"]
        assert per_rank[rank][("fell_off", 2)]["epochs"] == per_rank[rank][("fast", 2)]["epochs"]
