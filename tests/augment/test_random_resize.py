"""RandomResize (torchvision v2's, ``_augment/random_resize.py``): the shorter side drawn from [min_size, max_size)
per sample from the batch's generator, folded into the crop plan; a fixed-size crop after it makes the batch."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fastload
from fastload import transforms as T
from fastload._augment.torchvision_convert import convert

from conftest import packed_image_folder, resumed_and_reference
from test_torchvision_convert import BILINEAR, NEAREST, V2, same, tv


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return packed_image_folder(tmp_path_factory.mktemp("random_resize"), classes=2, per_class=8)


def test_the_shorter_side_is_drawn_from_min_to_max_excluded():
    """torchvision v2: ``size = int(torch.randint(min_size, max_size, ()))``, then ``resize(size)``: the shorter
    side becomes ``size``, the longer ``int(size * long / short)``. Every size of [10, 13) comes out, 13 never
    (fails with max_size included), in equal shares (chi-square over 6000 draws, 3 bins: 13.8 is p = 0.001)."""
    n = 6000
    rng = np.random.default_rng(0)
    h = rng.integers(20, 90, n)
    w = rng.integers(20, 90, n)
    plan = T.ImagePipeline([T.RandomResize(10, 13)]).plan(h, w, np.random.default_rng(1))
    short = np.where(w <= h, plan.out_hw[:, 1], plan.out_hw[:, 0])
    long = np.where(w <= h, plan.out_hw[:, 0], plan.out_hw[:, 1])
    counts = np.array([(short == s).sum() for s in (10, 11, 12)])
    assert counts.sum() == n  # 13 never, nothing outside
    assert (((counts - n / 3) ** 2) / (n / 3)).sum() < 13.8
    src_short, src_long = np.minimum(h, w), np.maximum(h, w)
    assert np.array_equal(long, [int(s * lg / sh) for s, lg, sh in zip(short, src_long, src_short)])
    # the same draws as numpy's integers(min, max) from the batch's generator: one per sample, nothing else
    assert np.array_equal(short, np.random.default_rng(1).integers(10, 13, n))


def test_a_crop_after_it_is_taken_in_the_resized_image():
    """RandomResize then CenterCrop: the crop box in source pixels is the centre crop of the resized image mapped
    back (a 100x200 image resized to short side s, centre 20x20: 20 * 100 / s source pixels from its top)."""
    pipe = T.ImagePipeline([T.RandomResize(40, 60), T.CenterCrop(20)])
    assert pipe.output_size == (20, 20)
    plan = pipe.plan(np.full(64, 100), np.full(64, 200), np.random.default_rng(4))
    s = np.random.default_rng(4).integers(40, 60, 64)
    assert np.array_equal(plan.out_hw, np.full((64, 2), 20))
    top = np.rint((s - 20) / 2) * 100 / s  # CenterCrop's top in the resized image, in source pixels
    assert np.all(np.abs(plan.crops[:, 0] - top) <= 0.5)  # each edge rounded to a source pixel
    assert np.all(np.abs(plan.crops[:, 0] + plan.crops[:, 2] - (top + 20 * 100 / s)) <= 0.5)


def test_without_a_fixed_size_crop_the_loader_leaves_the_fast_path_saying_so(packed):
    """As Resize(int): images of different sizes cannot be batched natively; the loader says why and goes on."""
    ds = fastload.open(packed, transforms={"image": [T.RandomResize(20, 40)]})
    assert ds.pipelines["image"].output_size is None
    with pytest.warns(fastload.FastPathWarning, match="fixed output size"):
        it = iter(fastload.DataLoader(ds, batch_size=1, num_workers=0))
        image, _ = next(it)
    assert min(image.shape[2:]) in range(20, 40)


def test_the_recipe_is_seeded_resumable_and_independent_of_num_workers(packed):
    def make(workers):
        ds = fastload.open(packed, transforms={"image": [T.RandomResize(16, 64), T.RandomHorizontalFlip(),
                                                         T.RandomCrop(32, pad_if_needed=True)]})
        return fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=5, num_workers=workers)

    ref = [b[0].clone() for b in make(0)]
    assert ref[0].shape == (4, 3, 32, 32)
    assert all(np.array_equal(a, b[0]) for a, b in zip(ref, make(2)))
    got, want = resumed_and_reference(make, 2, done=2)
    assert len(got) == len(want) == len(ref) - 2 and all(np.array_equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("args, error, words", [
    ((20, 20), ValueError, "must be greater than min_size=20"),
    ((30, 20), ValueError, "must be greater than min_size=30"),
    ((0, 20), ValueError, "positive"),
    ((10.5, 20), TypeError, "min_size must be an int"),
    ((10, 20, "nearest"), ValueError, "interpolation='nearest' is not supported"),
    ((10, 20, "bilinear", False), ValueError, "antialias=False"),
])
def test_bad_arguments_are_refused_by_name(args, error, words):
    with pytest.raises(error, match=words):
        T.RandomResize(*args)


def test_torchvision_v2_random_resize_converts():
    got = convert(tv(V2["geometry"], "RandomResize", min_size=260, max_size=1040, interpolation=BILINEAR,
                     antialias=True), T)
    assert same(got, [T.RandomResize(260, 1040)])
    assert T.RandomResize(260, 1040).describe() == {"name": "RandomResize", "min_size": 260, "max_size": 1040,
                                                    "interpolation": "bilinear", "antialias": True}
    # what fastload cannot reproduce runs per sample, saying why
    got = convert(tv(V2["geometry"], "RandomResize", min_size=260, max_size=1040, interpolation=NEAREST,
                     antialias=True), T)
    assert len(got) == 1 and "interpolation" in got[0].reason


def test_it_is_exported():
    assert "RandomResize" in T.__all__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        T.ImagePipeline([T.RandomResize(10, 20), T.RandomCrop(8)])
