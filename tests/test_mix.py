"""``fastload.mix``: several packed datasets sampled by weight, on the fast path (``_front/mix.py``, ``fast/mixing.py``).

Every sample carries a ``tag``: its dataset's base (0, 1000, 2000) plus its index there, so a batch says which
dataset and which sample each of its rows came from."""

from __future__ import annotations

import io
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload import transforms as T
from fastload.fast.mixing import Mixing

from conftest import jpeg_bytes

FIXED = {"image": [T.Resize((16, 16))]}
RANDOM = {"image": [T.RandomResizedCrop(16), T.RandomHorizontalFlip()]}


class Tagged(torch.utils.data.Dataset):
    """``n`` samples of small pictures whose ``tag`` is ``base + i``; ``names`` renames the three fields."""

    def __init__(self, n: int, base: int, names=("image", "label", "tag"), label=int):
        self.n, self.base, self.names, self.label = n, base, names, label

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        from PIL import Image

        image = Image.open(io.BytesIO(jpeg_bytes(18 + i % 5, 20 + i % 3, seed=self.base + i)))
        return dict(zip(self.names, (image, self.label(i % 3), self.base + i)))


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mix")
    sources = {
        "a": Tagged(24, 0),
        "b": Tagged(7, 1000),
        "renamed": Tagged(5, 2000, names=("img", "y", "tag")),
        "float_label": Tagged(4, 3000, label=float),
        "no_tag": Tagged(4, 4000, names=("image", "label", "other")),
    }
    for name, src in sources.items():
        fastload.pack(src, root / name, workers=0, shard_size="4K")
    return {name: root / name for name in sources}


def opened(packed, *names, transforms=FIXED, **kw):
    """The datasets ``names`` opened with the same ``transforms`` (dataset "renamed" calls its image "img")."""
    return {
        n: fastload.open(packed[n], transforms={("img" if n == "renamed" else k): v for k, v in transforms.items()},
                         **kw)
        for n in names
    }


def tags(loader) -> list[int]:
    return [int(t) for batch in loader for t in batch[2]]


def strict_loader(ds, **kw) -> fastload.DataLoader:
    """A loader made with every warning an error: the fast path, not the generic one with a FastPathWarning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dl = fastload.DataLoader(ds, **kw)
    assert dl.fast_path, dl.fast_path_reason
    return dl


# -- the draw ---------------------------------------------------------------------------------------
def test_each_epoch_takes_each_datasets_quota_and_small_datasets_restart_with_a_new_permutation():
    m = Mixing(["a", "b", "c"], [1000, 7, 50], [0.5, 0.3, 0.2], num_samples=1001)
    assert m.quotas.tolist() == [501, 300, 200]  # 500.5, 300.3, 200.2: the one left over to the largest remainder
    assert Mixing(["x", "y", "z"], [9, 9, 9], [0.2, 0.5, 0.3], 1001).quotas.tolist() == [200, 501, 300]
    for epoch in range(3):
        seq = m.sequence("random", 5, epoch)
        assert np.bincount(m.dataset_of(seq), minlength=3).tolist() == [501, 300, 200]
        # dataset b (7 samples, 300 a epoch): each pass of its stream is a permutation of all 7, a new one each time
        b = seq[m.dataset_of(seq) == 1] - m.offsets[1]
        first = epoch * 300
        for p in range(first // 7 + 1, (first + 300) // 7):  # the passes wholly inside this epoch
            one = b[p * 7 - first : (p + 1) * 7 - first]
            assert sorted(one.tolist()) == list(range(7))
        passes = {tuple(b[k : k + 7].tolist()) for k in range(7 - first % 7, 280, 7)}
        assert len(passes) > 20  # not the same permutation every pass
    # dataset a (1000 samples, 501 an epoch): epochs 0 and 1 go on through one pass, then the next begins
    both = np.concatenate([m.sequence("random", 5, e) for e in (0, 1)])
    a = both[m.dataset_of(both) == 0]
    assert sorted(a[:1000].tolist()) == list(range(1000)) and len(a) == 1002


def test_the_interleave_spreads_each_datasets_share_over_the_epoch():
    """Weights hold in every part of an epoch, not only in its total: the first 500 positions' counts are within
    a 5-sigma hypergeometric bound of their share (random), or within one sample of it (sequential)."""
    m = Mixing(["a", "b"], [5000, 5000], [0.8, 0.2], num_samples=2000)
    for epoch in range(4):
        head = m.dataset_of(m.sequence("random", 11, epoch)[:500])
        from_b = int((head == 1).sum())
        sigma = math.sqrt(500 * 0.2 * 0.8 * (1500 / 1999))
        assert abs(from_b - 100) < 5 * sigma, from_b
        even = m.dataset_of(m.sequence("sequential", 0, epoch))
        for k in range(1, 21):
            assert abs(int((even[: k * 100] == 1).sum()) - k * 20) <= 1


def test_the_loader_honours_the_weights_and_counts_each_dataset_in_stats(packed):
    ds = opened(packed, "a", "b")
    mixed = fastload.mix(ds, weights={"a": 1, "b": 3}, num_samples=40)
    dl = strict_loader(mixed, batch_size=8, shuffle=True, seed=2)
    got = tags(dl)
    from_b = sum(t >= 1000 for t in got)
    assert (len(got), from_b) == (40, 30)  # 40 * 3/4 from b, 7 samples repeated over 4+ passes
    assert dl.stats()["mix"] == {"a": 10, "b": 30}
    assert sorted({t for t in got if t >= 1000}) == list(range(1000, 1007))
    next(iter(dl))  # counts are of the batches handed out, across epochs
    assert sum(dl.stats()["mix"].values()) == 48
    assert fastload.DataLoader(ds["a"], batch_size=4).stats()["mix"] is None


def test_default_weights_follow_the_sizes_and_an_epoch_is_the_total(packed):
    mixed = fastload.mix(opened(packed, "a", "b"))
    assert len(mixed) == 31 and mixed.mixing.quotas.tolist() == [24, 7]
    got = tags(strict_loader(mixed, batch_size=5, shuffle=True, seed=0))
    assert sorted(got) == list(range(24)) + list(range(1000, 1007))  # an epoch of a concatenation: each once


# -- determinism and resume ---------------------------------------------------------------------------
def images_and_tags(loader) -> tuple[torch.Tensor, list[int]]:
    batches = [(b[0].clone(), b[2].clone()) for b in loader]
    return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches]).tolist()


def test_the_same_seed_gives_the_same_batches_at_any_num_workers(packed):
    def run(workers: int, seed: int = 7):
        mixed = fastload.mix(opened(packed, "a", "b", transforms=RANDOM), [2, 1], num_samples=30)
        dl = strict_loader(mixed, batch_size=4, shuffle=True, seed=seed, num_workers=workers)
        dl.set_epoch(1)
        return images_and_tags(dl)

    images, order = run(0)
    for workers in (1, 2):
        again, again_order = run(workers)
        assert again_order == order
        assert torch.equal(again, images)
    assert run(0, seed=8)[1] != order
    # the mix's own seed keys the draw: the loader's seed then keys the augmentation only
    mixed = fastload.mix(opened(packed, "a", "b", transforms=RANDOM), [2, 1], num_samples=30, seed=123)
    one = tags(strict_loader(mixed, batch_size=4, shuffle=True, seed=1))
    two = tags(strict_loader(mixed, batch_size=4, shuffle=True, seed=2))
    assert one == two and one != tags(strict_loader(fastload.mix(
        opened(packed, "a", "b", transforms=RANDOM), [2, 1], num_samples=30, seed=124), batch_size=4, shuffle=True,
        seed=1))


def test_resume_mid_epoch_gives_what_the_uninterrupted_run_gives(packed):
    """Epochs 0, 1, 2 uninterrupted; and epoch 0, three batches of epoch 1, the state loaded into a new loader (another
    num_workers) which finishes epoch 1 and runs epoch 2: the same samples, the same pixels (each dataset's stream
    goes on across epochs, so epoch 1 must not depend on the loader having run epoch 0)."""

    def make(workers: int):
        mixed = fastload.mix(opened(packed, "a", "b", transforms=RANDOM), {"a": 1, "b": 1}, num_samples=36)
        return strict_loader(mixed, batch_size=4, shuffle=True, seed=5, num_workers=workers)

    reference = make(0)
    epochs = [images_and_tags(reference) for _ in range(3)]
    dl = make(0)
    images_and_tags(dl)
    it = iter(dl)
    for _ in range(3):
        next(it)
    state = dl.state_dict()
    del it
    resumed = make(2)
    resumed.load_state_dict(state)
    images, got = images_and_tags(resumed)
    assert got == epochs[1][1][12:]
    assert torch.equal(images, epochs[1][0][12:])
    images, got = images_and_tags(resumed)
    assert got == epochs[2][1] and torch.equal(images, epochs[2][0])
    # another mix (other weights) refuses the position, naming it
    other = strict_loader(fastload.mix(opened(packed, "a", "b", transforms=RANDOM), {"a": 1, "b": 2},
                                       num_samples=36), batch_size=4, shuffle=True, seed=5)
    with pytest.raises(ValueError, match="saved by a loader with a mix of 'a': 24 samples, 18 an epoch; 'b': 7 "
                                         "samples, 18 an epoch.*this loader has a mix of 'a': 24 samples, 12 an"):
        other.load_state_dict(state)


def test_ranks_take_disjoint_shares_that_make_up_the_epoch(packed):
    def rank(r: int, world: int = 2) -> list[int]:
        mixed = fastload.mix(opened(packed, "a", "b"), [1, 1], num_samples=30)
        return tags(strict_loader(mixed, batch_size=4, shuffle=True, seed=9, rank=r, world_size=world))

    whole = rank(0, 1)
    zero, one = rank(0), rank(1)
    assert len(zero) == len(one) == 15
    assert sorted(zero + one) == sorted(whole)  # together the epoch's sequence, each position once
    # disjoint positions: rank r takes positions r, r + 2, ... of the epoch's sequence
    assert zero == whole[0::2] and one == whole[1::2]
    # the same order for another rank (what fastload.accelerate does to a loader it prepares)
    from fastload._front.loader import retarget

    moved = strict_loader(fastload.mix(opened(packed, "a", "b"), [1, 1], num_samples=30), batch_size=4, shuffle=True,
                          seed=9, rank=0, world_size=2)
    retarget(moved, 1, 2)
    assert tags(moved) == one


# -- fields -------------------------------------------------------------------------------------------------
def test_fields_renames_a_datasets_fields_to_the_mix(packed):
    ds = opened(packed, "a", "renamed", as_dict=True)
    with pytest.raises(ValueError, match="dataset 'renamed' has no field 'image'"):
        fastload.mix(ds)
    mixed = fastload.mix(ds, fields={"renamed": {"img": "image", "y": "label"}}, weights=[1, 1], num_samples=12)
    assert mixed.schema.names == ("image", "label", "tag")
    seen = 0
    for batch in strict_loader(mixed, batch_size=4, shuffle=True, seed=0):
        assert set(batch) == {"image", "label", "tag"}
        for k, tag in enumerate(batch["tag"].tolist()):
            name, base = ("renamed", 2000) if tag >= 2000 else ("a", 0)
            sample = ds[name][tag - base]
            image, label = (sample["img"], sample["y"]) if name == "renamed" else (sample["image"], sample["label"])
            assert torch.equal(batch["image"][k], image)
            assert int(batch["label"][k]) == label
            seen += name == "renamed"
    assert seen == 6
    one = mixed[24 + 3]  # mix[i]: the concatenation, in the mix's names
    assert one["tag"] == 2003 and torch.equal(one["image"], ds["renamed"][3]["img"])


def test_a_field_can_be_left_out(packed):
    ds = opened(packed, "a", "no_tag")
    with pytest.raises(ValueError, match="dataset 'no_tag' has field 'other'.*fields=\\{'no_tag': \\{'other': None"):
        fastload.mix({"a": ds["a"], "no_tag": ds["no_tag"]}, fields={"a": {"tag": None}})
    mixed = fastload.mix(ds, fields={"a": {"tag": None}, "no_tag": {"other": None}})
    assert mixed.schema.names == ("image", "label")
    batch = next(iter(strict_loader(mixed, batch_size=4)))
    assert len(batch) == 2


# -- refusals ---------------------------------------------------------------------------------------------------
def test_what_cannot_mix_is_refused_at_construction_by_name(packed):
    ds = opened(packed, "a", "b", "float_label", "no_tag")
    a, b = ds["a"], ds["b"]
    with pytest.raises(ValueError, match="dataset 'float_label' field 'label' is kind float.*'a''s is kind int"):
        fastload.mix({"a": a, "float_label": ds["float_label"]})
    with pytest.raises(ValueError, match="dataset 'no_tag' has no field 'tag'"):
        fastload.mix({"a": a, "no_tag": ds["no_tag"]})
    other = fastload.open(packed["b"], transforms={"image": [T.Resize((20, 20))]})
    with pytest.raises(ValueError, match=r"dataset 'b' transforms\['image'\] are .*same transforms for field 'image'"):
        fastload.mix({"a": a, "b": other})
    def normalized(mean):  # the same pipeline up to Normalize: each dataset's batches must get its own
        return fastload.open(packed["b"], transforms={"image": [*FIXED["image"], T.ToDtype(torch.float32, scale=True),
                                                               T.Normalize(mean, [0.5] * 3)]})

    fastload.mix({"b": normalized([0.5] * 3), "c": normalized([0.5] * 3)})
    with pytest.raises(ValueError, match=r"dataset 'c' transforms\['image'\] are .*same transforms for field 'image'"):
        fastload.mix({"b": normalized([0.5] * 3), "c": normalized([0.4] * 3)})
    with pytest.raises(ValueError, match="dataset 'b' was opened with as_dict=True"):
        fastload.mix({"a": a, "b": fastload.open(packed["b"], transforms=FIXED, as_dict=True)})
    with pytest.raises(ValueError, match="renames field 'img', which dataset 'b' does not have"):
        fastload.mix({"a": a, "b": b}, fields={"b": {"img": "image"}})
    with pytest.raises(ValueError, match="fields= names dataset 'c'"):
        fastload.mix({"a": a, "b": b}, fields={"c": {}})
    with pytest.raises(ValueError, match="two fields named 'label'"):
        fastload.mix({"a": a, "b": b}, fields={"b": {"tag": "label"}})
    with pytest.raises(ValueError, match="weights should name every dataset once.*missing \\['b'\\]"):
        fastload.mix({"a": a, "b": b}, weights={"a": 1})
    with pytest.raises(ValueError, match="the weight of dataset 'b' is -1"):
        fastload.mix({"a": a, "b": b}, weights=[1, -1])
    with pytest.raises(ValueError, match="every weight is 0"):
        fastload.mix({"a": a, "b": b}, weights=[0, 0])
    with pytest.raises(ValueError, match="3 weights for 2 datasets"):
        fastload.mix({"a": a, "b": b}, weights=[1, 1, 1])
    with pytest.raises(ValueError, match="num_samples=0"):
        fastload.mix({"a": a, "b": b}, num_samples=0)
    with pytest.raises(TypeError, match="dataset 'b' is a list, not a fastload.Dataset"):
        fastload.mix({"a": a, "b": []})
    padded = fastload.open(packed["b"], transforms=FIXED, batch_transforms={("image", "label"): T.CutMix(num_classes=3)})
    with pytest.raises(ValueError, match="dataset 'b' has batch_transforms of its own"):
        fastload.mix({"a": a, "b": padded})


def test_the_loader_refuses_what_would_lose_the_weights(packed):
    mixed = fastload.mix(opened(packed, "a", "b"), [1, 1])
    with pytest.raises(ValueError, match="a fastload.mix draws its samples by weight in its own order"):
        fastload.DataLoader(mixed, batch_size=4, sampler=torch.utils.data.RandomSampler(mixed))
    with pytest.raises(ValueError, match="order='quasi' for a mix"):
        fastload.DataLoader(mixed, batch_size=4, order="quasi")
    with pytest.raises(ValueError, match="split='shards' cannot apply to a mix"):
        fastload.DataLoader(mixed, batch_size=4, split="shards", rank=0, world_size=2)


def test_the_generic_path_draws_the_same_sequence(packed):
    """A loader that cannot take the fast path (a collate_fn of the user's) says so and still draws by weight,
    the same samples as the fast path."""
    mixed = fastload.mix(opened(packed, "a", "b"), [1, 3], num_samples=20)
    fast = tags(strict_loader(mixed, batch_size=4, shuffle=True, seed=4))
    with pytest.warns(fastload.FastPathWarning):
        generic = fastload.DataLoader(mixed, batch_size=4, shuffle=True, seed=4,
                                      collate_fn=lambda items: torch.tensor([s[2] for s in items]))
    got = [int(t) for b in generic for t in b]
    assert got == fast and sum(t >= 1000 for t in got) == 15


def test_a_remote_member_is_read_through_its_cache(packed, tmp_path):
    remote = fastload.open("file://" + str(packed["b"]), transforms=FIXED, cache_dir=tmp_path / "cache")
    mixed = fastload.mix({"a": fastload.open(packed["a"], transforms=FIXED), "b": remote}, [1, 1], num_samples=20)
    assert mixed.remote
    dl = strict_loader(mixed, batch_size=4, shuffle=True, seed=0)
    got = tags(dl)
    local = tags(strict_loader(fastload.mix(opened(packed, "a", "b"), [1, 1], num_samples=20), batch_size=4,
                               shuffle=True, seed=0))
    assert got == local
    stats = dl.stats()["remote"]["b"]
    assert stats["downloads"] == len(remote.reader.sizes)
    # the remote member's read plan was fed that member's samples of each batch, in its own indices, in order
    fed = []
    real = remote.read_plan

    def spy(batches):
        def seen():
            for b in batches:
                fed.append(np.asarray(b).tolist())
                yield b

        return real(seen())

    # ranks of a remote dataset read whole shards each by default (split='shards'): not a mix's, and it says so
    with pytest.warns(RuntimeWarning, match="cannot apply here \\(a mix draws its samples across datasets by weight"):
        fastload.DataLoader(mixed, batch_size=4, shuffle=True, seed=0, rank=0, world_size=2)
    remote.read_plan = spy
    dl = strict_loader(mixed, batch_size=4, shuffle=True, seed=0)
    wanted = [[t - 1000 for t in batch[2].tolist() if t >= 1000] for batch in dl]
    assert fed == wanted


def test_batch_transforms_mix_the_mixes_batches(packed):
    mixed = fastload.mix(opened(packed, "a", "b"), [1, 1], num_samples=8,
                         batch_transforms={("image", "label"): T.CutMix(num_classes=3)})
    image, label, tag = next(iter(strict_loader(mixed, batch_size=8, shuffle=True, seed=0)))
    assert label.shape == (8, 3) and label.dtype == torch.float32  # soft labels: CutMix ran
    assert image.shape == (8, 3, 16, 16)


def test_a_mix_pickles_and_serves_torchs_own_loader(packed):
    import pickle

    mixed = fastload.mix(opened(packed, "renamed", "a"), fields={"renamed": {"img": "image", "y": "label"}})
    again = pickle.loads(pickle.dumps(mixed))
    for i in (0, 4, 5, 28):
        assert torch.equal(again[i][0], mixed[i][0]) and again[i][2] == mixed[i][2]
    batch = next(iter(torch.utils.data.DataLoader(again, batch_size=6)))  # Dataset.__getitems__: one native batch
    assert batch[2].tolist() == [2000, 2001, 2002, 2003, 2004, 0]
    assert torch.equal(batch[0][5], mixed[5][0])


def test_num_workers_auto_measures_a_mix(packed, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the measured choice is cached per dataset: here
    mixed = fastload.mix(opened(packed, "a", "b"), [1, 1], num_samples=16)
    dl = strict_loader(mixed, batch_size=4, shuffle=True, seed=0, num_workers="auto")
    assert isinstance(dl.num_workers, int) and len(tags(dl)) == 16


def test_a_mix_of_fixed_size_columns_is_counted_when_its_batches_are_filled_in_groups(tmp_path):
    # no image, no random transform: the fast path fills several batches per native call (fast/group.py); each
    # batch of a group must still carry its own indices to the per-dataset counts
    from fastload.fast.group import GroupFill

    for name, base, n in (("a", 0, 24), ("b", 1000, 7)):
        rows = [{"label": i % 3, "tag": base + i} for i in range(n)]
        fastload.pack(rows, tmp_path / name, workers=0)
    ds = {n: fastload.open(tmp_path / n, as_dict=True) for n in ("a", "b")}
    dl = strict_loader(fastload.mix(ds, weights={"a": 1, "b": 3}, num_samples=40), batch_size=4, shuffle=True)
    it = iter(dl)
    got = [int(t) for batch in it for t in batch["tag"]]
    assert any(isinstance(s, GroupFill) for s in _stages(it)), "the batches were not filled in groups"
    assert (len(got), sum(t >= 1000 for t in got)) == (40, 30)
    assert dl.stats()["mix"] == {"a": 10, "b": 30}


def _stages(it) -> list:
    """The stages of a fast iterator's chain, followed through their ``source``."""
    found, stage = [], it
    while stage is not None:
        found.append(stage)
        stage = getattr(stage, "source", None)
    return found


def test_a_mix_resumes_elastically_on_other_ranks_and_batch_size(packed):
    """A mix's position saved by 2 ranks at batch size 4 goes on over 3 ranks at batch size 3: what was read before
    and after makes up the epoch's draw (dataset b repeated in it) with only the new split's padding more, and each
    read keeps its pixels (keyed by seed, epoch, its index in the mix and which read of it in the epoch it is)."""
    from collections import Counter

    def loader(rank, world, batch, seed=5):
        mixed = fastload.mix(opened(packed, "a", "b", transforms=RANDOM), {"a": 1, "b": 2}, num_samples=29)
        return strict_loader(mixed, batch_size=batch, shuffle=True, seed=seed, rank=rank, world_size=world)

    images, tags = images_and_tags(loader(0, 1, 29))  # the epoch's whole draw, one rank
    pixels: dict = {}  # each tag's images, one per read of it in the epoch (a repeated read draws anew)
    for i, t in enumerate(tags):
        pixels.setdefault(t, []).append(images[i])
    before, states, unmatched = [], [], 0
    for r in range(2):
        dl = loader(r, 2, 4)
        it = iter(dl)
        for _ in range(2):
            before += next(it)[2].tolist()
        states.append(dl.state_dict())
        del it
    after = []
    for r in range(3):
        dl = loader(r, 3, 3, seed=6)
        with pytest.warns(UserWarning, match="state's seed=5"):
            dl.load_state_dict(states[r % 2])
        got_images, got = images_and_tags(dl)
        after += got
        unmatched += sum(not any(torch.equal(got_images[i], p) for p in pixels[t]) for i, t in enumerate(got))
    extra = Counter(before) + Counter(after) - Counter(tags)
    assert Counter(tags) - Counter(before) - Counter(after) == Counter(), "a draw of the epoch was never read"
    assert sum(extra.values()) < 3  # the new split's padding: fewer than one per rank
    assert unmatched <= sum(extra.values())  # only a padding read (one more read of its sample) has new pixels
