"""fields/mask.py: segmentation masks (uint8 class ids, PNG), packed losslessly and moved with their image's plan
(nearest, fill 255, no pixel operations) by ds[i] and by the loader."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload import Field
from fastload import transforms as T
from fastload.fields import Column, NotFastPath
from fastload.fields.image import FileImage
from fastload.fields.mask import MASK

from conftest import resumed_and_reference
from misuse.conftest import user_error
from .conftest import Samples, batches

SCHEMA = {"image": Field("image", "image"), "mask": Field("mask", "mask")}
LEVEL = 60  # an image pixel is its mask's label * LEVEL: alignment is checkable pixel by pixel


def blobs(h: int, w: int, seed: int, labels: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    m = np.zeros((h, w), np.uint8)
    for label in range(1, labels + 1):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(6, 14)
        m[(y - cy) ** 2 + (x - cx) ** 2 < r * r] = label
    return m


def segmentation_samples(n: int = 12) -> list[dict]:
    """Images whose pixels are their masks' labels times LEVEL (a mask derived from its image), sizes vary."""
    out = []
    for i in range(n):
        m = blobs(40 + i, 50 + 2 * i, i)
        out.append({"image": np.repeat((m * LEVEL)[..., None], 3, axis=2), "mask": m, "y": i})
    return out


@pytest.fixture
def segmentation(pack_samples):
    samples = segmentation_samples()
    return pack_samples(samples, schema=SCHEMA, image_mode="raw"), samples


def test_layout_and_column_checks():
    f = Field("m", "mask")
    assert MASK.columns(f) == (Column("meta", np.dtype("<u4"), (2,)),) and MASK.has_blob(f)
    assert repr(f) == "Field('m', 'mask')" and Field.from_json(f.to_json()) == f
    assert MASK.describe(f) == " uint8 class ids, PNG"  # fastload inspect: "mask uint8 class ids, PNG"
    assert MASK.check_columns(f, {"meta": np.array([[4, 5]], dtype="<u4")}) is None
    assert MASK.check_columns(f, {"meta": np.array([[4, 5], [0, 5]], dtype="<u4")}, first=3) == \
        "sample 4: mask size 0x5 is impossible (each side must be 1..2147483647)"


def test_pack_keeps_class_ids_from_every_input(pack_samples, tmp_path):
    """L and P PNG files (P: palette indices, not colours), PNG bytes, PIL images, arrays and tensors."""
    ids = blobs(9, 11, 0, labels=5)
    ids[0, 0] = 200
    palette = Image.fromarray(ids, "P")
    palette.putpalette(list(np.random.default_rng(1).integers(0, 256, 768)))  # VOC-style colours
    p_file, l_file = tmp_path / "p.png", tmp_path / "l.png"
    palette.save(p_file)
    Image.fromarray(ids, "L").save(l_file)
    values = [FileImage(p_file), FileImage(l_file), l_file.read_bytes(), palette, Image.fromarray(ids, "L"), ids,
              torch.from_numpy(ids)]
    path = pack_samples([{"m": v} for v in values], schema={"m": Field("m", "mask")})
    ds = fastload.open(path)
    for i in range(len(values)):
        got = ds[i][0]
        assert got.dtype == torch.uint8 and np.array_equal(got.numpy(), ids), i
    stored = fastload.open(path, decode=False)[0][0]
    assert Image.open(io.BytesIO(stored)).format == "PNG" and Image.open(io.BytesIO(stored)).mode == "L"


@pytest.mark.parametrize("value, words", [
    (np.zeros((4, 4, 3), np.uint8), ["field 'm'", "Samples[1]", "(H, W)", "(4, 4, 3)"]),
    (np.zeros((4, 4), np.float32), ["field 'm'", "Samples[1]", "uint8", "float32"]),
    (Image.new("RGB", (4, 4)), ["field 'm'", "Samples[1]", "single-channel", "'RGB'"]),
    (b"\xff\xd8 not a png", ["field 'm'", "Samples[1]", "PNG"]),
    (b"\x89PNG\r\n\x1a\n broken", ["field 'm'", "Samples[1]", "does not decode"]),
    ("labels.png", ["field 'm'", "Samples[1]", "str"]),
])
def test_pack_refuses_what_is_not_a_mask(tmp_path, value, words):
    samples = Samples([{"m": np.zeros((4, 4), np.uint8)}, {"m": value}])
    with user_error(Exception, *words):
        fastload.pack(samples, tmp_path / "ds", schema={"m": Field("m", "mask")}, workers=0)


def _interior(mask: np.ndarray) -> np.ndarray:
    """Pixels whose 7x7 neighbourhood has one label: there a bilinear image (upscaled by at most 1.5: 1 source pixel
    of support, half a pixel where nearest rounds) equals its label exactly."""
    p = np.pad(mask.astype(np.int32), 3, mode="edge")
    same = np.ones(mask.shape, bool)
    for dy in range(7):
        for dx in range(7):
            same &= p[dy:dy + mask.shape[0], dx:dx + mask.shape[1]] == mask
    return same


def assert_aligned(image: torch.Tensor, mask: torch.Tensor, filled_image: int = 0) -> None:
    """The image (CHW, its pixels LEVEL * label) and its mask moved together: the interior of every labelled
    region shows its label in the image, and where the mask is 255 (padding, rotation) the image is the fill."""
    im, m = image[0].numpy().astype(int), mask.numpy().astype(int)
    assert im.shape == m.shape
    inner = _interior(m) & (m != 255)
    assert inner.mean() > 0.15
    assert np.array_equal(im[inner], m[inner] * LEVEL)
    assert np.all(im[_interior(m) & (m == 255)] == filled_image)


RECIPE = [T.Resize(36), T.RandomHorizontalFlip(), T.RandomCrop(48, padding=6, pad_if_needed=True)]
ROTATED = [T.RandomResizedCrop(32, scale=(0.5, 1.0)), T.RandomRotation(30), T.RandomVerticalFlip(),
           T.RandomHorizontalFlip()]


def test_ds_i_without_transforms_is_the_stored_mask(segmentation):
    path, samples = segmentation
    ds = fastload.open(path, as_dict=True)
    assert np.array_equal(ds[3]["mask"].numpy(), samples[3]["mask"])


@pytest.mark.parametrize("recipe", [RECIPE, ROTATED], ids=["segmentation", "rotated"])
def test_ds_i_moves_the_mask_with_its_image(segmentation, recipe):
    """torchvision's segmentation reference (resize, flip, padded RandomCrop: mask padding 255, image 0) and a
    rotation: the mask stays on its image's content."""
    path, _ = segmentation
    ds = fastload.open(path, as_dict=True, transforms={"image": recipe})
    torch.manual_seed(0)
    seen_fill = 0
    for i in range(len(ds)):
        s = ds[i]
        assert s["mask"].dtype == torch.uint8 and s["mask"].shape == s["image"].shape[1:]
        assert set(np.unique(s["mask"].numpy())) <= {0, 1, 2, 3, 255}
        assert_aligned(s["image"], s["mask"])
        seen_fill += int((s["mask"] == 255).sum())
    assert seen_fill > 0  # the padding and the rotation did fill
    torch.manual_seed(5)
    a = ds[2]
    torch.manual_seed(5)
    b = ds[2]
    assert torch.equal(a["mask"], b["mask"]) and torch.equal(a["image"], b["image"])


def test_the_mask_may_come_before_its_image(pack_samples):
    samples = [{"mask": s["mask"], "image": s["image"]} for s in segmentation_samples(4)]
    path = pack_samples(samples, schema=SCHEMA, image_mode="raw")
    ds = fastload.open(path, as_dict=True, transforms={"image": RECIPE})
    for i in range(len(ds)):
        s = ds[i]
        assert_aligned(s["image"], s["mask"])
    for b in batches(ds, 4):
        for k in range(len(b["mask"])):
            assert_aligned(b["image"][k], b["mask"][k])


EXACT = [T.CenterCrop(36), T.RandomHorizontalFlip(), T.RandomCrop(40, padding=4, pad_if_needed=True),
         T.RandomRotation(25), T.RandomVerticalFlip()]  # no resize, nearest rotation: images exact too


@pytest.mark.parametrize("recipe", [RECIPE, ROTATED], ids=["segmentation", "rotated"])
def test_loader_batches_move_masks_with_their_images(segmentation, recipe):
    path, _ = segmentation
    ds = fastload.open(path, as_dict=True, transforms={"image": recipe})
    got = batches(ds, 5)
    assert [tuple(b["mask"].shape) for b in got][0][1:] == tuple(got[0]["image"].shape[2:])
    for b in got:
        assert b["mask"].dtype == torch.uint8
        for k in range(len(b["mask"])):
            assert_aligned(b["image"][k], b["mask"][k])
    for s in ds.__getitems__([0, 3, 7]):  # torch's DataLoader's batch call: the same native batch
        assert s["mask"].shape == s["image"].shape[1:]
        assert_aligned(s["image"], s["mask"])


def test_loader_masks_are_the_image_exactly_under_nearest_geometry(segmentation):
    """No resize, a padded crop, flips and a nearest rotation: every image pixel is its mask's label * LEVEL, and
    the fill (image 0, mask 255) covers the same pixels."""
    path, _ = segmentation
    ds = fastload.open(path, as_dict=True, transforms={"image": EXACT})
    for b in batches(ds, 6):
        im, m = b["image"][:, 0].numpy().astype(int), b["mask"].numpy().astype(int)
        assert (m == 255).any()
        filled = m == 255
        assert np.mean(im[~filled] == m[~filled] * LEVEL) > 0.995  # nearest: pixel-edge ties only
        assert np.mean(im[filled] == 0) > 0.995


def test_workers_and_resume_give_the_same_masks(pack_samples):
    """num_workers 0 vs 2, and a mid-epoch resume (conftest's ``resumed_and_reference``, which compares each
    batch's first entry: here the mask, packed first)."""
    samples = [{"mask": s["mask"], "image": s["image"]} for s in segmentation_samples()]
    path = pack_samples(samples, schema=SCHEMA, image_mode="raw")

    def make(workers):
        ds = fastload.open(path, transforms={"image": ROTATED + [T.ColorJitter(0.3)]})
        return fastload.DataLoader(ds, batch_size=2, shuffle=True, seed=3, num_workers=workers)

    ref = [b[0].clone() for b in make(0)]
    assert ref[0].shape == (2, 32, 32) and all(torch.equal(a, b[0]) for a, b in zip(ref, make(2)))
    got, want = resumed_and_reference(make, 2, done=3)
    assert len(got) == len(want) == len(ref) - 3 and all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_mask_of_another_size_than_its_image_is_refused_at_open(pack_samples):
    """Knowable from the stored sizes, so refused by fastload.open for every such sample (issue 27 item 2), not at
    the batch that holds it (where on_error='skip' used to replace it)."""
    samples = segmentation_samples(4)
    samples[2]["mask"] = samples[2]["mask"][:-1]
    path = pack_samples(samples, schema=SCHEMA, image_mode="raw")
    with user_error(ValueError, "sample 2: mask 41x54, image 42x54", "mask field 'mask'", "its image's size"):
        fastload.open(path, as_dict=True, transforms={"image": RECIPE})
    assert tuple(fastload.open(path, as_dict=True)[2]["mask"].shape) == (41, 54)  # untransformed: as stored


def test_which_image_a_mask_follows_is_never_guessed(pack_samples):
    samples = [dict(s, other=s["image"]) for s in segmentation_samples(2)]
    path = pack_samples(samples, schema=dict(SCHEMA, other=Field("other", "image")), image_mode="raw")
    two = {"image": [T.CenterCrop(20)], "other": [T.CenterCrop(20)]}
    ds = fastload.open(path, as_dict=True, transforms=two)
    with user_error(fastload.DecodeError, "mask field 'mask'", "image, other"):
        ds[0]
    with pytest.raises(NotFastPath, match="mask field 'mask' follows its image's transforms, but 2 fields"):
        MASK.batch(ds.schema["mask"], ds)


def test_a_corrupt_mask_png_in_a_shard_fails_its_sample(tmp_path):
    """The native decoder's failure reaches the user as ds[i]'s and the loader's DecodeError naming the sample and
    field; on_error='skip' replaces the sample."""
    path = tmp_path / "ds"
    fastload.pack(Samples(segmentation_samples(6)), path, schema=SCHEMA, image_mode="raw", workers=0)
    png = fastload.open(path, as_dict=True, decode=False)[2]["mask"]
    shard = next(path.glob("*.fls"))
    data = bytearray(shard.read_bytes())
    at = data.find(png) + png.index(b"IDAT") + 8
    data[at + 2: at + 6] = b"\xff\xff\xff\xff"  # inside the zlib stream
    shard.write_bytes(bytes(data))
    ds = fastload.open(path, as_dict=True, transforms={"image": RECIPE})
    with user_error(fastload.DecodeError, "sample 2", "field 'mask'", "does not decode"):
        ds[2]
    with user_error(fastload.DecodeError, "sample 2", "field 'mask'", "does not decode"):
        batches(ds, 3)
    got = batches(ds, 3, on_error="skip")
    assert sum(len(b["mask"]) for b in got) == 6
    for b in got:
        for k in range(len(b["mask"])):
            assert_aligned(b["image"][k], b["mask"][k])  # the replacement moved with its own image


def test_verify_decodes_every_mask(tmp_path, pack_samples):
    """A shard whose checksum agrees (a packer bug, a crafted file) but whose mask PNG does not decode fails
    ``fastload verify``, naming the sample and field; sound datasets in both formats pass."""
    import json

    from fastload.formats.shards import file_digest

    good = pack_samples(segmentation_samples(4), schema=SCHEMA, image_mode="raw")
    assert _verify(good) == []
    path = tmp_path / "ds"
    fastload.pack(Samples(segmentation_samples(4)), path, schema=SCHEMA, image_mode="raw", workers=0)
    png = fastload.open(path, as_dict=True, decode=False)[3]["mask"]
    shard = next(path.glob("*.fls"))
    data = bytearray(shard.read_bytes())
    at = data.find(png) + png.index(b"IDAT") + 8
    data[at + 2: at + 6] = b"\xff\xff\xff\xff"
    shard.write_bytes(bytes(data))
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["shards"][0]["xxh3_64"] = file_digest(shard)[1]
    (path / "manifest.json").write_text(json.dumps(manifest))
    found = _verify(path)
    assert len(found) == 1 and "sample 3: field 'mask': mask PNG does not decode" in found[0], found


def _verify(path):
    from fastload.formats.reader import read_manifest, verify

    return verify(path, read_manifest(path))


def test_field_mask_is_the_mask_kind():
    assert Field.mask("m") == Field("m", "mask") and Field.mask("m").kind == "mask"
