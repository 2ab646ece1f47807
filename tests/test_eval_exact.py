"""The evaluation transform ``Resize(short side)`` then ``CenterCrop`` (torchvision's classic evaluation, timm's
``create_transform(..., is_training=False)``) computed as torchvision computes it: PIL's whole-image resize, then
whole pixels of that (``Plan.frames``), not one resample of the crop's source box with its origin rounded to a
whole source pixel (a sub-pixel shift where the crop starts between two source pixels: up to tens of levels at
edges). Checked against PIL's own resize-then-crop (pillow here; torchvision's and timm's own objects:
test_eval_exact_real.py), through ``ds[i]``, the loader, ``apply_pil`` and the native calls.

Pillow-SIMD (the project's venv) is matched bit for bit; plain Pillow within eval_exact_common.TOLERANCE."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
import fastload.transforms as T
from fastload._native import native
from eval_exact_common import (
    RECIPES,
    SIZES,
    TOLERANCE,
    files,
    fractional,
    image_folder,
    picture,
    resize_then_crop,
)

Image = pytest.importorskip("PIL.Image", reason="Pillow is required. Run `pip install pillow-simd`")

MODES = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}


def assert_same(got, ref, what: str) -> None:
    got = got.numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    d = np.abs(got.astype(np.int64) - np.asarray(ref).astype(np.int64))
    assert d.max() <= TOLERANCE, f"{what}: max |diff| {d.max()} levels, mean {d.mean():.3f}"


def test_the_test_pictures_start_their_crops_between_source_pixels():
    """Else the tests below could not see a rounded origin."""
    for size, crop in RECIPES:
        assert sum(fractional(h, w, size, crop) for h, w in SIZES) >= len(SIZES) - 1, (size, crop)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return image_folder(tmp_path_factory.mktemp("eval_exact"))


@pytest.mark.parametrize("size,crop", RECIPES)
@pytest.mark.parametrize("mode", MODES)
def test_ds_i_and_the_loader_equal_pils_resize_then_crop(folder, tmp_path, size, crop, mode):
    ds = fastload.open(folder, transforms={"image": [T.Resize(size, interpolation=mode), T.CenterCrop(crop)]},
                       cache_dir=tmp_path / "cache")
    items = files(folder)
    refs = [resize_then_crop(Image.open(p).convert("RGB"), size, crop, MODES[mode]) for p, _ in items]
    for i, ((path, label), ref) in enumerate(zip(items, refs)):
        image, got_label = ds[i]
        assert int(got_label) == label
        assert_same(image.permute(1, 2, 0), ref, f"ds[{i}] ({path.name}, {Image.open(path).size})")
    loader = fastload.DataLoader(ds, batch_size=3, shuffle=False, num_workers=2)
    k = 0
    for images, labels in loader:
        for j in range(images.shape[0]):
            assert int(labels[j]) == items[k][1]
            assert_same(images[j].permute(1, 2, 0), refs[k], f"loader sample {k} ({items[k][0].name})")
            k += 1
    assert k == len(items)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("h,w", SIZES + [(137, 641), (641, 137), (515, 389)])
def test_apply_pil_and_the_native_calls_equal_pils_resize_then_crop(h, w, mode):
    """apply_pil (PIL, what ds[i] mirrors), the raw-pixel native call, a flip after the crop, and sizes whose resize
    downscales past 2x (the weights' precision is Pillow-SIMD's there too)."""
    src = picture(h, w, h * 7 + w)
    img = Image.fromarray(src)
    for size, crop in RECIPES + [(96, 80)]:
        pipe = T.ImagePipeline([T.Resize(size, interpolation=mode), T.CenterCrop(crop)])
        ref = resize_then_crop(img, size, crop, MODES[mode])
        assert_same(T.apply_pil(pipe, img, np.random.default_rng(0)), ref, f"apply_pil {h}x{w} {size}/{crop}")
        p = pipe.plan(np.array([h]), np.array([w]), np.random.default_rng(0))
        assert p.frames is not None
        args = (src, tuple(p.crops[0]), (crop, crop), False, p.interp_of(0))
        assert_same(native().resize_crop(*args, frame=p.frame_of(0)), ref, f"resize_crop {h}x{w} {size}/{crop}")
        flipped = T.ImagePipeline([T.Resize(size, interpolation=mode), T.CenterCrop(crop), T.RandomHorizontalFlip(1)])
        assert_same(T.apply_pil(flipped, img, np.random.default_rng(0)), ref[:, ::-1], "flipped")


def test_plans_carry_frames_only_for_a_resize_then_a_crop():
    """A resize then crops of its pixels gets Plan.frames; everything else keeps the crop boxes alone (the same plans
    and pixels as before frames existed): a crop then a resize (RandomResizedCrop), an exact-size resize, a crop
    alone, two resizes, a CenterCrop that pads."""
    hw = (np.array([301, 427]), np.array([427, 301]))
    rng = np.random.default_rng

    def plan(steps):
        return T.ImagePipeline(steps).plan(*hw, rng(0))

    p = plan([T.Resize(256), T.CenterCrop(224)])
    assert p.frames is not None and p.frames.dtype == np.int32 and p.frames.shape == (2, 8)
    assert p.frames[0].tolist() == [0, 0, 301, 427, 256, 363, 16, 70]  # the box, its resize, the window's corner
    assert p.frames[1].tolist() == [0, 0, 427, 301, 363, 256, 70, 16]
    assert plan([T.Resize(256), T.RandomCrop(200)]).frames is not None  # torchvision's resize then random crop
    assert plan([T.CenterCrop(250), T.Resize(256), T.CenterCrop(224)]).frames[0, :4].tolist() == [26, 88, 250, 250]
    for steps in (
        [T.RandomResizedCrop(224), T.RandomHorizontalFlip()],
        [T.Resize((224, 200))],
        [T.Resize(256)],
        [T.CenterCrop(224)],
        [T.Resize(256), T.CenterCrop(224), T.Resize(200)],  # fused into one resample: the rounded box
        [T.Resize(256), T.CenterCrop(400)],  # pads: a padded window
    ):
        assert plan(steps).frames is None, steps
    q = p.take(1, 2)
    assert q.frames.tolist() == p.frames[1:].tolist() and q.frame_of(0) == tuple(p.frames[1].tolist())


def test_the_native_batch_decoder_takes_frames_and_checks_them(folder):
    """decode_batch with frames equals the single-sample call; a window outside its resize is that sample's error."""
    from fastload.decoders._base import ImageSources

    blobs = [p.read_bytes() for p, _ in files(folder)]
    heights = np.array([Image.open(p).height for p, _ in files(folder)])
    widths = np.array([Image.open(p).width for p, _ in files(folder)])
    p = T.ImagePipeline([T.Resize(160, interpolation="bicubic"), T.CenterCrop(129)]).plan(
        heights, widths, np.random.default_rng(0)
    )
    src = ImageSources.from_bytes(blobs, np.stack([heights, widths], axis=1))
    out = np.zeros((len(blobs), 129, 129, 3), np.uint8)
    assert fastload.decoders.native.NativeDecoder().decode(src, p, out) == []
    for k, b in enumerate(blobs):
        alone = native().decode_crop_resize(b, None, (129, 129), False, True, 1, frame=p.frame_of(k))
        assert np.array_equal(out[k], alone), k
    bad = p.frames.copy()
    bad[1, 7] = bad[1, 5] - 100  # the window passes the resize's right edge
    p.frames = bad
    failed = fastload.decoders.native.NativeDecoder().decode(src, p, out)
    assert [k for k, _ in failed] == [1] and "window" in failed[0][1]
    with pytest.raises(ValueError, match="frame"):
        native().resize_crop(np.zeros((10, 10, 3), np.uint8), None, (4, 4), frame=(0, 0, 10, 10, 0, 8, 0, 0))


@pytest.mark.parametrize("size,crop", [(30, (20, 26)), (45, 37)])
def test_masks_move_as_torchvision_moves_them_with_the_image(size, crop):
    """A mask field follows the same frame: PIL's NEAREST resize of the whole mask, then the crop's pixels (what
    torchvision does to a mask), in the native batch call and the PIL reference (ds[i]); the image bilinear."""
    from fastload._augment.masks import decode_masks, geometry_of, move_mask
    from fastload.fields.mask import encode_png

    rng = np.random.default_rng(0)
    hw = [(41, 57), (57, 41), (33, 35), (64, 47)]
    masks = [rng.integers(0, 6, size=(h // 3 + 1, w // 3 + 1), dtype=np.uint8).repeat(3, 0).repeat(3, 1)[:h, :w]
             for h, w in hw]
    meta = np.array(hw, np.int64)
    ch, cw = (crop, crop) if isinstance(crop, int) else crop
    pipe = T.ImagePipeline([T.Resize(size), T.CenterCrop(crop)])
    plan = pipe.plan(meta[:, 0], meta[:, 1], np.random.default_rng(0))
    assert plan.frames is not None
    pngs = [encode_png(m) for m in masks]
    lengths = np.array([len(p) for p in pngs], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    out = np.zeros((len(masks), ch, cw), np.uint8)
    assert decode_masks(native().Pool(0), ([b"".join(pngs)], np.zeros(len(pngs), np.int64), offsets, lengths),
                        meta, plan, out) == []
    geometry = geometry_of(plan)
    for k, m in enumerate(masks):
        h, w = m.shape
        nh, nw = (int(size * h / w), size) if w <= h else (size, int(size * w / h))
        top, left = int(round((nh - ch) / 2.0)), int(round((nw - cw) / 2.0))
        ref = np.asarray(Image.fromarray(m).resize((nw, nh), Image.NEAREST).crop((left, top, left + cw, top + ch)))
        assert np.array_equal(out[k], ref), (k, int((out[k] != ref).sum()))
        assert np.array_equal(move_mask(m, geometry, k, frame=plan.frame_of(k)), ref), k


@pytest.mark.parametrize("mode", MODES)
def test_exact_size_resizes_are_pils_at_any_scale(mode):
    """A resize to an exact size (no crop) is PIL's bit for bit, downscales past 2x included, where the weights get
    more than 15 fractional bits (Pillow-SIMD's rule: as many as int16 allows, up to 22)."""
    rng = np.random.default_rng(1)
    for _ in range(12):
        h, w = (int(v) for v in rng.integers(60, 420, 2))
        src = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        for oh, ow in ((int(rng.integers(8, h + 1)), int(rng.integers(8, w + 1))), (h // 3 + 1, w), (h, w // 5 + 1)):
            ref = Image.fromarray(src).resize((ow, oh), MODES[mode])
            got = native().resize_crop(src, None, (oh, ow), False, 1 if mode == "bicubic" else 0)
            assert_same(got, ref, f"{h}x{w} -> {oh}x{ow}")
