"""``fastload.timm.create_loader`` with stand-ins for timm (issue 30 item 1): CI has no timm.

The stand-in ``timm.data`` (put in ``sys.modules`` for each test) has what create_loader takes from timm 1.0:
``create_transform`` (the evaluation recipe, Resize + CenterCrop + a uint8 tensor with the prefetcher, or
ToTensor + Normalize without it, as torchvision's stand-ins of tvfolder_common.py; every call's arguments
recorded), ``ImageDataset`` (tvfolder_common.py's), the samplers of ``timm.data.distributed_sampler``,
``RandomErasing`` (a box of zeros per sample, drawn from ``random``) and ``FastCollateMixup``
(timm_mixup_standin.py). The reference is what timm's loader does with them: torch's DataLoader over the same
dataset, then PrefetchLoader's arithmetic. test_timm_loader_real.py runs timm's own create_loader."""

from __future__ import annotations

import random
import sys
import types
import warnings

import pytest
import torch
from PIL import ImageOps

import fastload
import fastload.timm as ft
import tvfolder_common as tvs
from conftest import make_image_folder
from timm_loader_common import assert_same_batches, fast, quietly
from timm_mixup_standin import FastCollateMixup

CPU = torch.device("cpu")
MEAN, STD = ft.IMAGENET_DEFAULT_MEAN, ft.IMAGENET_DEFAULT_STD


class RandomErasing:
    """timm's batch RandomErasing's interface; erases a random box of each sample with zeros."""

    def __init__(self, probability=0.5, mode="const", max_count=None, num_splits=0, device="cuda"):
        self.probability, self.mode, self.max_count = probability, mode, max_count
        self.num_splits, self.device = num_splits, device

    def __call__(self, x):
        for img in x:
            if random.random() < self.probability:
                h, w = img.shape[-2:]
                top, left = random.randint(0, h // 2), random.randint(0, w // 2)
                img[:, top : top + h // 2, left : left + w // 2] = 0
        return x


class OrderedDistributedSampler(torch.utils.data.Sampler):
    def __init__(self, dataset):
        self.n = len(dataset)

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


class RepeatAugSampler(OrderedDistributedSampler):
    def __init__(self, dataset, num_repeats=3):
        super().__init__(dataset)
        self.num_repeats = num_repeats


class Invert:
    """Stands for timm's policies (timm.data.auto_augment), which take PIL images only and have no native
    equivalent: inverts the image (PIL's ImageOps, an AttributeError on a tensor, as timm's ``img.transform``)."""

    __module__ = "timm.data.auto_augment"

    def __call__(self, img):
        return ImageOps.invert(img)


@pytest.fixture
def timm(monkeypatch, tmp_path):
    """The stand-in timm (``calls``: create_transform's arguments) and a folder of JPEGs."""
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def create_transform(input_size, use_prefetcher=False, mean=MEAN, std=STD, crop_pct=None, **kw):
        calls.append(dict(input_size=input_size, use_prefetcher=use_prefetcher, crop_pct=crop_pct, **kw))
        size = input_size if isinstance(input_size, int) else input_size[-1]
        tail = [tvs.PILToTensor()] if use_prefetcher else [tvs.ToTensor(), tvs.Normalize(mean, std)]
        policy = [Invert()] if kw.get("auto_augment") == "invert" else []
        return tvs.Compose([tvs.Resize(int(size / (crop_pct or 0.875))), tvs.CenterCrop(size), *policy, *tail])

    pkg, data = types.ModuleType("timm"), types.ModuleType("timm.data")
    data.create_transform, data.ImageDataset, data.FastCollateMixup = (
        create_transform,
        tvs.ImageDataset,
        FastCollateMixup,
    )
    sampler, erasing = types.ModuleType("timm.data.distributed_sampler"), types.ModuleType("timm.data.random_erasing")
    sampler.OrderedDistributedSampler, sampler.RepeatAugSampler = OrderedDistributedSampler, RepeatAugSampler
    erasing.RandomErasing = RandomErasing
    pkg.data, data.distributed_sampler, data.random_erasing = data, sampler, erasing
    for name, mod in (("timm", pkg), ("timm.data", data), ("timm.data.distributed_sampler", sampler)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setitem(sys.modules, "timm.data.random_erasing", erasing)
    data.calls = calls
    data.root = str(make_image_folder(tmp_path / "train", classes=3, per_class=4))
    return data


def reference(timm, **kw):
    """timm's create_loader over the stand-ins: torch's DataLoader, then PrefetchLoader's arithmetic."""
    ds = timm.ImageDataset(timm.root, transform=timm.create_transform(32, use_prefetcher=True, **kw))
    mean = torch.tensor([m * 255 for m in MEAN]).view(1, 3, 1, 1)
    std = torch.tensor([s * 255 for s in STD]).view(1, 3, 1, 1)
    for x, y in torch.utils.data.DataLoader(ds, batch_size=4):
        yield x.float().sub_(mean).div_(std), y


def create(timm, **kw):
    kw = dict(input_size=32, batch_size=4, num_workers=0, device=CPU) | kw
    return quietly(ft.create_loader, timm.ImageDataset(timm.root), **kw)


def test_evaluation_batches_are_timms_on_the_fast_path(timm):
    loader, said = create(timm, crop_pct=0.8)
    assert isinstance(loader, ft.PrefetchLoader) and fast(loader), said
    assert len(loader) == 3 and loader.dataset.transform is not None
    assert_same_batches(loader, reference(timm, crop_pct=0.8))


def test_without_the_prefetcher_it_is_the_fastload_loader(timm):
    loader, _ = create(timm, use_prefetcher=False)
    assert isinstance(loader, fastload.DataLoader) and fast(loader)
    assert_same_batches(loader, reference(timm))


def test_create_transform_gets_timms_arguments(timm):
    create(timm, is_training=True, re_prob=0.3, re_split=True, scale=(0.5, 1.0), hflip=0.0, auto_augment="rand-m9")
    (got,) = timm.calls
    want = dict(is_training=True, re_prob=0.3, re_num_splits=2, scale=(0.5, 1.0), hflip=0.0, auto_augment="rand-m9")
    assert {k: got[k] for k in want} == want and got["use_prefetcher"] is True and got["separate"] is False
    assert "color_jitter_prob" not in got  # timm's newer arguments only when set, for an earlier timm 1.0
    create(timm, color_jitter_prob=0.8)
    assert timm.calls[-1]["color_jitter_prob"] == 0.8


def test_mixup_runs_before_erasing_on_the_normalized_batch(timm):
    """timm mixes while collating, then normalizes and erases: an erased box stays exact zeros."""
    mix = FastCollateMixup(mixup_alpha=1.0, num_classes=3)
    loader, said = create(timm, is_training=True, re_prob=1.0, collate_fn=mix)
    assert fast(loader) and any("rounding to uint8" in s for s in said)
    assert isinstance(loader.random_erasing, RandomErasing) and loader.random_erasing.device == CPU
    random.seed(0)
    x, y = next(iter(loader))
    assert y.shape == (4, 3) and not torch.equal(y.max(1).values, torch.full((4,), 0.9 + 0.1 / 3))
    zeros = (x == 0).flatten(1).sum(1)
    assert (zeros >= 3 * 16 * 16).all(), zeros  # each sample's 16x16 box, after the blend
    loader.mixup_enabled = False
    assert mix.mixup_enabled is False and loader.mixup_enabled is False


def test_the_prefetchers_erasing_says_once_why_it_stays_timms(timm):
    """timm erases after the device copy and normalization (and after the collate's mixup): fastload's native
    erasing, in the fill stage before the copy, cannot take its place; said once per loader, with the reason."""
    stays = "stays timm's own object"
    _, said = create(timm, is_training=True, re_prob=0.25)
    (note,) = [s for s in said if stays in s]
    assert "re_prob=0.25, re_mode='const', re_count=1" in note and "4x the bytes" in note, note
    assert "FastCollateMixup" not in note and "re_split" not in note and "use_prefetcher=False" in note, note
    _, said = create(timm, is_training=True, re_prob=1.0, re_split=True, collate_fn=FastCollateMixup(num_classes=3))
    (note,) = [s for s in said if stays in s]
    assert "mixed (FastCollateMixup) before it is erased" in note and "first 1/2 of each batch" in note, note
    for kw in (dict(re_prob=0.0), dict(re_prob=0.25, use_prefetcher=False), dict(re_prob=0.25, no_aug=True)):
        _, said = create(timm, is_training=True, **kw)
        assert not [s for s in said if stays in s], (kw, said)
    _, said = create(timm, re_prob=0.25)  # evaluation: no erasing
    assert not [s for s in said if stays in s], said


def test_img_dtype(timm):
    for kw, dtype in ((dict(img_dtype=torch.bfloat16), torch.bfloat16), (dict(fp16=True), torch.float16)):
        loader, _ = create(timm, **kw)
        assert next(iter(loader))[0].dtype == dtype


def test_evaluation_under_distributed_uses_timms_ordered_sampler(timm):
    loader, _ = create(timm, distributed=True)
    assert isinstance(loader.sampler, OrderedDistributedSampler) and fast(loader)
    assert_same_batches(loader, reference(timm))


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(num_aug_splits=3), "num_aug_splits=3"),
        (dict(input_size_choices=[32, 48]), "input_size_choices"),
        (dict(num_aug_repeats=2), "num_aug_repeats=2"),
        (dict(worker_seeding=lambda w: None), "callable worker_seeding"),
        (dict(worker_seeding="some"), "worker_seeding='some'"),
        (dict(use_prefetcher=False, collate_fn=FastCollateMixup(num_classes=3)), "use_prefetcher=True"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(timm, kw, match):
    with pytest.raises(ValueError, match=match):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ft.create_loader(timm.ImageDataset(timm.root), 32, 4, device=CPU, **kw)


def test_a_custom_collate_keeps_torchs_path_and_says_so(timm):
    loader, said = create(timm, collate_fn=lambda b: torch.utils.data.default_collate(b))
    assert not fast(loader) and any("collate_fn" in s for s in said), said
    loader, said = create(timm, collate_fn=lambda b: torch.utils.data.default_collate(b), use_multi_epochs_loader=True)
    assert any("use_multi_epochs_loader=True is not kept" in s for s in said), said


def test_without_timm_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)
    monkeypatch.setitem(sys.modules, "timm.data", None)
    with pytest.raises(ImportError, match="pip install timm"):
        ft.create_loader(object(), 32, 4)


def test_a_transform_that_does_not_convert_runs_per_sample_on_the_fast_path(timm):
    """timm's policies (the DeiT recipe's RandAugment) run per sample on the pack's decoded images, where
    fastload.DataLoader given the folder dataset would keep torch's path; the batches are timm's."""
    loader, said = create(timm, auto_augment="invert")
    assert fast(loader) and any("runs per sample" in s and "Invert" in s for s in said), said
    assert isinstance(loader.dataset, tvs.ImageDataset)  # the prefetching loader's dataset stays timm's
    _, said = quietly(assert_same_batches, loader, reference(timm, auto_augment="invert"))
    assert any("run per sample" in s for s in said), said  # the pipeline's own note, with the cost
