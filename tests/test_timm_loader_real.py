"""``fastload.timm.create_loader`` against timm's own ``timm.data.create_loader`` (issue 30 item 1); skipped where
timm does not import (CI: test_timm_loader.py runs stand-ins). In the test-only venv: ``bash
scripts/timm_test_venv.sh``, then ``bench/.venvs/timm/bin/python -m pytest tests/test_timm_loader_real.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("timm.data", reason="timm is not importable here (bash scripts/timm_test_venv.sh)")
import timm.data as td  # noqa: E402
from timm.data.distributed_sampler import OrderedDistributedSampler, RepeatAugSampler  # noqa: E402

import fastload.timm as ft  # noqa: E402
from conftest import make_image_folder  # noqa: E402
from timm_loader_common import assert_same_batches, fast, quietly  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "cache"))
    return str(make_image_folder(tmp_path / "train", classes=3, per_class=4))


def both(root, **kw):
    kw = dict(input_size=32, batch_size=4, num_workers=0, device=CPU) | kw
    ours, said = quietly(ft.create_loader, td.ImageDataset(root), **kw)
    return ours, td.create_loader(td.ImageDataset(root), **kw), said


@pytest.mark.parametrize("use_prefetcher", [True, False])
def test_evaluation_batches_are_timms_on_the_fast_path(root, use_prefetcher):
    ours, theirs, said = both(root, use_prefetcher=use_prefetcher, crop_pct=0.8)
    assert fast(ours) and any("takes the fast path" in s for s in said), said
    assert len(ours) == len(theirs) == 3
    assert_same_batches(ours, theirs)


def test_img_dtype_and_fp16(root):
    for kw, dtype in ((dict(img_dtype=torch.bfloat16), torch.bfloat16), (dict(fp16=True), torch.float16)):
        ours, theirs, _ = both(root, **kw)
        (x, _), (rx, _) = next(iter(ours)), next(iter(theirs))
        assert x.dtype == rx.dtype == dtype


def test_training_with_collate_mixup_and_erasing(root):
    mix = td.FastCollateMixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=3, label_smoothing=0.1)
    ours, theirs, said = both(root, is_training=True, re_prob=1.0, re_mode="pixel", collate_fn=mix)
    assert fast(ours) and any("rounding to uint8" in s for s in said), said
    assert len(ours) == len(theirs) == 3  # drop_last, as timm
    assert type(ours.random_erasing) is type(theirs.random_erasing)
    x, y = next(iter(ours))
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32 and y.shape == (4, 3)
    assert torch.allclose(y.sum(1), torch.ones(4))
    # turned off through the loader, as train.py does at --mixup-off-epoch: labels one-hot, smoothed
    ours.mixup_enabled = False
    assert mix.mixup_enabled is False
    labels = torch.tensor([t for _, t in td.ImageDataset(root).reader.samples])
    for _, y in ours:
        assert torch.allclose(y.max(1).values, torch.full((4,), 0.9 + 0.1 / 3))
        assert set(y.argmax(1).tolist()) <= set(labels.tolist())


def test_the_prefetchers_erasing_stays_timms_saying_why_and_without_it_erasing_is_native(root):
    ours, theirs, said = both(root, is_training=True, re_prob=0.5, re_mode="pixel", re_count=2)
    (note,) = [s for s in said if "stays timm's own object" in s]
    assert "re_mode='pixel', re_count=2" in note and "4x the bytes" in note, note
    assert type(ours.random_erasing) is type(theirs.random_erasing)
    assert vars(ours.random_erasing) == vars(theirs.random_erasing)
    # use_prefetcher=False (what the note offers): timm's per-sample erasing after Normalize, run natively
    ours, said = quietly(ft.create_loader, td.ImageDataset(root), input_size=32, batch_size=4, num_workers=0,
                         device=CPU, is_training=True, re_prob=0.5, re_mode="pixel", re_count=2, use_prefetcher=False)
    assert fast(ours) and not [s for s in said if "stays timm's own object" in s], said
    pipe = ours._packed.pipelines["image"]  # the pack the fast path reads (ours.dataset stays timm's)
    assert [(type(t).__name__, t.mode, t.count) for t in pipe.erase] == [("NoiseErasing", "pixel", (1, 2))]
    assert not pipe.fallback and not pipe.after, pipe
    x, _ = next(iter(ours))
    assert x.dtype == torch.float32 and torch.isfinite(x).all()


def test_training_takes_timms_recipe(root):
    ours, _, _ = both(root, is_training=True, auto_augment="rand-m9-mstd0.5", re_prob=0.25, hflip=0.5)
    names = [type(t).__name__ for t in ours.dataset.transform.transforms]
    assert names[:3] == ["RandomResizedCropAndInterpolation", "RandomHorizontalFlip", "RandAugment"]
    assert names[-1] in ("ToNumpy", "MaybePILToTensor") and ours.random_erasing.probability == 0.25
    x, _ = next(iter(ours))
    assert x.dtype == torch.float32 and torch.isfinite(x).all() and abs(float(x.mean())) < 2


@pytest.fixture
def one_process_group(tmp_path):
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


def test_distributed_samplers_are_timms(root, one_process_group):
    for kw, kind in (
        (dict(is_training=True), torch.utils.data.distributed.DistributedSampler),
        (dict(is_training=True, num_aug_repeats=3), RepeatAugSampler),
        (dict(is_training=False), OrderedDistributedSampler),
    ):
        ours, theirs, _ = both(root, distributed=True, **kw)
        assert type(ours.sampler) is type(theirs.sampler) is kind and fast(ours)
    ours, theirs, _ = both(root, distributed=True)
    assert_same_batches(ours, theirs)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(num_aug_splits=3), "num_aug_splits=3"),
        (dict(input_size_choices=[32, 48]), "input_size_choices"),
        (dict(num_aug_repeats=2), "num_aug_repeats=2"),
        (dict(worker_seeding=lambda w: None), "callable worker_seeding"),
        (dict(use_prefetcher=False, collate_fn=td.FastCollateMixup(num_classes=3)), "use_prefetcher=True"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(root, kw, match):
    with pytest.raises(ValueError, match=match):
        ft.create_loader(td.ImageDataset(root), 32, 4, device=CPU, **kw)


def test_a_custom_collate_is_said_not_dropped(root):
    collate = torch.utils.data.default_collate
    ours, said = quietly(
        ft.create_loader, td.ImageDataset(root), 32, 4, device=CPU, num_workers=0, collate_fn=lambda b: collate(b)
    )
    assert not fast(ours) and any("collate_fn" in s for s in said), said
    theirs = td.create_loader(td.ImageDataset(root), 32, 4, device=CPU, num_workers=0, collate_fn=lambda b: collate(b))
    x, _ = next(iter(ours))
    rx, _ = next(iter(theirs))
    assert np.allclose(x.numpy(), rx.numpy())


def test_the_migration_guides_timm_diff_runs(tmp_path, monkeypatch):
    """docs/guide/migrating.md's "Migrating a timm script" (marked network there: CI has no timm), run here on a
    two-class folder; on a machine without CUDA with device="cpu", and one batch instead of the loop's body."""
    from test_docs import ROOT, blocks, diff_after

    page = ROOT / "docs" / "guide" / "migrating.md"
    (block,) = [b for b in blocks(page) if b.lang == "diff" and "fastload.timm" in b.body]
    script = diff_after(block.body).replace("     ...", "     assert images.shape == (64, 3, 224, 224); break")
    if not torch.cuda.is_available():
        script = script.replace('torch.device("cuda")', 'torch.device("cpu")')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "cache"))
    make_image_folder(tmp_path / "data" / "train", classes=2, per_class=40)
    ns: dict = {}
    _, said = quietly(exec, compile(script, str(page), "exec"), ns)
    assert ns["loader"].loader.fast_path_reason is None and ns["targets"].shape == (64, 2), said
