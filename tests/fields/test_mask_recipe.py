"""torchvision's segmentation reference recipe on the fast path (RandomResize, flip, RandomCrop with a fill per kind:
image 0, mask 255), and each transform's mask fill (``fill={"image": .., "mask": ..}``, ``_augment/type_fill.py``)
reaching the native masks (csrc/mask.cc) and the PIL reference (``run_pil_mask``) alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
from fastload import _C
from fastload import transforms as T
from fastload._augment.torchvision_convert import convert
from fastload.decoders._base import ImageSources
from fastload.decoders.native import NativeDecoder
from fastload.fields.image import IMAGE_RAW
from fastload._augment.masks import decode_masks, geometry_of, move_mask
from fastload.fields.mask import encode_png
from fastload.transforms import ImagePipeline

from .test_mask import LEVEL, SCHEMA, _interior, blobs, segmentation_samples
from .test_mask_native import sources

BASE, CROP = 40, 48
# references/segmentation/presets.py: RandomResize(int(0.5 * base), int(2.0 * base)), flip, then the crop with the
# mask padded with 255 and the image with 0 (fastload's spelling of v2's {tv_tensors.Image: 0, tv_tensors.Mask: 255})
RECIPE = [T.RandomResize(int(0.5 * BASE), int(2.0 * BASE)), T.RandomHorizontalFlip(0.5),
          T.RandomCrop(CROP, pad_if_needed=True, fill={"image": 0, "mask": 255})]
LABELS = {0, 1, 2, 3}
V2 = "torchvision.transforms.v2._geometry"


class Mode:  # torchvision's InterpolationMode: its ``value`` is the name
    def __init__(self, value: str) -> None:
        self.value = value


def tv(module: str, name: str, **attrs):
    """A stand-in for torchvision's ``module.name`` with ``attrs`` (as tests/augment/test_torchvision_convert.py)."""
    obj = type(name, (), {"__module__": module, "__call__": lambda self, img: img})()
    obj.__dict__.update(attrs)
    return obj


def assert_aligned(image: torch.Tensor, mask: torch.Tensor) -> None:
    """Image (CHW, pixels LEVEL * label) and mask moved together: away from label edges the image shows the mask's
    label, and 0 where the mask shows the padding's 255. (The resize may shrink a sample's content to a corner of
    its tile: no share of the tile is asked for.)"""
    im, m = image[0].numpy().astype(int), mask.numpy().astype(int)
    inner = _interior(m)
    assert np.array_equal(im[inner & (m != 255)], m[inner & (m != 255)] * LEVEL)
    assert np.all(im[inner & (m == 255)] == 0)


@pytest.fixture
def segmentation(pack_samples):
    samples = segmentation_samples(16)
    return pack_samples(samples, schema=SCHEMA, image_mode="raw"), samples


def native_sample(ds, i: int, plan):
    """Sample i's image and mask by the native engines (the decoder, csrc/mask.cc) executing ``plan``."""
    seg, local = ds.locate(i)
    h, w = (int(v) for v in seg.row("image", "meta", local)[:2])
    image = np.zeros((1, CROP, CROP, 3), np.uint8)
    sources_ = ImageSources.from_bytes([bytes(seg.blob("image", local))], [[h, w]], IMAGE_RAW)
    assert NativeDecoder().decode(sources_, plan, image) == []
    mask = np.zeros((1, CROP, CROP), np.uint8)
    assert decode_masks(_C.Pool(1), sources([bytes(seg.blob("mask", local))]), np.array([[h, w]]), plan, mask) == []
    return image[0], mask[0]


def ds_i_equals_the_native_engines(path, transforms):
    """For each sample i: ds[i] against the native decoder and csrc/mask.cc given ds[i]'s own plan (one seed of
    torch's generator, fields/_codec.py draw_plan): masks and images equal (a padded window is assembled from the
    same decoded box: the bound is 0), labels kept, image and mask aligned. Yields (plan, native mask)."""
    ds = fastload.open(path, as_dict=True, transforms={"image": transforms})
    pipe = ds.pipelines["image"]
    for i in range(len(ds)):
        torch.manual_seed(i)
        s = ds[i]
        torch.manual_seed(i)  # ds[i]'s plan: one seed of torch's generator (fields/_codec.py draw_plan)
        rng = np.random.default_rng(int(torch.randint(0, 2**62, ()).item()))
        seg, local = ds.locate(i)
        h, w = (int(v) for v in seg.row("image", "meta", local)[:2])
        plan = pipe.plan(np.array([h]), np.array([w]), rng)
        image, mask = native_sample(ds, i, plan)
        assert np.array_equal(mask, s["mask"].numpy()), i
        assert np.abs(image.astype(int) - s["image"].permute(1, 2, 0).numpy().astype(int)).max() == 0, i
        assert set(np.unique(mask)) <= LABELS | {255}
        assert_aligned(s["image"], s["mask"])
        yield plan, mask


def test_ds_i_is_the_native_engines_result_of_the_reference_recipe(segmentation):
    """ds[i] (the PIL reference for the padded window and the flip, ``run_pil_mask`` for the mask) against the native
    decoder and csrc/mask.cc given ds[i]'s own plan: masks equal bit for bit, images too (the padded window is
    assembled from the same decoded box: the existing bound for a padded RandomCrop is 0), and aligned."""
    path, _ = segmentation
    padded = [bool((mask == 255).any()) for _, mask in ds_i_equals_the_native_engines(path, RECIPE)]
    assert 0 < sum(padded) < len(padded)  # some samples were resized below the crop and padded, some not


def recorded_plans(monkeypatch) -> list:
    plans = []
    original = ImagePipeline.plan

    def record(self, heights, widths, rng):
        p = original(self, heights, widths, rng)
        plans.append(p)
        return p

    monkeypatch.setattr(ImagePipeline, "plan", record)
    return plans


def test_loader_runs_the_reference_recipe_natively_equal_to_the_reference(segmentation, monkeypatch):
    """The loader's batches (the fast path: the batcher, one native call per field): every mask is the PIL
    reference's (``move_mask``) of the plan the loader drew, bit for bit, padded with 255 where its image shows 0."""
    path, samples = segmentation
    ds = fastload.open(path, as_dict=True, transforms={"image": RECIPE})
    plans = recorded_plans(monkeypatch)
    seen = 0
    for b, batch in enumerate(fastload.DataLoader(ds, batch_size=5, num_workers=0, seed=2)):
        plan = plans.pop(0)
        assert batch["mask"].shape == (len(batch["mask"]), CROP, CROP) and batch["mask"].dtype == torch.uint8
        geometry = geometry_of(plan)
        for k in range(len(batch["mask"])):
            stored = samples[5 * b + k]["mask"]
            ref = move_mask(stored, geometry, k)
            assert np.array_equal(batch["mask"][k].numpy(), ref), (b, k)
            assert_aligned(batch["image"][k], batch["mask"][k])
            seen += int((ref == 255).sum())
    assert seen > 0


def test_the_torchvision_v2_recipe_converts_to_the_same_pipeline():
    """torchvision v2's objects (stand-ins with its module, names and attributes; the fill keyed by the classes
    tv_tensors.Image and tv_tensors.Mask) become the recipe above."""
    Image = type("Image", (), {"__module__": "torchvision.tv_tensors._image"})
    Mask = type("Mask", (), {"__module__": "torchvision.tv_tensors._mask"})
    v2 = tv("torchvision.transforms.v2._container", "Compose", transforms=[
        tv(V2, "RandomResize", min_size=20, max_size=80, interpolation=Mode("bilinear"), antialias=True),
        tv(V2, "RandomHorizontalFlip", p=0.5),
        tv(V2, "RandomCrop", size=(CROP, CROP), padding=None, pad_if_needed=True,
           fill={Image: 0, Mask: 255}, padding_mode="constant")])
    assert ImagePipeline(v2) == ImagePipeline(RECIPE)


# -- each transform's mask fill ------------------------------------------------------------------------------

def fills_seen(pipeline: list, seed: int = 0) -> tuple[set, np.ndarray]:
    """The values a batch of moved masks (labels 0..5) shows beyond its labels, natively; asserting the native masks
    equal the PIL reference's."""
    rng = np.random.default_rng(seed)
    masks = [blobs(int(rng.integers(20, 50)), int(rng.integers(20, 50)), seed * 50 + i, labels=5) for i in range(12)]
    meta = np.array([m.shape for m in masks], np.int64)
    pipe = ImagePipeline(pipeline)
    plan = pipe.plan(meta[:, 0], meta[:, 1], np.random.default_rng(seed))
    out = np.zeros((12,) + pipe.output_size, np.uint8)
    assert decode_masks(_C.Pool(2), sources([encode_png(m) for m in masks]), meta, plan, out) == []
    geometry = geometry_of(plan)
    for k, m in enumerate(masks):
        assert np.array_equal(out[k], move_mask(m, geometry, k)), k
    return set(np.unique(out)) - set(range(6)), out


@pytest.mark.parametrize("name, pipeline, expected", [
    ("crop per kind", [T.RandomCrop(56, pad_if_needed=True, fill={"image": 9, "mask": 200})], {200}),
    ("crop plain fill: the image's", [T.RandomCrop(56, pad_if_needed=True, fill=9)], {255}),
    ("crop others", [T.RandomCrop(56, pad_if_needed=True, fill={"image": 9, "others": 77})], {77}),
    ("rotation per kind", [T.CenterCrop(20), T.RandomRotation(60, fill={"image": 1, "mask": 250})], {250}),
    ("affine per kind", [T.CenterCrop(20), T.RandomAffine(40, translate=(0.3, 0.3), fill={"mask": 99})], {99}),
    ("window and affine apart", [T.RandomCrop(56, pad_if_needed=True, fill={"mask": 200}),
                                 T.RandomRotation(60, fill={"mask": 250})], {200, 250}),
])
def test_each_transform_gives_the_mask_its_own_fill(name, pipeline, expected):
    """Natively and by the reference: fails when the mask fill is dropped (255 everywhere) or when the window's and
    the affine's fills are one value for the batch (the last case)."""
    seen, _ = fills_seen(pipeline)
    assert seen == expected, name


def test_a_fill_per_kind_fills_the_image_with_its_own():
    plan = ImagePipeline([T.RandomCrop(56, pad_if_needed=True, fill={"image": (9, 8, 7), "mask": 200}),
                          T.RandomRotation(30, fill={"image": 4})]).plan(np.full(2, 30), np.full(2, 30),
                                                                         np.random.default_rng(0))
    geo = plan.augment.geometry
    assert np.array_equal(geo.pad.fill, [[9, 8, 7]] * 2) and np.array_equal(geo.pad.mask_fill, [200, 200])
    assert np.array_equal(geo.fill, [[4, 4, 4]] * 2) and np.array_equal(geo.mask_fill, [255, 255])


@pytest.mark.parametrize("fill, words", [
    ({"Image": 0}, "key 'Image'"),
    ({"mask": 256}, "integer in [0, 255]"),
    ({"mask": 2.5}, "integer in [0, 255]"),
    ({"mask": (1, 2, 3)}, "a mask has one channel"),
    ({"mask": float("nan")}, "integer in [0, 255]"),
])
def test_a_bad_fill_per_kind_is_refused_by_name(fill, words):
    for make in (lambda: T.RandomCrop(8, padding=2, fill=fill), lambda: T.RandomRotation(10, fill=fill),
                 lambda: T.RandomAffine(10, fill=fill)):
        with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
            make()


def test_torchvision_fills_keep_their_meaning():
    """v2 fills every type with a plain fill and a dict's missing types with 'others', else zeros (its _get_fill),
    so a converted v2 transform fills masks as torchvision does; v1 transforms never see masks: the image's only."""
    Image = type("Image", (), {})
    Mask = type("Mask", (), {})
    Video = type("Video", (), {})

    def rotation(module, fill):
        return convert(tv(module, "RandomRotation", degrees=[-10.0, 10.0], interpolation=Mode("nearest"), expand=False,
                          center=None, fill=fill), T)[0]

    assert rotation(V2, 7).fill == {"image": 7, "mask": 7}
    assert rotation(V2, {Image: 3, Mask: 255}).fill == {"image": 3, "mask": 255}
    assert rotation(V2, {Mask: 255, "others": 4}).fill == {"image": 4, "mask": 255}
    assert rotation(V2, {Image: 3}).fill == {"image": 3, "mask": 0}
    assert rotation(V2, (1, 2, 3)).fill == (1, 2, 3)  # per channel: torchvision cannot fill a mask so
    assert rotation("torchvision.transforms.transforms", 7).fill == 7  # v1: the image's; the mask keeps 255
    kept = rotation(V2, {Image: 3, Video: 1})
    assert "fills images and masks only" in kept.reason  # runs per sample, saying why


@pytest.mark.parametrize("fill, words", [
    (256, "fill: 256 is outside"), (-1, "fill: -1 is outside"), (1 << 70, "fill: 1180591620717411303424 is outside"),
    (np.full((1, 2), 300), "fill: value 300 at flat position 0 is outside"),
    (np.zeros((1, 3), np.uint8), r"fill: expected shape \(1, 2\)"), (np.zeros(2, np.uint8), r"fill: expected shape"),
])
def test_the_native_call_refuses_a_bad_fill_by_name(fill, words):
    """csrc/bind_mask.cc: one int in [0, 255], or (n, 2) per sample (the window's, the affine's)."""
    png = encode_png(blobs(8, 8, 0))
    one = np.ones(1, np.uint8)
    with pytest.raises(ValueError, match=words):
        _C.decode_mask_batch(_C.Pool(0), [png], np.zeros(1, np.int64), np.zeros(1, np.int64), np.array([len(png)]),
                             np.array([[8, 8]]), np.array([[0, 0, 8, 8]]), np.array([[8, 8]]), one * 0,
                             np.zeros((1, 8), np.int32), np.zeros((1, 8), np.int32), one * 0, one * 0, one * 0,
                             np.zeros((1, 6)), fill, np.zeros((1, 8, 8), np.uint8))


def test_a_v2_policy_with_a_fill_per_type_converts_with_the_images():
    """torchvision's auto-augment policies fill the image only: a v2 TrivialAugmentWide with {Image: 4, Mask: 255}
    converts with 4 (it ran per sample before, its dict refused as the image's fill)."""
    Image = type("Image", (), {})
    Mask = type("Mask", (), {})
    got = convert(tv("torchvision.transforms.v2._auto_augment", "TrivialAugmentWide", num_magnitude_bins=31,
                     interpolation=Mode("nearest"), fill={Image: 4, Mask: 255}), T)
    assert len(got) == 1 and got[0] == T.TrivialAugmentWide(fill=4)
    got = convert(tv("torchvision.transforms.v2._auto_augment", "TrivialAugmentWide", num_magnitude_bins=31,
                     interpolation=Mode("nearest"), fill={Mask: 255, "others": 6}), T)
    assert got[0] == T.TrivialAugmentWide(fill=6)
