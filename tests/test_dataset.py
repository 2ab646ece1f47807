"""fastload/_front/dataset.py: ``fastload.open`` gives a map-style Dataset, the same for shards and LMDB (each test runs
once per format): samples against the source pictures, indexing and its errors, as_dict and decode=False,
transforms seeded by torch, which fields take transforms, and pickling for worker processes."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

import fastload
from fastload import transforms as T

from conftest import pil_rgb


def source_files(packed) -> list:
    """The packed pictures in the order ImageFolder gives them: class by class, file names sorted."""
    return sorted((packed.parent / "src").rglob("*.jpg"))


def test_samples_are_the_source_pictures_and_labels(packed_images):
    ds = fastload.open(packed_images)
    files = source_files(packed_images)
    assert len(ds) == len(files) == 48 and ds.format == packed_images.name
    assert ds.classes == ["class_0", "class_1", "class_2", "class_3"] and ds.metadata["source"] == "imagefolder"
    assert repr(ds).startswith(f"fastload.Dataset('{packed_images}', 48 samples, {packed_images.name}, Schema(")
    for i in (0, 13, 47):
        image, label = ds[i]
        ref = pil_rgb(files[i].read_bytes())
        assert label == int(files[i].parent.name.split("_")[1])
        assert image.dtype == torch.uint8 and image.shape == (3,) + ref.shape[:2]
        assert np.array_equal(image.permute(1, 2, 0).numpy(), ref)  # the same libjpeg-turbo decoder as PIL


def test_indexing_like_a_sequence(packed_images):
    ds = fastload.open(packed_images)
    assert ds[-1][1] == ds[47][1] == 3 and ds[np.int64(5)][1] == ds[5][1]
    assert torch.equal(ds[-48][0], ds[0][0])
    with pytest.raises(IndexError, match="sample index 48 out of range for a dataset of 48 samples"):
        ds[48]
    with pytest.raises(IndexError, match="sample index -49 out of range"):
        ds[-49]
    for bad in ("1", 1.0, True, slice(0, 2)):
        with pytest.raises(TypeError, match="dataset indices must be integers"):
            ds[bad]


def test_as_dict_and_stored_bytes(packed_images):
    files = source_files(packed_images)
    sample = fastload.open(packed_images, as_dict=True)[7]
    assert list(sample) == ["image", "label"] and sample["label"] == 0
    raw = fastload.open(packed_images, decode=False)
    assert raw[7] == (files[7].read_bytes(), 0)  # small JPEGs are stored untouched


def test_transforms_draw_from_torch_s_generator(packed_images):
    ds = fastload.open(packed_images, transforms={"image": [T.RandomResizedCrop(16), T.RandomHorizontalFlip()]})
    torch.manual_seed(3)
    first = [ds[i][0] for i in range(6)]
    torch.manual_seed(3)
    again = [ds[i][0] for i in range(6)]
    torch.manual_seed(4)
    other = [ds[i][0] for i in range(6)]
    assert all(x.shape == (3, 16, 16) for x in first)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))
    with pytest.raises(ValueError, match=r"transforms name field 'label', .* those fields here: \['image'\]"):
        fastload.open(packed_images, transforms={"label": [T.RandomHorizontalFlip()]})


def test_a_pickled_dataset_reopens_its_files(packed_images):
    ds = fastload.open(packed_images, as_dict=True, transforms={"image": [T.Resize((20, 30))]})
    state = ds.__getstate__()
    assert state["_reader"] is None and "_segments" not in state  # nothing mapped travels (the reader owns the segments)
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.as_dict and len(clone) == len(ds)
    for i in (0, 30):
        a, b = ds[i], clone[i]
        assert torch.equal(a["image"], b["image"]) and a["image"].shape == (3, 20, 30) and a["label"] == b["label"]
    ds.close()
    assert clone[47]["label"] == 3  # the clone's files are its own
