"""torchvision's segmentation preset exactly (references/segmentation/presets.py, v2: RandomResize, flip,
PadIfSmaller(crop, fill={Mask: 255, "others": 0}), RandomCrop(crop)) on the fast path: ``PadIfSmaller``
(``_augment/pad_if_smaller.py``) pads on the right and at the bottom only, and the RandomCrop after it cuts the
padded window the decoder executes, image and mask alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from conftest import resumed_and_reference
from fastload import transforms as T
from fastload._augment.torchvision_convert import convert
from fastload._augment.masks import geometry_of, move_mask
from fastload.transforms import ImagePipeline, apply_pil

from .test_mask import SCHEMA, segmentation_samples
from .test_mask_recipe import V2, Mode, assert_aligned, ds_i_equals_the_native_engines, recorded_plans, tv

BASE, CROP = 40, 48
FILL = {"image": 0, "mask": 255}
PRESET = [T.RandomResize(int(0.5 * BASE), int(2.0 * BASE)), T.RandomHorizontalFlip(0.5),
          T.PadIfSmaller(CROP, fill=FILL), T.RandomCrop(CROP)]


def assert_right_bottom(mask: np.ndarray) -> tuple[bool, bool]:
    """The padding (255) of a window of a right/bottom-padded image: whole last rows and/or last columns, never the
    first row or column. Returns (rows padded, columns padded)."""
    pad = mask == 255
    rows, cols = pad.all(axis=1), pad.all(axis=0)
    assert np.array_equal(pad, rows[:, None] | cols[None, :])  # nothing but whole rows and columns
    assert not rows[0] and not cols[0]  # the window starts inside the image: no top or left padding
    assert np.array_equal(rows, np.sort(rows)) and np.array_equal(cols, np.sort(cols))  # a suffix of each
    return bool(rows.any()), bool(cols.any())


@pytest.fixture
def segmentation(pack_samples):
    samples = segmentation_samples(16)
    return pack_samples(samples, schema={"image": SCHEMA["image"], "mask": SCHEMA["mask"]}, image_mode="raw"), samples


def test_ds_i_is_the_native_engines_result_of_the_preset(segmentation):
    """ds[i] (PIL reference, ``run_pil_mask``) against the native decoder and csrc/mask.cc given ds[i]'s plan: masks
    bit for bit, images within the padded crop's bound (0), aligned, padded on the right and at the bottom only, for
    flipped samples too (torchvision flips before padding)."""
    path, _ = segmentation
    seen = set()
    for plan, mask in ds_i_equals_the_native_engines(path, PRESET):
        padded = assert_right_bottom(mask)
        seen.add((bool(plan.flips[0]), any(padded)))
    assert seen == {(False, False), (False, True), (True, False), (True, True)}  # every case met


@pytest.mark.filterwarnings("error::fastload.FastPathWarning")  # the fast path, or the test fails
def test_loader_runs_the_preset_natively_equal_to_the_reference(segmentation, monkeypatch):
    """The loader's batches: every mask is the PIL reference's (``move_mask``) of the plan the loader drew, bit for
    bit, aligned with its image, padded on the right and at the bottom only."""
    path, samples = segmentation
    ds = fastload.open(path, as_dict=True, transforms={"image": PRESET})
    plans = recorded_plans(monkeypatch)
    seen = 0
    for b, batch in enumerate(fastload.DataLoader(ds, batch_size=5, num_workers=0, seed=2)):
        geometry = geometry_of(plans.pop(0))
        for k in range(len(batch["mask"])):
            stored = samples[5 * b + k]["mask"]
            ref = move_mask(stored, geometry, k)
            assert np.array_equal(batch["mask"][k].numpy(), ref), (b, k)
            assert_aligned(batch["image"][k], batch["mask"][k])
            seen += any(assert_right_bottom(ref))
    assert seen > 0


@pytest.mark.parametrize("flip", [0.0, 1.0])
def test_the_window_is_one_of_torchvision_s(flip):
    """Independently of fastload's planning: each output is a window of the (flipped) image padded on the right and
    at the bottom with the fill, as PadIfSmaller then RandomCrop make it (a window of an image padded on both
    sides, RandomCrop(pad_if_needed=True)'s, is not), and every window position can be drawn."""
    rng = np.random.default_rng(5)
    src = rng.integers(1, 255, size=(20, 26, 3), dtype=np.uint8)  # no 0: the fill is told apart
    shown = src[:, ::-1] if flip else src
    padded = np.zeros((32, 32, 3), np.uint8)
    padded[:20, :26] = shown
    positions = set()
    for seed in range(60):
        out = np.asarray(apply_pil([T.RandomHorizontalFlip(flip), T.PadIfSmaller(32), T.RandomCrop(24)],
                                   Image.fromarray(src), np.random.default_rng(seed)))
        found = [(y, x) for y in range(9) for x in range(9) if np.array_equal(padded[y:y + 24, x:x + 24], out)]
        assert len(found) == 1, seed
        positions.add(found[0])
    assert len(positions) > 30  # windows drawn over the whole padded image


@pytest.mark.filterwarnings("error::fastload.FastPathWarning")
def test_seed_workers_and_resume_give_the_same_batches(pack_samples):
    samples = [{"mask": s["mask"], "image": s["image"]} for s in segmentation_samples()]
    path = pack_samples(samples, schema=SCHEMA, image_mode="raw")

    def make(workers):
        ds = fastload.open(path, transforms={"image": PRESET})
        return fastload.DataLoader(ds, batch_size=2, shuffle=True, seed=3, num_workers=workers)

    ref = [(b[0].clone(), b[1].clone()) for b in make(0)]
    assert ref[0][0].shape == (2, CROP, CROP)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(ref, make(2)))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(ref, make(0)))
    got, want = resumed_and_reference(make, 2, done=3)
    assert len(got) == len(want) == len(ref) - 3 and all(torch.equal(a, b) for a, b in zip(got, want))


def test_pad_if_smaller_draws_nothing():
    """The preset draws what RandomResize, the flip and RandomCrop draw: the generator ends where it ends without
    the padding (RandomCrop(pad_if_needed=True) draws the same integers)."""
    h, w = np.array([30, 90, 41, 20]), np.array([50, 25, 41, 100])
    a, b = np.random.default_rng(1), np.random.default_rng(1)
    ImagePipeline(PRESET).plan(h, w, a)
    ImagePipeline(PRESET[:2] + [T.RandomCrop(CROP, pad_if_needed=True)]).plan(h, w, b)
    assert a.bit_generator.state == b.bit_generator.state


def test_the_preset_s_static_size_and_description():
    assert ImagePipeline(PRESET).output_size == (CROP, CROP)
    assert T.PadIfSmaller(48, fill=FILL).describe() == {"name": "PadIfSmaller", "size": 48, "fill": FILL}


@pytest.mark.parametrize("pipeline, words", [
    ([T.PadIfSmaller(48)], "followed by nothing"),
    ([T.PadIfSmaller(48), T.RandomHorizontalFlip(), T.RandomCrop(48)], "a RandomCrop must come right after it"),
    ([T.PadIfSmaller(48), T.Resize(30)], "a RandomCrop must come right after it"),
    ([T.PadIfSmaller(48), T.RandomCrop(48), T.Resize(30)], "only RandomHorizontalFlip may follow"),
    ([T.PadIfSmaller(48, fill=1), T.RandomCrop(48, padding=2, fill=2)], "give both the same fill"),
    ([T.RandomCrop(48, pad_if_needed=True), T.PadIfSmaller(48), T.RandomCrop(48)], "only RandomHorizontalFlip"),
])
def test_a_misplaced_pad_if_smaller_is_refused_by_name(pipeline, words):
    with pytest.raises(ValueError, match=words):
        ImagePipeline(pipeline)


@pytest.mark.parametrize("args, exc, words", [
    ((0,), ValueError, "PadIfSmaller size must be a positive int"),
    (("48",), TypeError, "PadIfSmaller size must be an int"),
    ((48, {"mask": 300}), ValueError, "PadIfSmaller: the mask's fill"),
    ((48, 300), ValueError, "PadIfSmaller"),
])
def test_bad_arguments_are_refused_by_name(args, exc, words):
    with pytest.raises(exc, match=words):
        T.PadIfSmaller(*args)


def test_the_reference_scripts_preset_converts_to_the_same_pipeline():
    """The preset as references/segmentation/presets.py builds it (v2 stand-ins with torchvision's modules, names and
    attributes; its script module's PadIfSmaller, whose fill v2's _setup_fill_arg made a dict per type) becomes
    PRESET; a PadIfSmaller of another module runs per sample as any callable."""
    Mask = type("Mask", (), {"__module__": "torchvision.tv_tensors._mask"})
    v2 = tv("torchvision.transforms.v2._container", "Compose", transforms=[
        tv(V2, "RandomResize", min_size=20, max_size=80, interpolation=Mode("bilinear"), antialias=True),
        tv(V2, "RandomHorizontalFlip", p=0.5),
        tv("v2_extras", "PadIfSmaller", size=CROP, fill={Mask: 255, "others": 0}),
        tv(V2, "RandomCrop", size=(CROP, CROP), padding=None, pad_if_needed=False, fill={"others": 0},
           padding_mode="constant")])
    assert ImagePipeline(v2) == ImagePipeline(PRESET[:3] + [T.RandomCrop(CROP, fill={"image": 0, "mask": 0})])
    assert convert(tv("v2_extras", "PadIfSmaller", size=8, fill={"others": 3}), T) == [
        T.PadIfSmaller(8, fill={"image": 3, "mask": 3})]  # v2: a plain fill fills masks too
    assert convert(tv("mine", "PadIfSmaller", size=8, fill=0), T) is None
