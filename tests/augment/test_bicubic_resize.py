"""Bicubic and per-sample random-interpolation crops (issue 30 item 1: timm's
``RandomResizedCropAndInterpolation(interpolation='random' | 'bicubic')``, torchvision's bicubic ``Resize``).

The crop plan carries each sample's resize (``Plan.interp``: 0 bilinear, 1 bicubic); the native decoder resizes
with PIL's antialiased bicubic (csrc/resize.cc, checked against PIL in tests/native/test_resize.py), fused with the
augmentation too; ``'random'`` draws bilinear or bicubic per sample from its (seed, epoch, index) key, after the
crop's draws; the GPU decoders refuse it when made."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import fastload.transforms as T
from fastload import decoders
from fastload._fill.batcher import beyond_geometry
from fastload._draws import SampleDraws
from fastload.decoders._base import BICUBIC_RESIZE, ImageSources, check_augment
from fastload.decoders.native import NativeDecoder
from fastload.formats._layout import IMAGE_RAW


def pictures(n, seed=0):
    """Gradients with noise on top (bicubic and bilinear differ by several levels on them), of varied sizes."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        h, w = int(rng.integers(30, 90)), int(rng.integers(30, 90))
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 255 / w, y * 255 / h, 128 + 90 * np.sin((x + y) / 5.0)], -1)
        out.append(np.clip(base + rng.normal(0, 40, base.shape), 0, 255).astype(np.uint8))
    return out


def pil_resize(img, crop, out_hw, interp):
    top, left, h, w = (int(v) for v in crop)
    mode = Image.Resampling.BICUBIC if interp else Image.Resampling.BILINEAR
    box = Image.fromarray(img).crop((left, top, left + w, top + h))
    return np.asarray(box.resize((int(out_hw[1]), int(out_hw[0])), mode)).astype(np.int32)


def test_random_interpolation_is_drawn_per_sample_by_its_key_after_the_crop():
    n = 4000
    h, w = np.full(n, 100), np.full(n, 120)
    rand = T.ImagePipeline([T.RandomResizedCrop(32, interpolation="random")])
    plan = rand.plan(h, w, SampleDraws(7, 0, np.arange(n)))
    assert plan.interp.dtype == np.uint8 and set(np.unique(plan.interp)) == {0, 1}
    assert abs(plan.interp.mean() - 0.5) < 0.03  # timm's random.choice of two: 1/2 each (sd 0.008 here)
    idx = np.random.default_rng(1).permutation(n)[:64]  # the same samples in another batch: the same draws
    sub = rand.plan(h[:64], w[:64], SampleDraws(7, 0, idx))
    assert np.array_equal(sub.interp, plan.interp[idx]) and np.array_equal(sub.crops, plan.crops[idx])
    # drawn after the crop: a bilinear pipeline's crops are the same, and it carries no interp (nothing changes)
    bilinear = T.ImagePipeline([T.RandomResizedCrop(32)]).plan(h, w, SampleDraws(7, 0, np.arange(n)))
    assert np.array_equal(bilinear.crops, plan.crops) and bilinear.interp is None
    bicubic = T.ImagePipeline([T.RandomResizedCrop(32, interpolation="bicubic")]).plan(h, w, np.random.default_rng(0))
    assert (bicubic.interp == 1).all()
    assert (T.ImagePipeline([T.Resize(20, interpolation="bicubic")]).plan(h[:3], w[:3], None).interp == 1).all()
    assert np.array_equal(plan.take(5, 9).interp, plan.interp[5:9])


@pytest.mark.parametrize("fused", [False, True], ids=["decode_batch", "decode_augment_batch"])
def test_the_native_decoder_resizes_each_sample_as_pil_does_with_its_interpolation(fused):
    imgs = pictures(40)
    steps = [T.RandomResizedCrop(24, scale=(0.2, 1.0), interpolation="random")]
    if fused:
        steps.append(T.RandomVerticalFlip(1.0))  # an augmentation: the decode runs fused with it
    plan = T.ImagePipeline(steps).plan(
        np.array([i.shape[0] for i in imgs]), np.array([i.shape[1] for i in imgs]), SampleDraws(3, 1, np.arange(40))
    )
    assert (plan.augment is not None) is fused and 10 < plan.interp.sum() < 30
    src = ImageSources.from_bytes([i.tobytes() for i in imgs], [i.shape[:2] for i in imgs], IMAGE_RAW)
    out = np.zeros((40, 24, 24, 3), np.uint8)
    assert NativeDecoder(dct_scaling=False).decode(src, plan, out) == []
    for k, img in enumerate(imgs):
        ref = pil_resize(img, plan.crops[k], plan.out_hw[k], plan.interp[k])
        ref = ref[::-1] if fused else ref
        ref = ref[:, ::-1] if plan.flips[k] else ref
        diff = np.abs(out[k].astype(np.int32) - ref)
        assert diff.max() <= 1 and diff.mean() <= 0.05, (k, int(plan.interp[k]), diff.max(), diff.mean())


def test_apply_pil_resizes_with_the_plans_interpolation():
    img = pictures(1, seed=4)[0]
    for mode, code in (("bicubic", 1), ("bilinear", 0)):
        pipe = T.ImagePipeline([T.RandomResizedCrop(20, interpolation=mode)])
        got = np.asarray(T.apply_pil(pipe, Image.fromarray(img), np.random.default_rng(2)))
        plan = pipe.plan(np.array([img.shape[0]]), np.array([img.shape[1]]), np.random.default_rng(2))
        ref = pil_resize(img, plan.crops[0], plan.out_hw[0], code)
        assert np.array_equal(got, ref[:, ::-1] if plan.flips[0] else ref)


def test_the_gpu_decoders_refuse_a_bicubic_resize_when_made():
    assert BICUBIC_RESIZE in beyond_geometry({"image": T.ImagePipeline([T.RandomResizedCrop(8, interpolation="random")])})
    assert BICUBIC_RESIZE not in beyond_geometry({"image": T.ImagePipeline([T.RandomResizedCrop(8)])})
    for name in ("nvjpeg", "dali"):
        why = decoders.kind(name).refusal((BICUBIC_RESIZE,))
        assert why is not None and "bicubic" in why
    assert decoders.kind("native").refusal((BICUBIC_RESIZE,)) is None
    plan = T.ImagePipeline([T.RandomResizedCrop(8, interpolation="bicubic")]).plan(
        np.array([20]), np.array([20]), np.random.default_rng(0)
    )
    with pytest.raises(NotImplementedError, match="bicubic"):
        check_augment(plan, 1, "nvjpeg")


@pytest.mark.parametrize("bad", ["nearest", "lanczos", ("bilinear", "nearest")])
def test_other_interpolations_are_refused_naming_what_is_supported(bad):
    with pytest.raises(ValueError, match="bilinear or bicubic"):
        T.RandomResizedCrop(8, interpolation=bad)
    with pytest.raises(ValueError, match="bilinear or bicubic"):
        T.Resize(8, interpolation="random")  # 'random' is RandomResizedCrop's (timm's) only


def test_ds_getitem_resizes_with_the_plans_interpolation(image_shards):
    """``ds[i]`` (the same native calls as the loader, one sample) honours the pipeline's bicubic resize: for the
    same torch seed (the same crop) it is the bilinear item's crop resized otherwise, and the same again."""
    import torch

    import fastload

    items = {}
    for mode in ("bilinear", "bicubic"):
        ds = fastload.open(image_shards, transforms={"image": [T.RandomResizedCrop(20, interpolation=mode)]})
        torch.manual_seed(3)
        items[mode] = ds[0]["image"] if isinstance(ds[0], dict) else ds[0][0]
        torch.manual_seed(3)
        again = ds[0]["image"] if isinstance(ds[0], dict) else ds[0][0]
        assert torch.equal(items[mode], again)
    diff = (items["bilinear"].int() - items["bicubic"].int()).abs()
    assert items["bicubic"].shape == (3, 20, 20) and 0 < diff.float().mean() < 20
