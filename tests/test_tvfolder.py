"""``fastload.DataLoader`` over an unchanged torchvision ImageFolder / DatasetFolder (issue 30 item 3).

The dataset's own sample list is packed once into ``fastload.open``'s folder cache and its transform converted,
so the loader takes the fast path and gives what torch's DataLoader gives over the same dataset (labels exactly;
pixels within the converter's tolerance for Resize + CenterCrop: a mean difference under 2 levels of 255); what
it cannot honour keeps torch's path with the reason in one FastPathWarning. torchvision's classes are the
stand-ins of ``tvfolder_common.py`` (its module, names, attributes and behaviour); the last test uses the real
ones when torchvision is importable.
"""

from __future__ import annotations

import io
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile
from torch.utils.data import DataLoader as TorchLoader, SubsetRandomSampler

import fastload
import fastload._front.folder_cache as folder_cache
import tvfolder_common as tv
from conftest import jpeg_bytes, make_image_folder

# Resize against torchvision's on PIL, in levels of 255: the mean over the epoch within the bound
# test_transforms.py states for Resize + CenterCrop (2 levels), and each image's within 2.5 (small pictures
# resampled by 1.5-3x); without a resize (decode, crop, PILToTensor) the pixels are equal.
MEAN_LEVELS, IMAGE_LEVELS = 1.5, 2.5


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """Three classes of JPEGs of different sizes, plus a grayscale JPEG and a small PNG (pil_loader makes both
    RGB), in a nested folder of class_1 (torchvision walks class folders recursively); the pack cache in tmp."""
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "cache"))
    root = make_image_folder(tmp_path / "train", classes=3, per_class=4)
    (root / "class_0" / "gray.jpg").write_bytes(jpeg_bytes(70, 50, seed=7, mode="L"))
    smooth = Image.open(io.BytesIO(jpeg_bytes(48, 60, seed=3)))  # resampling noise compares nothing
    smooth.save(root / "class_2" / "small.png")
    (root / "class_1" / "sub").mkdir()
    (root / "class_1" / "sub" / "deep.jpeg").write_bytes(jpeg_bytes(64, 90, seed=11))
    (root / "class_1" / "notes.txt").write_text("not an image")
    return root


def recipe(to_tensor=None):
    return tv.Compose([tv.Resize(36), tv.CenterCrop(32), to_tensor or tv.ToTensor()])


def fast_loader(ds, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = fastload.DataLoader(ds, **kw)
    said = [str(w.message) for w in caught if issubclass(w.category, fastload.FastPathWarning)]
    return loader, said


def assert_same_batches(ours, theirs, exact=False):
    """Labels equal; images equal (``exact``) or within the resize bounds above."""
    assert len(ours) == len(theirs)
    per_image = []
    for (x, y), (rx, ry) in zip(ours, theirs):
        assert x.shape == rx.shape and x.dtype == rx.dtype
        assert torch.equal(y, ry) and y.dtype == ry.dtype, (y, ry)
        if exact:  # uint8 equal; float to rounding (fastload scales by 1/255, torchvision divides by 255)
            assert torch.equal(x, rx) if x.dtype == torch.uint8 else torch.allclose(x, rx, rtol=0, atol=1e-6)
        scale = 1 if x.dtype == torch.uint8 else 255
        per_image.append((x.float() - rx.float()).abs().flatten(1).mean(1) * scale)
    levels = torch.cat(per_image)
    assert levels.mean() < MEAN_LEVELS and levels.max() < IMAGE_LEVELS, levels


def test_imagefolder_takes_the_fast_path_and_gives_torchs_batches(folder):
    ds = tv.ImageFolder(str(folder), transform=recipe())
    assert len(ds) == 15 and ds.classes == ["class_0", "class_1", "class_2"]
    loader, said = fast_loader(ds, batch_size=4, shuffle=False, num_workers=2)
    assert loader.fast_path, loader.fast_path_reason
    assert len(said) == 1 and "ImageFolder" in said[0] and "takes the fast path" in said[0], said
    assert loader.dataset is ds  # loader.dataset, classes, class_to_idx, samples: the user's own
    assert_same_batches(list(loader), list(TorchLoader(ds, batch_size=4, shuffle=False)))
    # the pack holds the dataset's samples in its order: packed sample i is ds[i], with its label
    packed = loader._packed
    assert [packed[i][1] for i in range(len(ds))] == ds.targets
    assert packed.classes == ds.classes


def test_the_pack_is_fastload_opens(folder, monkeypatch):
    """The folder's own listing packs into the entry fastload.open(root) reads (also named './train/', as
    torchvision keeps it), and that open packs nothing."""
    monkeypatch.chdir(folder.parent)
    ds = tv.ImageFolder("./train/", transform=recipe())
    assert ds.samples[0][0].startswith("./train/class_0/")
    loader, _ = fast_loader(ds, batch_size=4)
    monkeypatch.setattr(folder_cache, "_pack", lambda *a, **k: pytest.fail("packed the same folder again"))
    opened = fastload.open(folder)
    assert Path(opened.path) == Path(loader._packed.path)
    sides = [json.loads(p.read_text()) for p in (folder.parent / "cache" / "folders").glob("*.json")]
    assert len(sides) == 1 and "variant" not in sides[0], sides


def test_without_a_resize_the_pixels_are_torchvisions(folder):
    """Decoding (the grayscale JPEG and the PNG made RGB as pil_loader does), CenterCrop and ToTensor/PILToTensor
    give torchvision's values exactly."""
    for to_tensor in (tv.ToTensor(), tv.PILToTensor()):
        ds = tv.ImageFolder(str(folder), transform=tv.Compose([tv.CenterCrop(32), to_tensor]))
        loader, _ = fast_loader(ds, batch_size=4, num_workers=2)
        assert loader.fast_path, loader.fast_path_reason
        assert_same_batches(list(loader), list(TorchLoader(ds, batch_size=4)), exact=True)


def test_samplers_index_the_same_samples(folder):
    """A sampler's indices (here SubsetRandomSampler's, as a Subset or a split would give) pick ds[i]."""
    ds = tv.ImageFolder(str(folder), transform=recipe(tv.PILToTensor()))
    picks = [13, 2, 7, 0, 11, 5]
    loader, _ = fast_loader(ds, batch_size=3, sampler=SubsetRandomSampler(picks, torch.Generator().manual_seed(1)))
    assert loader.fast_path
    order = list(SubsetRandomSampler(picks, torch.Generator().manual_seed(1)))
    ref = [(torch.stack([ds[i][0] for i in order[k:k + 3]]), torch.tensor([ds[i][1] for i in order[k:k + 3]]))
           for k in (0, 3)]
    assert_same_batches(list(loader), ref)


def test_a_dataset_whose_samples_are_not_the_folders_listing(folder):
    """is_valid_file, allow_empty and a sample list edited after construction are honoured: the pack is made of
    the dataset's own list (its own cache entry, beside the folder's, neither removing the other)."""
    (folder / "class_3").mkdir()  # empty: allowed
    ds = tv.ImageFolder(str(folder), transform=recipe(), is_valid_file=lambda p: p.endswith(".jpg"),
                        allow_empty=True)
    ds.samples = ds.imgs = ds.samples[::-1]
    ds.targets = [t for _, t in ds.samples]
    assert ds.classes[-1] == "class_3" and len(ds) == 13
    loader, _ = fast_loader(ds, batch_size=5)
    assert loader.fast_path, loader.fast_path_reason
    assert_same_batches(list(loader), list(TorchLoader(ds, batch_size=5)))
    assert loader._packed.classes == ds.classes
    (folder / "class_3").rmdir()
    plain, _ = fast_loader(tv.ImageFolder(str(folder), transform=recipe()), batch_size=5)
    sides = [json.loads(p.read_text()) for p in (folder.parent / "cache" / "folders").glob("*.json")]
    assert sorted(bool(s.get("variant")) for s in sides) == [False, True], sides
    assert Path(plain._packed.path) != Path(loader._packed.path)


def test_a_datasetfolder_with_torchvisions_loader(folder):
    ds = tv.DatasetFolder(str(folder), tv.pil_loader, extensions=(".jpg", ".jpeg"), transform=recipe())
    loader, said = fast_loader(ds, batch_size=6)
    assert loader.fast_path and "DatasetFolder" in said[0]
    assert_same_batches(list(loader), list(TorchLoader(ds, batch_size=6)))


class Triplets(tv.ImageFolder):
    """A subclass that returns (image, label, path): its __getitem__ is not torchvision's."""

    def __getitem__(self, index):
        image, label = super().__getitem__(index)
        return image, label, self.samples[index][0]


class Batched(tv.ImageFolder):
    """A subclass with a __getitems__ of its own, which torch's fetcher calls for whole batches."""

    def __getitems__(self, indices):
        return [self[i] for i in indices]


def _custom_loader(path):
    return Image.open(path).convert("L").convert("RGB")


def _seed_worker(worker_id):
    np.random.seed(worker_id)


REFUSED = {
    "custom loader": (lambda root: tv.ImageFolder(root, transform=recipe(), loader=_custom_loader), {},
                      r"loader \(_custom_loader\) is not torchvision's default_loader or pil_loader"),
    "target_transform": (lambda root: tv.ImageFolder(root, transform=recipe(), target_transform=lambda t: t + 1), {},
                         "target_transform=.*run on each label"),
    "custom collate_fn": (lambda root: tv.ImageFolder(root, transform=recipe()), {"collate_fn": lambda b: b},
                          "a custom collate_fn"),
    "transform None": (lambda root: tv.ImageFolder(root), {}, "transform=None"),
    # images of different sizes cannot be batched: said before the whole folder is packed for nothing
    "no fixed size": (lambda root: tv.ImageFolder(root, transform=tv.Compose([tv.Resize(36), tv.ToTensor()])), {},
                      r"fixed output size .*RandomResizedCrop\(224\)"),
    "no ToTensor": (lambda root: tv.ImageFolder(root, transform=tv.Compose([tv.Resize(36), tv.CenterCrop(32)])), {},
                    "no ToTensor/PILToTensor/ToImage"),
    "unconvertible": (lambda root: tv.ImageFolder(root, transform=tv.Compose([
        tv.Resize(36), tv.CenterCrop(32), tv.ElasticTransform(), tv.ToTensor()])), {},
        "ElasticTransform has no fastload equivalent"),
    "not torchvision's": (lambda root: tv.ImageFolder(root, transform=lambda img: img), {},
                          r"not converted whole: .*<lambda> \(a callable fastload does not know\)"),
    "own __getitem__": (lambda root: Triplets(root, transform=recipe()), {}, r"Triplets overrides __getitem__"),
    "own __getitems__": (lambda root: Batched(root, transform=recipe()), {}, r"Batched defines __getitems__"),
    "worker_init_fn": (lambda root: tv.ImageFolder(root, transform=recipe()),
                       {"worker_init_fn": _seed_worker, "num_workers": 1}, "worker_init_fn=_seed_worker"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_cannot_be_honoured_keeps_torchs_path_with_the_reason(folder, case):
    make, kw, reason = REFUSED[case]
    ds = make(str(folder))
    loader, said = fast_loader(ds, batch_size=4, **kw)
    assert not loader.fast_path and loader._packed is None
    assert len(said) == 1, said
    assert "cannot take the fast path" in said[0] and "keeps torch's path" in said[0]
    assert re.search(reason, said[0]), said[0]
    assert not (folder.parent / "cache").exists()  # refused before packing anything


def test_a_refused_dataset_gives_what_torch_gives(folder):
    ds = tv.ImageFolder(str(folder), transform=recipe(), target_transform=lambda t: t * 10)
    loader, _ = fast_loader(ds, batch_size=4)
    for (x, y), (rx, ry) in zip(loader, TorchLoader(ds, batch_size=4)):
        assert torch.equal(x, rx) and torch.equal(y, ry)


def test_a_file_that_cannot_be_packed_keeps_torchs_path(folder, monkeypatch):
    """A file PIL reads but the pack refuses (a truncated JPEG, which scripts read with PIL's
    LOAD_TRUNCATED_IMAGES) is said, not raised: torch's path reads it as before."""
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    ds = tv.ImageFolder(str(folder), transform=recipe())
    cut = ds.samples[1][0]
    data = Path(cut).read_bytes()
    Path(cut).write_bytes(data[: len(data) // 2])
    loader, said = fast_loader(ds, batch_size=4)
    assert not loader.fast_path and "could not be packed" in said[0] and Path(cut).name in said[0], said
    assert len(list(loader)) == 4


def test_real_torchvision_imagefolder(folder):
    tvd = pytest.importorskip("torchvision.datasets")
    tvt = pytest.importorskip("torchvision.transforms")
    ds = tvd.ImageFolder(str(folder), transform=tvt.Compose([tvt.Resize(36), tvt.CenterCrop(32), tvt.ToTensor()]))
    loader, said = fast_loader(ds, batch_size=4)
    assert loader.fast_path, said
    assert_same_batches(list(loader), list(TorchLoader(ds, batch_size=4)))


def test_timms_image_dataset_over_a_folder(folder):
    """timm's ImageDataset (ReaderImageFolder: natural-key order, so img_2 before img_10) with torchvision's
    transform: the fast path, in timm's order with timm's labels."""
    for k in (2, 10):
        (folder / "class_1" / f"img_{k}.jpg").write_bytes(jpeg_bytes(60, 80, seed=k))
    ds = tv.ImageDataset(str(folder), transform=recipe())
    names = [Path(p).name for p, _ in ds.reader.samples]
    assert names.index("img_2.jpg") < names.index("img_10.jpg")  # not sorted()'s order
    loader, said = fast_loader(ds, batch_size=4)
    assert loader.fast_path and "ImageDataset" in said[0], said
    assert [loader._packed[i][1] for i in range(len(ds))] == [t for _, t in ds.reader.samples]
    assert_same_batches(list(loader), list(TorchLoader(ds, batch_size=4)))
    for attr, value, reason in (("load_bytes", True, "load_bytes=True"), ("input_img_mode", "L", "input_img_mode")):
        other = tv.ImageDataset(str(folder), transform=recipe(), **{attr: value})
        loader, said = fast_loader(other, batch_size=4)
        assert not loader.fast_path and reason in said[0], said


def test_class_names_that_json_cannot_hold(folder):
    """A dataset's classes need not be strings (ImageNet's are tuples of names; here paths): the pack keeps their
    reprs as names, the labels are the dataset's."""
    ds = tv.ImageFolder(str(folder), transform=recipe())
    ds.classes = [Path(c) for c in ds.classes]
    loader, said = fast_loader(ds, batch_size=8)
    assert loader.fast_path, said
    assert loader._packed.classes == [repr(c) for c in ds.classes]
    assert [loader._packed[i][1] for i in range(len(ds))] == ds.targets
