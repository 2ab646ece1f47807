"""fields/image.py: image fields (meta column + JPEG or raw blob), decoded by ds[i] and by the batcher."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
from fastload import Field
from fastload.fields import Column, NotFastPath
from fastload.fields.image import IMAGE, IMAGE_JPEG, IMAGE_RAW, ImagePart
from fastload.transforms import CenterCrop, Resize, ToDtype

from .conftest import batches


def test_layout_and_column_checks():
    f = Field.image("im")
    assert IMAGE.columns(f) == (Column("meta", np.dtype("<u4"), (3,)),) and IMAGE.has_blob(f)
    meta = np.array([[4, 5, IMAGE_RAW], [4, 5, IMAGE_JPEG]], dtype="<u4")
    assert IMAGE.expected_blob_length(f, {"meta": meta}).tolist() == [60, -1]
    assert IMAGE.check_columns(f, {"meta": meta}) is None
    assert IMAGE.check_columns(f, {"meta": np.array([[4, 5, 7]], dtype="<u4")}, first=3) == \
        "sample 3: image encoding 7 is not 0 (jpeg) or 1 (raw)"
    assert IMAGE.check_columns(f, {"meta": np.array([[0, 5, IMAGE_JPEG]], dtype="<u4")}) == \
        "sample 0: JPEG image size 0x5 is impossible (each side must be 1..65535)"


def test_an_image_without_a_fixed_output_size_has_no_batch_part():
    class NoTransform:
        pipelines: dict = {}
    with pytest.raises(NotFastPath, match="image field 'im' has no transform giving a fixed output size"):
        IMAGE.batch(Field.image("im"), NoTransform())


def test_ds_i_and_batches(pack_samples):
    rng = np.random.default_rng(0)
    pixels = [rng.integers(0, 256, (12, 10, 3), dtype=np.uint8) for _ in range(3)]
    path = pack_samples([{"im": p, "y": i} for i, p in enumerate(pixels)], schema={"im": Field.image("im")},
                        image_mode="raw")
    ds = fastload.open(path, as_dict=True)
    assert torch.equal(ds[1]["im"], torch.from_numpy(pixels[1]).permute(2, 0, 1))  # raw: lossless, CHW
    assert fastload.open(path, decode=False)[2][0] == pixels[2].tobytes()
    ds = fastload.open(path, as_dict=True, transforms={"im": [CenterCrop(8)]})
    b, = batches(ds, 3)
    assert b["im"].shape == (3, 3, 8, 8) and b["im"].is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(b["im"][0], torch.from_numpy(pixels[0][2:10, 1:9]).permute(2, 0, 1))
    assert torch.equal(ds.__getitems__([0])[0]["im"], b["im"][0])
    ds = fastload.open(path, transforms={"im": [Resize((6, 5)), ToDtype(torch.float32, scale=True)]})
    b, = batches(ds, 3)
    assert b[0].dtype == torch.float32 and b[0].shape == (3, 3, 6, 5) and float(b[0].max()) <= 1.0
    part = IMAGE.batch(Field.image("im"), ds)
    assert isinstance(part, ImagePart) and part.tensor is not None
