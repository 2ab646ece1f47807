"""A sample read several times in one epoch gets independent draws per read (its occurrence keys them), as under
torch's DataLoader: repeated augmentation (timm's RepeatAugSampler, DeiT's ``--repeated-aug``), a mix's quota
over a small dataset, padding. A sample's first read keeps the key of (seed, epoch, index) alone, so a sample read
once keeps its pixels. Pixels are compared by sample id (``Numbered``'s ``id`` field)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

import fastload
import fastload.transforms as T
from fastload._draws import SampleDraws, occurrences

pytest.importorskip("fastload._C")

N = 10


def PIPELINE() -> dict:
    """A crop of these small pictures takes few distinct values (two reads can draw the same one by chance); the
    rotation's angle is continuous, so two reads with other draws never give the same pixels."""
    return {"image": [T.RandomResizedCrop((24, 28), scale=(0.1, 1.0)), T.RandomHorizontalFlip(), T.RandomRotation(30)]}


class RepeatSampler(torch.utils.data.Sampler):
    """timm's RepeatAugSampler's split, written out: each index ``repeats`` times in a row in the (optionally
    shuffled) epoch, padded to a multiple of ``num_replicas``, rank ``rank`` taking every ``num_replicas``-th
    position, so a sample's copies land on different ranks (with as many ranks as repeats, one copy each)."""

    def __init__(self, n: int, num_replicas: int, rank: int, repeats: int = 3, shuffle: bool = True):
        self.n, self.num_replicas, self.rank, self.repeats, self.shuffle = n, num_replicas, rank, repeats, shuffle
        self.epoch = 0
        self.total = math.ceil(n * repeats / num_replicas) * num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.epoch)
        base = torch.randperm(self.n, generator=g).tolist() if self.shuffle else list(range(self.n))
        seq = [i for i in base for _ in range(self.repeats)]
        seq += seq[: self.total - len(seq)]
        return iter(seq[self.rank : self.total : self.num_replicas])

    def __len__(self) -> int:
        return self.total // self.num_replicas


def reads(batches) -> dict[int, list[np.ndarray]]:
    """{sample id: the pixels of each of its reads, in order}."""
    out: dict[int, list[np.ndarray]] = {}
    for batch in batches:
        for img, i in zip(batch["image"], batch["id"].tolist()):
            out.setdefault(i, []).append(img.numpy().copy())
    return out


def all_differ(images: list[np.ndarray]) -> bool:
    return all(not np.array_equal(a, b) for k, a in enumerate(images) for b in images[k + 1 :])


def digest(img) -> bytes:
    return np.ascontiguousarray(img).tobytes()


# -- the key --------------------------------------------------------------------------------------
def _old_key(seed: int, epoch: int, index: int) -> int:
    """The key of a sample before occurrences existed, written out in Python ints: SplitMix64's finaliser of
    (epoch key XOR finaliser(index)), the epoch key from numpy's SeedSequence of ("SAMP", seed, epoch)."""
    m = 2**64 - 1

    def mix(x: int) -> int:
        x = (x + 0x9E3779B97F4A7C15) & m
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
        return x ^ (x >> 31)

    words = [0x53414D50, seed & 0xFFFFFFFF, seed >> 32, epoch & 0xFFFFFFFF, epoch >> 32]
    ek = int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0])
    return mix(ek ^ mix(index))


def test_a_first_read_keeps_the_key_of_seed_epoch_and_index_alone():
    """Occurrence 0 is the key of before: every sample read once keeps its pixels. A repeat's key is another."""
    idx = [0, 5, 9, 5, 5]
    expected = [_old_key(7, 2, i) for i in idx]
    assert SampleDraws(7, 2, idx).keys.tolist() == expected
    assert SampleDraws(7, 2, idx, [0, 0, 0, 0, 0]).keys.tolist() == expected
    keys = SampleDraws(7, 2, idx, occurrences(np.array(idx))).keys.tolist()
    assert keys[:3] == expected[:3]
    assert len({keys[1], keys[3], keys[4]}) == 3  # sample 5's three reads: three keys


def test_a_plain_orders_reads_keep_their_keys():
    """A shuffled epoch without repeats (and a world size that needs no padding) keys every sample as before."""
    from fastload.fast.order import Order

    for kind in ("random", "quasi", "sequential"):
        order = Order(N, 2, kind=kind, seed=7, shard_sizes=np.array([4, 6]), world_size=2, rank=1)
        idx = order.indices(3)
        got = np.concatenate([order.batch_rng(3, b).samples(idx[2 * b : 2 * b + 2]).keys for b in range(len(order))])
        assert got.tolist() == [_old_key(7, 3, int(i)) for i in idx], kind


def test_occurrences_count_earlier_equal_positions():
    seq = np.array([3, 1, 3, 3, 0, 1, 7])
    assert occurrences(seq).tolist() == [0, 0, 1, 2, 0, 1, 0]
    assert occurrences(np.zeros(0, np.int64)).tolist() == []


# -- a user's sampler: repeated augmentation -------------------------------------------------------
@pytest.mark.parametrize("world", [3, 1])
def test_repeated_augmentation_gives_each_copy_its_own_crop(numbered, world):
    """RepeatAugSampler's three copies of a sample: on three ranks (each reads it once there) or all on one rank
    (read three times there) -- three different crops, not one crop three times."""
    path = numbered(N)
    got: dict[int, list[np.ndarray]] = {}
    for rank in range(world):
        ds = fastload.open(path, transforms=PIPELINE(), as_dict=True)
        dl = fastload.DataLoader(ds, batch_size=4, sampler=RepeatSampler(N, world, rank), seed=7)
        assert dl.fast_path, dl.fast_path_reason
        dl.set_epoch(1)
        for i, images in reads(dl).items():
            got.setdefault(i, []).extend(images)
    assert sorted(got) == list(range(N)) and {len(v) for v in got.values()} == {3}
    same = [i for i, images in got.items() if not all_differ(images)]
    assert not same, f"samples {same} got the same crop on two of their three reads"


# -- fastload's own order: a mix over a small dataset ----------------------------------------------
def mix_loader(path, batch_size=4, **kw):
    mixed = fastload.mix({"a": fastload.open(path, transforms=PIPELINE(), as_dict=True)}, num_samples=36, seed=5)
    return fastload.DataLoader(mixed, batch_size=batch_size, shuffle=True, seed=3, **kw)


def mix_reads(batches) -> list[tuple[int, bytes]]:
    """(sample id, pixels) of every read, in order."""
    return [(i, digest(img.numpy())) for batch in batches for img, i in zip(batch["image"], batch["id"].tolist())]


def test_a_mix_over_a_small_dataset_draws_anew_at_each_read(numbered):
    """36 reads of a dataset of 5 samples (a mix's quota over a small dataset): every read of a sample has its
    own crop."""
    dl = mix_loader(numbered(5))
    dl.set_epoch(0)
    got = mix_reads(dl)
    assert len(got) == 36
    by_sample: dict[int, list[bytes]] = {}
    for i, d in got:
        by_sample.setdefault(i, []).append(d)
    assert min(len(v) for v in by_sample.values()) >= 3
    same = [k for k, v in by_sample.items() if len(set(v)) != len(v)]
    assert not same, f"samples {same} got the same crop on two reads of one epoch"


def test_a_resumed_mix_epoch_gives_each_read_the_crop_it_had(numbered):
    """The same world size (a position) and another one (elastic): each remaining read gets its draws back."""
    a = numbered(5)
    whole = mix_loader(a)
    whole.set_epoch(1)
    reference = mix_reads(whole)

    dl = mix_loader(a)
    dl.set_epoch(1)
    it = iter(dl)
    head = mix_reads([next(it) for _ in range(3)])
    state = dl.state_dict()
    del it
    again = mix_loader(a)
    again.load_state_dict(state)
    assert head + mix_reads(again) == reference

    # elastic: saved by two ranks at batch size 3 after 2 batches each, resumed by one rank at batch size 5
    saved, states = [], []
    for rank in range(2):
        dl = mix_loader(a, batch_size=3, rank=rank, world_size=2)
        dl.set_epoch(1)
        it = iter(dl)
        saved += mix_reads([next(it) for _ in range(2)])
        states.append(dl.state_dict())
        del it
    resumed = mix_loader(a, batch_size=5)
    resumed.load_state_dict(states)
    rest = mix_reads(resumed)
    assert Counter(saved + rest) == Counter(reference)  # every read once, each with the crop it had


# -- torch's DataLoader over a fastload dataset (__getitems__) --------------------------------------
@pytest.mark.parametrize("num_workers", [0, 1])
def test_torch_loader_gives_each_copy_its_own_crop(numbered, num_workers):
    """torch's DataLoader reading a fastload dataset in batches, with a repeated-augmentation sampler on one
    rank: a worker counts a sample's reads of the epoch in its batches -- three copies, three crops."""
    ds = fastload.open(numbered(N), transforms=PIPELINE(), as_dict=True)
    dl = torch.utils.data.DataLoader(
        ds,
        batch_size=4,
        sampler=RepeatSampler(N, 1, 0),
        num_workers=num_workers,
        generator=torch.Generator().manual_seed(0),
    )
    got = reads(dl)
    assert sorted(got) == list(range(N)) and {len(v) for v in got.values()} == {3}
    same = [i for i, images in got.items() if not all_differ(images)]
    assert not same, f"samples {same} got the same crop on two of their three reads"
    # a sampler reading each sample once keeps the pixels of before: each read is a first read
    once = torch.utils.data.DataLoader(
        ds, batch_size=4, sampler=list(range(N)), generator=torch.Generator().manual_seed(0)
    )
    firsts = {i: v[0] for i, v in reads(once).items()}
    with_repeats = torch.utils.data.DataLoader(
        ds, batch_size=4, sampler=RepeatSampler(N, 1, 0, shuffle=False), generator=torch.Generator().manual_seed(0)
    )
    first_reads = {i: v[0] for i, v in reads(with_repeats).items()}
    assert all(np.array_equal(firsts[i], first_reads[i]) for i in range(N))


def test_another_iterator_over_the_dataset_in_between_changes_no_read_of_this_one(numbered):
    """Two torch DataLoader iterators over one fastload dataset in the main process (``num_workers=0``: a training
    loop and an evaluation over the same dataset object, taken in turns): each counts its own reads. The counts
    were kept for the latest iterator alone, so a batch of the other started this one's over, and its next read of
    a sample was again a first read, with the first read's crop."""
    ds = fastload.open(numbered(N), transforms=PIPELINE(), as_dict=True)

    def loader(batches, seed):
        return torch.utils.data.DataLoader(ds, batch_sampler=batches, generator=torch.Generator().manual_seed(seed))

    twice = [[0, 1, 2], [2, 1, 0]]
    alone = [b["image"] for b in loader(twice, 0)]
    it = iter(loader(twice, 0))
    turns = [next(it)["image"]]
    next(iter(loader([[3, 4]], 1)))  # the other iterator's batch, in between
    turns.append(next(it)["image"])
    assert all(not torch.equal(a, b) for a, b in zip(alone[0], alone[1].flip(0)))  # a second read: other crops
    assert torch.equal(alone[0], turns[0])
    assert torch.equal(alone[1], turns[1]), "the second read of samples 2, 1, 0 changed with another iterator between"


def test_bucket_padding_batches_draw_anew():
    """``Bucket``'s order pads its batch list by wrapping to a multiple of the world size: a padding batch is a
    second read of its samples and draws anew; every first read keeps the key of (seed, epoch, index)."""
    from fastload.fast.packing import BucketOrder

    ids = np.array(
        [0, 1, 0, 1, 1, 0, 0, 1, 1, 0, 1, 1]
    )  # buckets of 5 and 7: batches of 2 -> 7 batches, padded to 9 on 3 ranks
    keys: dict[int, list[int]] = {}
    for rank in range(3):
        order = BucketOrder(ids, 2, kind="random", seed=7, world_size=3, rank=rank)
        for b, batch in enumerate(order.batches(2)):
            for i, k in zip(batch.tolist(), order.batch_rng(2, b).samples(batch).keys.tolist()):
                keys.setdefault(i, []).append(k)
    assert sum(len(v) for v in keys.values()) > len(ids)  # some samples are read twice (the padding)
    for i, ks in keys.items():
        assert _old_key(7, 2, i) in ks and len(set(ks)) == len(ks), f"sample {i}: keys {ks}"


def test_bucket_padding_after_loading_another_seed_draws_as_that_seed():
    """A ``Bucket`` order that drew an epoch's padding under one seed, then loaded a state of another seed at that
    epoch, keyed its padding batch by the first seed's batch list (which batches wrap, and their sizes): where the
    sizes differ the batch's draws raised mid-epoch ('1 occurrences for 2 samples'). The loaded order draws as a
    fresh order of the state's seed."""
    from fastload.fast.packing import BucketOrder

    ids = np.array([0, 1, 0, 1, 1, 0, 0, 1, 1, 0, 1, 1])  # 7 batches of up to 2, padded to 9 on 3 ranks
    order = BucketOrder(ids, 2, kind="random", seed=0, world_size=3, rank=1)
    for b, batch in enumerate(order.batches(0)):
        order.batch_rng(0, b).samples(batch)  # this epoch's padding drawn under seed 0
    order.load_state_dict(BucketOrder(ids, 2, kind="random", seed=4, world_size=3, rank=1).state_dict(0, epoch=0))
    fresh = BucketOrder(ids, 2, kind="random", seed=4, world_size=3, rank=1)
    for b, (batch, want) in enumerate(zip(order.batches(0), fresh.batches(0))):
        assert np.array_equal(batch, want)
        assert np.array_equal(order.batch_rng(0, b).samples(batch).keys, fresh.batch_rng(0, b).samples(want).keys)
