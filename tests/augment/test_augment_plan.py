"""The plan: determinism, columnar structure, the op registry, whole recipes through both engines, and the
transforms' argument checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from augment_common import H, W, differences, engines, photo_tiles, smooth_tiles
from fastload._augment.color import ColorJitter, Grayscale, RandomGrayscale
from fastload._augment.combinators import RandomApply, RandomChoice, RandomOrder
from fastload._augment.filters import GaussianBlur, RandomErasing
from fastload._augment import geometry as G
from fastload._augment.geometry import RandomHorizontalFlip, RandomVerticalFlip
from fastload._augment.plan import OPS, PlanBuilder, define_op, plan_batch
from fastload._augment.policies import AutoAugment, RandAugment, TrivialAugmentWide
from fastload._augment.tone import RandomAdjustSharpness, RandomPosterize, RandomSolarize

N = 64
RECIPES = {
    # recipe: (transforms, max mean difference between the engines)
    "trivial_augment": ([RandomHorizontalFlip(), TrivialAugmentWide(), RandomErasing(0.1)], 0.3),
    "trivial_augment_bilinear_fill": ([TrivialAugmentWide(interpolation="bilinear", fill=[10, 20, 30])], 0.3),
    "rand_augment": ([RandomHorizontalFlip(), RandAugment(num_ops=2, magnitude=9), RandomErasing(0.25)], 0.3),
    "auto_augment": ([AutoAugment()], 0.3),
    "three_augment": ([RandomChoice([Grayscale(3), RandomSolarize(128, p=1.0), GaussianBlur(5)]),
                       ColorJitter(0.3, 0.3, 0.3)], 0.6),
    "color_jitter": ([ColorJitter(0.4, 0.4, 0.4, 0.1), RandomGrayscale(0.2), RandomVerticalFlip()], 1.0),
    "random_affine": ([G.RandomRotation(30), G.RandomAffine(10, translate=(0.1, 0.1), scale=(0.9, 1.1), shear=5,
                                                           interpolation="bilinear", fill=[0, 50, 100])], 1.5),
    "combinators": ([RandomOrder([RandomApply([RandomAdjustSharpness(2.0, 1.0)], 0.5), RandomPosterize(4, 0.7)])],
                    0.0),
}


def _plan(transforms, n=N, seed=0, rng=None):
    return plan_batch(transforms, np.tile([H, W], (n, 1)), rng if rng is not None else np.random.default_rng(seed))


def _same_plan(a, b) -> bool:
    ga, gb = a.geometry, b.geometry
    if a.channels != b.channels or len(a.steps) != len(b.steps):
        return False
    for f in ("out_hw", "hflip", "vflip", "affine", "has_affine", "interpolation", "fill"):
        if not np.array_equal(getattr(ga, f), getattr(gb, f)):
            return False
    for sa, sb in zip(a.steps, b.steps):
        if sa.op != sb.op or not np.array_equal(sa.index, sb.index) or sa.params.keys() != sb.params.keys():
            return False
        if any(not np.array_equal(sa.params[k], sb.params[k]) for k in sa.params):
            return False
    return True


@pytest.fixture(scope="module")
def photos():
    return photo_tiles(N)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipes_agree_between_engines(recipe, photos):
    transforms, bound = RECIPES[recipe]
    for seed in range(2):
        _, mean_d, _ = differences(photos, _plan(transforms, seed=seed))
        assert mean_d <= bound, f"{recipe}, seed {seed}: mean difference {mean_d:.4f}"


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_same_generator_state_gives_the_same_plan(recipe):
    transforms, _ = RECIPES[recipe]
    rng = np.random.default_rng(5)
    state = rng.bit_generator.state
    first = _plan(transforms, rng=rng)
    rng.bit_generator.state = state  # a resumed generator
    assert _same_plan(first, _plan(transforms, rng=rng))
    assert _same_plan(first, _plan(transforms, seed=5))
    assert not _same_plan(first, _plan(transforms, seed=6))


def test_steps_are_columnar_and_sorted():
    plan = _plan([ColorJitter(0.4, 0.4, 0.4, 0.1), TrivialAugmentWide()])
    assert len(plan.steps) <= 16 + 13
    for step in plan.steps:
        assert step.index.dtype == np.int64 and np.all(np.diff(step.index) > 0)
        for name, (dtype, shape) in OPS[step.op].columns.items():
            col = step.params[name]
            assert col.dtype == np.dtype(dtype) and col.shape == (step.index.size, *shape)
    # A sample's operations are the steps that list it, in order.
    for i in range(5):
        assert [n for n, _ in plan.ops_of(i)] == [s.op for s in plan.steps if i in s.index]


def test_a_new_operation_is_one_definition_and_runs_in_both_engines():
    """The registry is the only place engines look: a test-local op (add a per-sample level, saturating)."""

    def pil_kernel(img, p):
        return Image.fromarray(np.clip(np.asarray(img, np.int64) + int(p["level"]), 0, 255).astype(np.uint8))

    def torch_kernel(x, p):
        return (x.to(torch.int64) + p["level"].view(-1, 1, 1, 1)).clamp(0, 255).to(torch.uint8)

    define_op("test_add_level", {"level": ("int64", ())}, pil=pil_kernel, torch=torch_kernel)
    try:
        with pytest.raises(ValueError, match="'test_add_level' is already defined"):
            define_op("test_add_level", {}, pil=pil_kernel, torch=torch_kernel)
        tiles = smooth_tiles(6)
        b = PlanBuilder(np.tile([H, W], (6, 1)))
        b.add("test_add_level", np.array([4, 1, 3]), level=np.array([40, 10, 30]))
        out, ref = engines(tiles, b.finish())
        assert np.array_equal(out, ref)
        assert np.array_equal(out[1], np.clip(tiles[1].astype(np.int64) + 10, 0, 255))
        assert np.array_equal(out[4], np.clip(tiles[4].astype(np.int64) + 40, 0, 255))
        assert np.array_equal(out[0], tiles[0])
    finally:
        del OPS["test_add_level"]


def test_grayscale_one_channel_for_the_whole_batch_only():
    tiles = photo_tiles(4)
    plan = _plan([Grayscale()], n=4)
    out, ref = engines(tiles, plan)
    assert out.shape == (4, H, W, 1) and ref.shape == (4, H, W, 1)
    assert np.abs(out - ref).max() <= 1
    with pytest.raises(ValueError, match="must apply to every sample"):
        _plan([RandomApply([Grayscale()], p=0.5)], n=4)


def test_builder_and_plan_batch_refuse_bad_input():
    with pytest.raises(ValueError, match=r"out_hw must be an \(n, 2\) array of positive ints"):
        PlanBuilder(np.array([[0, 4]]))
    with pytest.raises(ValueError, match=r"out_hw must be an \(n, 2\) array"):
        PlanBuilder(np.array([1.5, 2.0]))
    b = PlanBuilder(np.tile([H, W], (3, 1)))
    with pytest.raises(ValueError, match=r"brightness: columns \['level'\] given, \['factor'\] expected"):
        b.add("brightness", np.arange(3), level=1)
    with pytest.raises(ValueError, match=r"column factor has shape \(2,\), expected \(3,\)"):
        b.add("brightness", np.arange(3), factor=np.ones(2))
    with pytest.raises(ValueError, match=r"invert: index must list distinct samples of the batch \(0 to 2\)"):
        b.add("invert", np.array([0, 2, 2]))
    with pytest.raises(ValueError, match=r"index must list distinct samples of the batch \(0 to 2\), got \[3\]"):
        b.add("invert", np.array([3]))
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        plan_batch([RandomSolarize(1)], np.tile([H, W], (3, 1)), 0)
    with pytest.raises(TypeError, match="is not one of fastload's augmentations"):
        plan_batch([lambda img: img], np.tile([H, W], (3, 1)), np.random.default_rng(0))


def test_gaussian_blur_kernel_larger_than_the_tile_names_the_sample():
    with pytest.raises(ValueError, match=r"sample 1 of the batch is 3x64"):
        plan_batch([GaussianBlur(7)], np.array([[H, W], [3, W]]), np.random.default_rng(0))


@pytest.mark.parametrize("make,words", [
    (lambda: ColorJitter(brightness=-0.1), "brightness is a single number, it must be non negative"),
    (lambda: ColorJitter(hue=0.6), "hue values should be between (-0.5, 0.5)"),
    (lambda: ColorJitter(contrast="high"), "contrast='high' should be a single number or a sequence"),
    (lambda: Grayscale(2), "num_output_channels=2 must be 1 or 3"),
    (lambda: RandomGrayscale(1.5), "p=1.5 should be a probability"),
    (lambda: RandomSolarize(300), "threshold=300 should be in [0, 255]"),
    (lambda: RandomPosterize(9), "bits=9 must be an integer in the range [0, 8]"),
    (lambda: RandomAdjustSharpness(-1), "sharpness_factor=-1 should be non-negative"),
    (lambda: GaussianBlur(4), "kernel_size=4 should have odd and positive integers"),
    (lambda: GaussianBlur(3, sigma=0), "sigma=0: if sigma is a single number, it must be positive"),
    (lambda: GaussianBlur(3, sigma=(2.0, 1.0)), "should be (min, max) with 0 < min <= max"),
    (lambda: RandomErasing(scale=(0.1, 1.5)), "scale=(0.1, 1.5) should be (min, max) with 0 <= min <= max <= 1"),
    (lambda: RandomErasing(value="noise"), "should be a number, one number per channel or 'random'"),
    (lambda: RandomErasing(value=(1, 2)), "should be a number or a sequence of 1 or 3 numbers"),
    (lambda: RandAugment(magnitude=31), "magnitude=31 should be an integer in [0, num_magnitude_bins - 1 = 30]"),
    (lambda: RandAugment(num_ops=-1), "num_ops=-1 should be a non-negative integer"),
    (lambda: TrivialAugmentWide(interpolation="bicubic"), "interpolation='bicubic' is not supported"),
    (lambda: TrivialAugmentWide(fill=(1, 2)), "fill=(1, 2) should be None, a number or a sequence of 1 or 3"),
    (lambda: AutoAugment(policy="cifar10"), "only the ImageNet policy is"),
    (lambda: RandomApply([], p=0.5), "should be a non-empty list of transforms"),
    (lambda: RandomChoice([RandomSolarize(1)], p=[-1]), "should be 1 non-negative numbers with a positive sum"),
    (lambda: RandomOrder([RandomSolarize(1), "flip"]), "'flip' (str) is not one of fastload's augmentations"),
])
def test_transform_arguments_are_checked(make, words):
    with pytest.raises((TypeError, ValueError)) as info:
        make()
    assert words in str(info.value)


def test_transforms_describe_and_compare_by_their_parameters():
    assert ColorJitter(0.4) == ColorJitter(brightness=(0.6, 1.4))
    assert TrivialAugmentWide() != TrivialAugmentWide(num_magnitude_bins=11)
    assert RandAugment().describe() == {"name": "RandAugment", "num_ops": 2, "magnitude": 9, "num_magnitude_bins": 31,
                                        "interpolation": "nearest", "fill": None}
    assert "RandomErasing(p=0.25" in repr(RandomErasing(0.25))


def test_augmentations_are_public_in_fastload_transforms_only():
    """torchvision's names live in fastload.transforms (as in torchvision.transforms), not in the top-level API;
    MixUp/CutMix too, now that the loader runs them (fastload.open's batch_transforms)."""
    import fastload
    import fastload.transforms as T

    assert {"TrivialAugmentWide", "RandAugment", "RandomErasing", "RandomCrop"} <= set(T.__all__)
    assert not any(name in fastload.__all__ for name in ("TrivialAugmentWide", "RandAugment", "MixUp", "CutMix"))
    assert {"MixUp", "CutMix"} <= set(T.__all__)


def test_extends_the_crop_plan_the_loader_makes_today():
    """RandomResizedCrop + flip planned by fastload.transforms, then augmentations: the PIL engine from the
    source equals fastload.transforms.apply_pil followed by the augmentation."""
    from fastload.transforms import ImagePipeline, RandomHorizontalFlip as Flip, RandomResizedCrop, apply_pil

    src = photo_tiles(1, 120, 160)[0]
    pipe = ImagePipeline([RandomResizedCrop((H, W)), Flip()])
    for seed in range(4):
        crop_plan = pipe.plan(np.array([120]), np.array([160]), np.random.default_rng(seed))
        b = PlanBuilder.from_crop_plan(crop_plan)
        b.add("posterize", np.arange(1), bits=3)
        out = run_pil_source(src, b.finish())
        expect = np.asarray(apply_pil(pipe, Image.fromarray(src), np.random.default_rng(seed))) & 0b11100000
        assert np.array_equal(out, expect)


def run_pil_source(src, plan):
    from fastload._augment.engine_pil import run_pil

    return run_pil(src, plan, 0, source=True)
