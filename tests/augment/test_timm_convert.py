"""timm's transform objects converted to fastload's by their public attributes (issue 30 item 1).

CI has no timm, so these tests use stand-ins: classes whose module, name and attributes are exactly timm 1.0's
(from its source: ``timm/data/transforms.py`` keeps RandomResizedCropAndInterpolation's ``size`` as a tuple,
``interpolation`` as an InterpolationMode or, for ``'random'``, a tuple of two; ``random_erasing.py`` keeps
``probability``, ``min_area``, ``max_area``, ``log_aspect_ratio``, ``min_count``, ``max_count``, ``mode``,
``rand_color``, ``per_pixel``). The stand-ins that run do what timm's do where the test relies on it: the policy
takes PIL images only (an AttributeError on a tensor, as timm's ``img.transform(...)``), the erasing writes
normal noise into the float tensor in place. ``test_timm_real.py`` runs timm's own objects where timm imports.
"""

from __future__ import annotations

import math
import random
import warnings

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

import fastload
import fastload.transforms as T
from fastload._augment.fallback import AfterNormalize, UserTransform
from fastload._augment.timm_convert import convert
from test_torchvision_convert import BILINEAR, BICUBIC, NEAREST as V1_NEAREST, V1, same, tv

TRANSFORMS, ERASING, AUTO = "timm.data.transforms", "timm.data.random_erasing", "timm.data.auto_augment"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def rrc(size=24, interpolation=BILINEAR, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    return tv(TRANSFORMS, "RandomResizedCropAndInterpolation", size=(size, size), scale=scale, ratio=ratio,
              interpolation=interpolation)


class Erasing:
    """timm's RandomErasing's attributes (its ``__init__``), and a ``__call__`` erasing one box with normal noise
    per pixel ('pixel'), per channel ('rand') or zeros ('const'), in place, drawing from ``random`` and torch."""

    def __init__(self, probability=0.5, min_area=0.02, max_area=1 / 3, min_aspect=0.3, mode="const", max_count=None):
        self.probability, self.min_area, self.max_area = probability, min_area, max_area
        self.log_aspect_ratio = (math.log(min_aspect), math.log(1 / min_aspect))
        self.min_count, self.max_count = 1, max_count or 1
        self.num_splits, self.mode, self.device = 0, mode, "cpu"
        self.rand_color, self.per_pixel = mode == "rand", mode == "pixel"

    def __call__(self, img):
        if random.random() > self.probability:
            return img
        c, h, w = img.shape
        top, left = random.randint(0, h // 2), random.randint(0, w // 2)
        shape = (c, h // 2, w // 2) if self.per_pixel else (c, 1, 1)
        img[:, top:top + h // 2, left:left + w // 2] = torch.empty(shape, dtype=img.dtype).normal_() \
            if self.per_pixel or self.rand_color else 0
        return img


Erasing.__module__, Erasing.__name__, Erasing.__qualname__ = ERASING, "RandomErasing", "RandomErasing"


class RandAugment:
    """timm's RandAugment as far as these tests need: PIL in, PIL out (here an inversion, drawn with ``random``).
    Its one op is ``3a``'s GaussianBlurRand, which fastload does not plan (test_timm_policies.py converts the others),
    so that it runs per sample as timm's object."""

    def __init__(self):
        blur = tv(AUTO, "AugmentOp", prob=0.5, magnitude=9, magnitude_std=0.0, magnitude_max=None, hparams={},
                  kwargs={"fillcolor": (128, 128, 128), "resample": (2, 3)})
        blur.name = "GaussianBlurRand"
        self.ops, self.num_layers, self.choice_weights = [blur], 2, None

    def __call__(self, img):
        img.size  # noqa: B018  (a tensor has no .size attribute that is a tuple; PIL's is)
        if not isinstance(img, Image.Image):
            raise AttributeError(f"'{type(img).__name__}' object has no attribute 'transform'")
        return ImageOps.invert(img) if random.random() < 2 else img


RandAugment.__module__ = AUTO


CASES = {
    "RandomResizedCropAndInterpolation bilinear": (rrc(224), [T.RandomResizedCrop(224)]),
    "RandomResizedCropAndInterpolation scale": (rrc(176, scale=(0.35, 1.0)), [T.RandomResizedCrop(176, (0.35, 1.0))]),
    "RandomResizedCropAndInterpolation bicubic": (rrc(224, BICUBIC), [T.RandomResizedCrop(224, interpolation="bicubic")]),
    # timm's interpolation='random' is kept as the pair it chooses from per image
    "RandomResizedCropAndInterpolation random": (
        rrc(224, (BILINEAR, BICUBIC)), [T.RandomResizedCrop(224, interpolation="random")]),
    "MaybeToTensor": (tv(TRANSFORMS, "MaybeToTensor"), [T.ToDtype(torch.float32, scale=True)]),
    "MaybePILToTensor": (tv(TRANSFORMS, "MaybePILToTensor"), []),
    "ToNumpy": (tv(TRANSFORMS, "ToNumpy"), []),
    "ToTensor": (tv(TRANSFORMS, "ToTensor", dtype=torch.float16), [T.ToDtype(torch.float16)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_timm_transform_with_an_equivalent_converts_with_its_parameters(case):
    given, expected = CASES[case]
    got = convert(given, T)
    assert same(got, expected), (case, got)


def erasing_params(t):
    return (t.p, *t.scale, *t.ratio, *t.value)


@pytest.mark.parametrize("min_aspect", [0.3, 0.5])
def test_const_erasing_converts_with_timms_area_and_aspect_range(min_aspect):
    """timm keeps only the log of the aspect range: exp(log(x)) is x within a rounding."""
    (got,) = convert(Erasing(0.25, min_aspect=min_aspect), T)
    assert type(got) is T.RandomErasing
    assert erasing_params(got) == pytest.approx((0.25, 0.02, 1 / 3, min_aspect, 1 / min_aspect, 0.0))


@pytest.mark.parametrize("given, why, pil", [
    (rrc(interpolation=(BILINEAR, V1_NEAREST)), "bilinear or bicubic", True),
    (RandAugment(), "RandAugment", True),
    (tv(AUTO, "AugMixAugment", ops=[], alpha=1.0, width=3, depth=-1, blended=False), "AugMixAugment", True),
    (tv(TRANSFORMS, "ResizeKeepRatio", size=(224, 224)), "no fastload equivalent", True),
], ids=["random of another pair", "RandAugment", "AugMix", "unknown"])
def test_without_an_exact_equivalent_it_runs_as_timms_object_saying_why(given, why, pil):
    (got,) = convert(given, T)
    assert isinstance(got, UserTransform) and got.fn is given and why in got.reason, got.reason
    assert got.pil is pil  # timm calls its PIL-stage transforms with PIL images, its erasing with the tensor


def test_not_timm_is_not_converted():
    assert convert(lambda img: img, T) is None
    assert convert(tv(V1, "RandomErasing", p=0.5), T) is None  # torchvision's: torchvision_convert.py's


def deit(re_mode="const", interpolation=BILINEAR):
    """``timm.data.create_transform(24, is_training=True, auto_augment='rand-m9-mstd0.5', re_prob=0.25)``'s
    list (transforms_imagenet_train): torchvision's Compose, flip and Normalize (mean/std as tensors), timm's
    crop, RandAugment, MaybeToTensor and RandomErasing."""
    return tv(V1, "Compose", transforms=[
        rrc(24, interpolation), tv(V1, "RandomHorizontalFlip", p=0.5), RandAugment(), tv(TRANSFORMS, "MaybeToTensor"),
        tv(V1, "Normalize", mean=torch.tensor(MEAN), std=torch.tensor(STD), inplace=False),
        Erasing(0.25, mode=re_mode)])


def test_the_deit_recipe_converts_its_geometry_and_runs_randaugment_and_then_erasing_per_sample():
    """RandAugment has no native equivalent, so it runs per sample after the native decoder; timm's erasing comes
    after it, so it cannot be planned in the decoder before it: timm's own erasing runs on the float image."""
    p = T.ImagePipeline(deit())
    assert same(p.transforms, [T.RandomResizedCrop(24), T.RandomHorizontalFlip()]) and not p.augment
    assert [u.name for u in p.fallback] == [f"{AUTO}.RandAugment"] and p.fallback[0].pil
    f32 = [T.ToDtype(torch.float32, scale=True), T.Normalize(torch.tensor(MEAN).tolist(), torch.tensor(STD).tolist())]
    assert same(p.tensor.transforms, f32)  # torchvision's Normalize holding timm's float32 tensors
    assert [type(u.fn) for u in p.after] == [Erasing] and "follows timm.data.auto_augment.RandAugment" in p.after[0].reason


def test_the_recipe_with_colour_jitter_instead_runs_all_natively_erasing_included(image_shards):
    """create_transform(..., auto_augment=None, re_prob=0.25): torchvision's ColorJitter(0.4, 0.4, 0.4) converts,
    and timm's const erasing is planned on the uint8 image with the mean colour (0 in normalized units)."""
    recipe = deit()
    recipe.transforms[2] = tv(V1, "ColorJitter", brightness=[0.6, 1.4], contrast=[0.6, 1.4], saturation=[0.6, 1.4],
                              hue=None)
    p = T.ImagePipeline(recipe)
    assert not p.fallback and not p.after
    pixels = tuple(int(v) for v in np.clip(np.rint(np.array(MEAN) * 255), 0, 255))
    assert same(p.transforms, [T.RandomResizedCrop(24), T.RandomHorizontalFlip()])  # the flip: in the crop plan
    assert [type(t) for t in p.augment] == [T.ColorJitter, T.RandomErasing]
    assert erasing_params(p.augment[1]) == pytest.approx((0.25, 0.02, 1 / 3, 0.3, 1 / 0.3, *pixels))
    ds = fastload.open(image_shards, transforms={"image": recipe})
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastload.FastPathWarning)  # nothing runs per sample
        x, _ = next(iter(fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=0, num_workers=2)))
    assert x.shape == (4, 3, 24, 24) and x.dtype == torch.float32


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_deit_recipe_opens_and_loads_warning_once_per_stage_naming_what_runs_per_sample(image_shards,
                                                                                             num_workers):
    ds = fastload.open(image_shards, transforms={"image": deit()})
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=0, num_workers=num_workers)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = [b for _, b in zip(range(3), loader)]
    x, y = batches[0]
    assert x.shape == (4, 3, 24, 24) and x.dtype == torch.float32 and y.dtype == torch.int64
    ours = [str(w.message) for w in caught if issubclass(w.category, fastload.FastPathWarning)]
    assert len(ours) == 2, ours
    policy = next(m for m in ours if "after the native decode" in m)
    erasing = next(m for m in ours if "after ToDtype/Normalize" in m)
    assert "RandAugment" in policy and "no native plan" in policy and "RandomErasing" not in policy
    assert "RandomErasing" in erasing and "follows timm.data.auto_augment.RandAugment" in erasing


def test_the_policy_gets_a_pil_image_and_its_result_is_used(image_shards):
    """RandAugment's stand-in inverts: the batch is the recipe's without it, inverted before Normalize."""
    recipe = deit()
    without = tv(V1, "Compose", transforms=[t for t in recipe.transforms if not isinstance(t, RandAugment)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        a = next(iter(fastload.DataLoader(fastload.open(image_shards, transforms={"image": without}), batch_size=6,
                                          seed=2)))[0]
        b = next(iter(fastload.DataLoader(fastload.open(image_shards, transforms={"image": recipe}), batch_size=6,
                                          seed=2)))[0]
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    pixels_a, pixels_b = a * std + mean, b * std + mean  # back to [0, 1]
    erased = (pixels_a - mean).abs().amax(1) < 1 / 255  # the erased box (the mean colour) is not inverted
    keep = ~erased & ~((pixels_b - mean).abs().amax(1) < 1 / 255)
    assert keep.float().mean() > 0.5
    assert torch.allclose((1 - pixels_a).permute(0, 2, 3, 1)[keep], pixels_b.permute(0, 2, 3, 1)[keep], atol=1e-4)


@pytest.mark.parametrize("mode", ["pixel", "rand"])
def test_erasing_with_noise_runs_natively_on_the_normalized_floats(image_shards, mode):
    """Modes 'pixel'/'rand' ran timm's object per sample (a FastPathWarning); now the fill stage erases the
    normalized rows (tests/augment/test_noise_erasing.py checks the boxes and the noise)."""
    from fastload._augment.noise_erasing import NoiseErasing

    p = T.ImagePipeline(deit(mode))
    assert not p.after and [type(e) for e in p.erase] == [NoiseErasing] and p.erase[0].mode == mode
    ds = fastload.open(image_shards, transforms={"image": deit(mode)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x, _ = next(iter(fastload.DataLoader(ds, batch_size=6, shuffle=True, seed=1, num_workers=2)))
    assert x.dtype == torch.float32 and x.shape == (6, 3, 24, 24)
    ours = " ".join(str(w.message) for w in caught if issubclass(w.category, fastload.FastPathWarning))
    assert "RandAugment" in ours and "RandomErasing" not in ours  # (this stand-in RandAugment runs per sample)


@pytest.mark.parametrize("interpolation", [(BILINEAR, BICUBIC), BICUBIC], ids=["random", "bicubic"])
def test_the_deit_recipe_with_timms_bicubic_or_random_crop_keeps_its_crop_native(image_shards, interpolation):
    """timm's train.py default (--train-interpolation random) and the DeiT recipe's bicubic: the crop is planned
    and resized natively; only the policy (and the erasing after it) run per sample, as with bilinear."""
    p = T.ImagePipeline(deit(interpolation=interpolation))
    mode = "random" if isinstance(interpolation, tuple) else "bicubic"
    assert p.transforms[0] == T.RandomResizedCrop(24, interpolation=mode)
    assert [type(u.fn) for u in p.fallback] == [RandAugment]
    ds = fastload.open(image_shards, transforms={"image": deit(interpolation=interpolation)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x, _ = next(iter(fastload.DataLoader(ds, batch_size=6, shuffle=True, seed=1, num_workers=0)))
    assert x.shape == (6, 3, 24, 24)
    ours = " ".join(str(w.message) for w in caught if issubclass(w.category, fastload.FastPathWarning))
    assert "RandomResizedCrop" not in ours and "RandAugment" in ours


