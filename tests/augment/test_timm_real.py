"""timm's own objects, converted and run (issue 30 item 1); skipped where timm does not import (CI).

timm (and torchvision, which it imports) from the package index need a CUDA torch for their C ops; their
pure-Python parts work on the CPU torch once torchvision's fake-op registrations are skipped. That is done in a
test-only venv, never in fastload: ``bash scripts/timm_test_venv.sh`` builds ``bench/.venvs/timm``, then
``bench/.venvs/timm/bin/python -m pytest tests/augment/test_timm_real.py``.

The conversions are checked against timm's own code on the same draws: timm's ``random`` replaced, for one call,
by one that hands it the uniforms fastload drew (the crop), or by comparing the distributions of many draws (the
erasing box, whose draws fastload makes in another order).
"""

from __future__ import annotations

import math
import random
import warnings

import numpy as np
import pytest
import torch

import fastload
import fastload.transforms as T
from fastload._augment.fallback import AfterNormalize, UserTransform
from fastload._transforms.geometric import _rrc_params
from fastload._native import native

timm_data = pytest.importorskip("timm.data", reason="timm is not importable here (bash scripts/timm_test_venv.sh)")
timm_transforms = pytest.importorskip("timm.data.transforms")
from timm.data import create_transform  # noqa: E402
from timm.data.random_erasing import RandomErasing  # noqa: E402

from conftest import jpeg_bytes  # noqa: E402

MEAN, STD = timm_data.IMAGENET_DEFAULT_MEAN, timm_data.IMAGENET_DEFAULT_STD


def deit(size=224, **kw):
    return create_transform(size, is_training=True, auto_augment="rand-m9-mstd0.5", re_prob=0.25, **kw)


def test_the_deit_recipe_from_timms_factory_converts_entirely():
    """Crop, flip, timm's RandAugment (its ops and magnitude rules: timm_policies.py), MaybeToTensor, Normalize and
    the const erasing after them: nothing runs per sample (test_timm_policies_real.py checks the policy's ops)."""
    from fastload._augment.timm_policies import TimmRandAugment

    p = T.ImagePipeline(deit())
    assert [type(t) for t in p.transforms] == [T.RandomResizedCrop, T.RandomHorizontalFlip]
    assert p.transforms[0].size == (224, 224) and p.output_size == (224, 224)
    assert not p.fallback and not p.after
    assert [type(t) for t in p.augment] == [TimmRandAugment, T.RandomErasing]
    assert [type(t) for t in p.tensor.transforms] == [T.ToDtype, T.Normalize]
    assert p.tensor.transforms[1].mean == pytest.approx(MEAN) and p.tensor.transforms[1].std == pytest.approx(STD)


def test_the_colour_jitter_recipe_runs_entirely_natively():
    """Without auto_augment timm adds torchvision's ColorJitter(0.4, 0.4, 0.4); its const erasing is planned on
    the uint8 image."""
    p = T.ImagePipeline(create_transform(224, is_training=True, re_prob=0.25))
    assert not p.fallback and not p.after
    assert [type(t) for t in p.augment] == [T.ColorJitter, T.RandomErasing]
    assert p.augment[0].brightness == pytest.approx((0.6, 1.4)) and p.augment[0].hue is None
    e = p.augment[1]
    assert (e.p, *e.scale, *e.ratio) == pytest.approx((0.25, 0.02, 1 / 3, 0.3, 1 / 0.3))


@pytest.mark.parametrize("mode, count", [("pixel", 1), ("rand", 1), ("const", 3), ("pixel", 2)])
def test_erasing_with_noise_or_several_boxes_converts_to_the_fill_stages_erasing(mode, count):
    """timm's train.py (--remode pixel) and DeiT's recipe: it ran timm's object per sample; now a NoiseErasing."""
    from fastload._augment.noise_erasing import NoiseErasing

    p = T.ImagePipeline(create_transform(224, is_training=True, re_prob=0.25, re_mode=mode, re_count=count))
    (erasing,) = p.erase
    assert isinstance(erasing, NoiseErasing) and isinstance(erasing.source, RandomErasing) and not p.after
    assert (erasing.mode, erasing.count, erasing.p) == (mode, (1, count), 0.25)


def test_timms_pixel_erasing_with_two_boxes_runs_with_nothing_per_sample(image_shards):
    """create_transform(..., re_prob=0.25, re_mode='pixel', re_count=2): no FastPathWarning; the batch is
    normalized floats; deterministic per seed."""
    recipe = create_transform(24, is_training=True, re_prob=0.25, re_mode="pixel", re_count=2)
    ds = fastload.open(image_shards, transforms={"image": recipe})
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastload.FastPathWarning)
        a = torch.cat([x for x, _ in fastload.DataLoader(ds, batch_size=4, seed=1)])
        b = torch.cat([x for x, _ in fastload.DataLoader(ds, batch_size=6, seed=1, num_workers=2)])
    assert a.dtype == torch.float32 and a.shape[1:] == (3, 24, 24) and torch.equal(a, b)


@pytest.mark.parametrize("mode, count", [("pixel", 1), ("const", 3), ("rand", 2)])
def test_the_erasing_boxes_are_timms_own_on_the_same_draws(monkeypatch, mode, count):
    """timm's own ``RandomErasing._erase`` with its ``random`` replaced by fastload's draws and its ``_get_pixels``
    painting each box with its number: the same boxes, box for box, over 300 images of random sizes."""
    import timm.data.random_erasing as re_module
    from test_noise_erasing import Replay

    t = RandomErasing(0.7, mode=mode, max_count=count, min_count=1, device="cpu")
    (ours,) = T._foreign(t)
    gen = np.random.default_rng(2)
    n = 300
    hw = np.stack([gen.integers(16, 80, n), gen.integers(16, 80, n)], axis=1)  # no box rounds to 0 pixels
    plan = ours.plan(hw, np.random.default_rng(4))
    replay = np.random.default_rng(4)
    u_p = replay.random(n)
    sel = np.flatnonzero(u_p < 0.7)
    counts = np.ones(sel.size, np.int64) if count == 1 else replay.integers(1, count + 1, sel.size)
    u_area, u_aspect = replay.random((sel.size, count, 10)), replay.random((sel.size, count, 10))
    painted = []

    def numbered(*args, **kwargs):  # timm's pixels for a found box: its number
        painted.append(1)
        return torch.tensor(float(len(painted)))

    monkeypatch.setattr(re_module, "_get_pixels", numbered)
    for k in range(n):
        h, w = (int(v) for v in hw[k])
        s = int(np.searchsorted(sel, k))
        here = k in sel
        monkeypatch.setattr(re_module, "random", Replay(
            u_p[k], int(counts[s]) if here and count > 1 else None, u_area[s] if here else None,
            u_aspect[s] if here else None, plan.boxes[k]))
        img = torch.zeros((1, h, w))
        painted.clear()
        t(img)
        mine = torch.zeros((1, h, w))
        j = 0
        for top, left, bh, bw in plan.boxes[k]:
            if bh and bw:
                j += 1
                mine[:, top : top + bh, left : left + bw] = j
        assert torch.equal(img, mine), (k, h, w, plan.boxes[k])


@pytest.mark.parametrize("interpolation", ["random", "bicubic"])
def test_random_and_bicubic_crops_convert_and_resize_as_timms_on_the_same_draws(monkeypatch, interpolation):
    """timm's RandomResizedCropAndInterpolation(64, interpolation=...) on a PIL image, fed the crop's uniforms and
    positions and (``random.choice``) the interpolation fastload drew, against the native resize of fastload's
    plan: PIL's bicubic within 1 level (tests/native/test_resize.py); 'random' draws both over the samples."""
    from PIL import Image

    t = timm_transforms.RandomResizedCropAndInterpolation(64, interpolation=interpolation)
    (ours,) = T._foreign(t)
    assert type(ours) is T.RandomResizedCrop and ours.interpolation == interpolation
    rng = np.random.default_rng(0)
    pixels = np.clip(np.asarray(Image.linear_gradient("L").resize((420, 300)))[..., None].astype(np.float64)
                     + rng.normal(0, 40, (300, 420, 3)), 0, 255).astype(np.uint8)
    pil = Image.fromarray(pixels)
    seen = set()
    for _ in range(8):
        plan, draws = plan_and_replay(ours, rng)
        code = plan.interp_of(0)
        seen.add(code)
        monkeypatch.setattr(timm_transforms, "random", draws)
        theirs = np.asarray(t(pil)).astype(np.int32)
        got = native().resize_crop(pixels, tuple(int(v) for v in plan.crops[0]), (64, 64), False, interpolation=code)
        diff = np.abs(got.astype(np.int32) - theirs)
        assert diff.max() <= 1 and diff.mean() <= 0.05, (code, diff.max(), diff.mean())
    assert seen == ({0, 1} if interpolation == "random" else {1})


class Replay:
    """Stands for the ``random`` module in timm's transforms for one call: ``uniform`` hands out the given
    uniforms in order (as ``a + (b - a) * u``, Python's formula), ``randint`` the given integers, ``choice`` the
    given interpolation."""

    def __init__(self, uniforms, ints, choice=None):
        self.uniforms, self.ints, self.index = list(uniforms), list(ints), choice

    def choice(self, seq):  # timm's interpolation='random': the mode fastload drew (0 bilinear, 1 bicubic)
        (mode,) = [m for m in seq if m.value == ("bicubic" if self.index else "bilinear")]
        return mode

    def uniform(self, a, b):
        return a + (b - a) * self.uniforms.pop(0)

    def randint(self, a, b):
        v = self.ints.pop(0)
        assert a <= v <= b
        return v


def plan_and_replay(ours, rng):
    """``ours``' plan of a 300x420 image drawn from ``rng``, and a ``Replay`` of the draws it made as timm's
    ``random`` takes them: the 10 area and ratio uniforms interleaved, the crop's top and left, the interpolation."""
    state = rng.bit_generator.state
    plan = T.ImagePipeline([ours]).plan(np.array([300]), np.array([420]), rng)
    replay = np.random.default_rng()
    replay.bit_generator.state = state
    u_area, u_ratio = replay.random(10), replay.random(10)
    top, left, _, _ = (int(v) for v in plan.crops[0])
    return plan, Replay([u for p in zip(u_area, u_ratio) for u in p], [top, left], choice=plan.interp_of(0))


@pytest.mark.parametrize("scale, ratio", [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.9, 1.0), (1.0, 1.0)),
                                          ((0.35, 1.0), (0.5, 2.0))])
def test_the_crop_is_timms_on_the_same_draws(monkeypatch, scale, ratio):
    """fastload's crop plan for 300 images of random sizes (tall, wide and square, so that the centre-crop
    fallback is taken too) against timm's ``get_params`` fed the same uniforms and positions."""
    rng = np.random.default_rng(5)
    n = 300
    heights = rng.integers(8, 400, n)
    widths = np.where(rng.random(n) < 0.2, heights * 9, rng.integers(8, 400, n))
    seed = 11
    top, left, h, w, fell_back = _rrc_params(heights, widths, scale, ratio, np.random.default_rng(seed))
    replay = np.random.default_rng(seed)
    u_area, u_ratio = replay.random((n, 10)), replay.random((n, 10))
    assert fell_back.any() and (~fell_back).any()
    for k in range(n):
        uniforms = [u for pair in zip(u_area[k], u_ratio[k]) for u in pair]
        monkeypatch.setattr(timm_transforms, "random", Replay(uniforms, [int(top[k]), int(left[k])]))
        img = torch.empty((3, int(heights[k]), int(widths[k])), dtype=torch.uint8)
        got = timm_transforms.RandomResizedCropAndInterpolation.get_params(img, scale, ratio)
        assert got == (top[k], left[k], h[k], w[k]), (k, heights[k], widths[k])


def test_the_crops_pixels_are_timms_on_the_same_draws(monkeypatch):
    """timm's RandomResizedCropAndInterpolation(64) on a decoded JPEG (PIL), against fastload's native decoder
    on the same crop: within the native decoder's tolerance against PIL (tests/native/test_jpeg.py)."""
    from PIL import Image
    import io

    data = jpeg_bytes(300, 420, seed=3)
    pil = Image.open(io.BytesIO(data)).convert("RGB")
    t = timm_transforms.RandomResizedCropAndInterpolation(64)
    (ours,) = T._foreign(t)
    rng = np.random.default_rng(0)
    for _ in range(5):
        plan, draws = plan_and_replay(ours, rng)
        monkeypatch.setattr(timm_transforms, "random", draws)
        theirs = np.asarray(t(pil))
        got = native().decode_crop_resize(data, tuple(int(v) for v in plan.crops[0]), (64, 64), False,
                                          dct_scaling=False)
        diff = np.abs(got.astype(np.int32) - theirs.astype(np.int32))
        assert diff.mean() <= 0.5 and diff.max() <= 3


def test_the_erasing_box_is_drawn_as_timms():
    """The converted erasing's boxes (fastload's plan, 4000 samples) against timm's own RandomErasing on 4000
    tensors: the share erased and the boxes' mean height, width, area and position agree within sampling error."""
    size, n = 48, 4000
    timm_erasing = RandomErasing(0.25, mode="const", device="cpu")
    random.seed(0)
    theirs = []
    for _ in range(n):
        img = torch.ones((1, size, size))
        timm_erasing(img)
        rows, cols = torch.nonzero(img[0] == 0, as_tuple=True)
        if rows.numel():
            theirs.append((int(rows.min()), int(cols.min()), int(rows.max() - rows.min() + 1),
                           int(cols.max() - cols.min() + 1)))
    (ours,) = T._foreign(timm_erasing)
    plan = T.ImagePipeline([T.CenterCrop(size), ours]).plan(np.full(n, size), np.full(n, size),
                                                            np.random.default_rng(0))
    (step,) = plan.augment.steps
    mine = step.params["box"]
    assert len(theirs) / n == pytest.approx(0.25, abs=0.03) and len(mine) / n == pytest.approx(0.25, abs=0.03)
    a, b = np.array(theirs, dtype=np.float64), mine.astype(np.float64)
    for col in range(4):  # top, left, h, w
        se = math.sqrt(a[:, col].var() / len(a) + b[:, col].var() / len(b))
        assert abs(a[:, col].mean() - b[:, col].mean()) < 4 * se, (col, a[:, col].mean(), b[:, col].mean())
    area_a, area_b = a[:, 2] * a[:, 3], b[:, 2] * b[:, 3]
    se = math.sqrt(area_a.var() / len(a) + area_b.var() / len(b))
    assert abs(area_a.mean() - area_b.mean()) < 4 * se


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_deit_recipe_with_timms_objects_loads(image_shards, num_workers):
    """The DeiT recipe with timm's own objects loads on the fast path with no transform per sample (no warning);
    the batch is the recipe's size and dtype, the same for the same seed."""
    ds = fastload.open(image_shards, transforms={"image": deit(24)})
    def first_batch():
        return next(iter(fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=0, num_workers=num_workers)))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x, y = first_batch()
        again = first_batch()[0]
    assert x.shape == (4, 3, 24, 24) and x.dtype == torch.float32 and torch.equal(x, again)  # seeded per sample
    assert x.abs().max() < 3  # normalized: (0..1 - mean) / std
    text = " ".join(str(w.message) for w in caught if issubclass(w.category, fastload.FastPathWarning))
    assert text == ""


def test_the_eval_recipe_converts_entirely():
    """create_transform(224): torchvision's Resize(256) and CenterCrop(224), timm's MaybeToTensor, Normalize."""
    p = T.ImagePipeline(create_transform(224))
    assert [type(t) for t in p.transforms] == [T.Resize, T.CenterCrop] and p.output_size == (224, 224)
    assert not p.augment and not p.fallback and not p.after
    assert [type(t) for t in p.tensor.transforms] == [T.ToDtype, T.Normalize]


def test_the_prefetcher_recipe_leaves_uint8_for_the_device():
    """use_prefetcher=True (timm normalizes on the GPU): MaybePILToTensor converts to nothing, the batch is uint8."""
    p = T.ImagePipeline(create_transform(224, is_training=True, use_prefetcher=True))
    assert not p.tensor and not p.fallback and [type(t) for t in p.augment] == [T.ColorJitter]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_torchvisions_own_random_erasing_with_noise_after_normalize_converts(version):
    """torchvision's own RandomErasing(value='random') (v2 keeps it as value=None) after Normalize ran per sample;
    now the fill stage's NoiseErasing, per pixel and channel, with its p, scale and ratio."""
    import torchvision.transforms as v1
    import torchvision.transforms.v2 as v2

    tv = v1 if version == "v1" else v2
    erasing = tv.RandomErasing(0.3, scale=(0.05, 0.2), ratio=(0.5, 2.0), value="random")
    p = T.ImagePipeline([T.CenterCrop(24), T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD), erasing])
    (e,) = p.erase
    assert e.source is erasing and not p.after and (e.mode, e.count, e.p) == ("pixel", (1, 1), 0.3)
    assert e.area == pytest.approx((0.05, 0.2)) and e.log_ratio == pytest.approx((math.log(0.5), math.log(2.0)))
