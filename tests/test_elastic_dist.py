"""Elastic resume under real torch.distributed (gloo, four processes on localhost, started here): a position saved
by N ranks at batch size B goes on over M ranks at B' -- 4 -> 2 and 3 -> 3 (another batch size) through
torch.distributed.checkpoint (each rank saves its loader's state, DCP keeps one copy; the new ranks load it),
2 -> 3 through the list of all ranks' states. The state travels only through the checkpoint (or the list): each
phase builds new loaders. A ledger of sample ids proves every sample of the epoch is read exactly once over the
saved part and the resumed part (but for the padding of the new split: fewer samples than ranks); a digest of
each sample's pixels, behind a random crop and flip, proves each sample got the pixels it gets in a single
uninterrupted process (and a padding copy, a second read, other draws); the next epoch is a fresh M-rank loader's."""

from __future__ import annotations

import hashlib
import pickle
from collections import Counter
from pathlib import Path

import pytest

import fastload
from fastload import transforms as T
from gloo_common import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
N = 37  # not a multiple of any world size here: the splits pad (or cut)
EPOCH, K, SEED = 1, 2, 11  # the saved position: epoch 1, after K batches on every rank
# name: (old world, old batch, new world, new batch, how the state travels)
SCENARIOS = {"4->2": (4, 3, 2, 4, "dcp"), "2->3": (2, 4, 3, 3, "list"), "3->3": (3, 2, 3, 5, "dcp")}


def loader(root, batch, rank, world, num_workers=0):
    ds = fastload.open(root, transforms={"image": [T.RandomResizedCrop(12), T.RandomHorizontalFlip()]})
    return fastload.DataLoader(ds, batch_size=batch, shuffle=True, seed=SEED, rank=rank, world_size=world,
                               num_workers=num_workers)


def ledger(batches) -> list[tuple[int, str]]:
    """(sample id, digest of its pixels) of every sample of the batches, in order."""
    out = []
    for image, _label, ids in batches:
        for img, i in zip(image, ids):
            out.append((int(i), hashlib.blake2b(img.contiguous().numpy().tobytes(), digest_size=8).hexdigest()))
    return out


def first_batches(dl, k):
    it = iter(dl)
    return [next(it) for _ in range(k)]


def _rank(rank: int, root: str, ckpt: str) -> dict:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.stateful import Stateful

    groups = {w: dist.new_group(list(range(w))) for w in (2, 3)}  # every rank makes every group
    groups[4] = None  # the default group
    result = {}
    for name, (w, b, w2, b2, how) in SCENARIOS.items():
        path = str(Path(ckpt) / name.replace(">", ""))
        if rank < w:  # the saving run: K batches of epoch EPOCH, then a checkpoint
            dl = loader(root, b, rank, w)
            dl.set_epoch(EPOCH)
            result[(name, "saved")] = ledger(first_batches(dl, K))
            if how == "dcp":
                assert isinstance(dl, Stateful)  # DCP calls its state_dict()/load_state_dict()
                dcp.save({"loader": dl}, checkpoint_id=path, process_group=groups[w])
            else:
                states = [None] * w
                dist.all_gather_object(states, dl.state_dict(), group=groups[w])
                if rank == 0:
                    Path(path).write_bytes(pickle.dumps(states))
        dist.barrier()
        if rank < w2:  # the resumed run: new loaders, another world size or batch size, two workers
            dl = loader(root, b2, rank, w2, num_workers=2)
            if how == "dcp":
                dcp.load({"loader": dl}, checkpoint_id=path, process_group=groups[w2])
            else:
                dl.load_state_dict(pickle.loads(Path(path).read_bytes()))
            result[(name, "resumed")] = ledger(dl)
            result[(name, "next")] = ledger(dl)
            fresh = loader(root, b2, rank, w2)
            fresh.set_epoch(EPOCH + 1)
            result[(name, "fresh_next")] = ledger(fresh)
        dist.barrier()
    return result


@pytest.fixture(scope="module")
def runs(numbered, tmp_path_factory):
    root = numbered(N)  # Numbered: (image, label, id)
    got = run_ranks(_rank, 4, str(root), str(tmp_path_factory.mktemp("elastic_ckpt")))
    # the pixels each sample gets in epoch EPOCH, in one uninterrupted process
    whole = loader(root, 5, 0, 1)
    whole.set_epoch(EPOCH)
    reference = dict(ledger(whole))
    return got, reference


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_sample_once_with_its_pixels(runs, name):
    got, reference = runs
    w, b, w2, b2, _ = SCENARIOS[name]
    saved = [x for r in range(w) for x in got[r][(name, "saved")]]
    per_rank = [got[r][(name, "resumed")] for r in range(w2)]
    resumed = [x for part in per_rank for x in part]
    assert len(saved) == w * b * K
    assert len({len(p) for p in per_rank}) == 1, f"unequal shares {[len(p) for p in per_rank]} (DDP would hang)"
    ids_saved, ids_resumed = [i for i, _ in saved], [i for i, _ in resumed]
    assert len(set(ids_saved)) == len(ids_saved)
    assert not set(ids_saved) & set(ids_resumed), "a sample read before the checkpoint was read again"
    assert set(ids_saved) | set(ids_resumed) == set(range(N)), "a sample of the epoch was never read"
    extra = len(ids_resumed) - len(set(ids_resumed))
    assert extra < w2 and all(c <= 2 for c in Counter(ids_resumed).values())  # the new split's padding only
    reads: dict[int, list[str]] = {}
    for i, d in saved + resumed:
        reads.setdefault(i, []).append(d)
    for i, ds in reads.items():
        # a sample's read keeps its pixels; a padding copy is a second read of the epoch: draws of its own
        assert ds.count(reference[i]) == 1, f"sample {i} got other pixels than in an uninterrupted run: {ds}"
        assert len(set(ds)) == len(ds), f"sample {i}'s padding copy repeated its first read's crop"


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_next_epoch_is_a_fresh_runs(runs, name):
    got, _ = runs
    w2 = SCENARIOS[name][2]
    for r in range(w2):
        assert got[r][(name, "next")] == got[r][(name, "fresh_next")]
