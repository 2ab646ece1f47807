"""torchvision v2 objects whose stored attributes differ from their constructor's arguments (torchvision 0.29's
``v2/_geometry.py``, ``v2/_augment.py``, ``v2/_misc.py``): each converts to the fastload transform that the same
constructor arguments make. Stand-ins as in test_torchvision_convert.py; the real classes when importable."""

from __future__ import annotations

import pytest
import torch

import fastload.transforms as T
from fastload._augment.fallback import UserTransform
from fastload._augment.torchvision_convert import convert
from test_torchvision_convert import V1, V2, same, tv


def v2_random_crop(padding):
    """v2.RandomCrop(32, padding=...): ``__init__`` keeps ``_parse_pad_padding(padding)``, whose order is
    [left, right, top, bottom] (v2's ``make_params`` unpacks it so), not the argument's [left, top, right, bottom]."""
    if isinstance(padding, int):
        padding = [padding] * 4
    elif len(padding) == 2:
        padding = [padding[0], padding[0], padding[1], padding[1]]
    else:
        padding = [padding[0], padding[2], padding[1], padding[3]]
    return tv(V2["geometry"], "RandomCrop", size=(32, 32), padding=padding, pad_if_needed=False, fill=0,
              _fill={"Image": 0}, padding_mode="constant")


@pytest.mark.parametrize("padding", [(4, 8), (1, 2, 3, 4)], ids=["left/right, top/bottom", "four sides"])
def test_v2_random_crop_keeps_each_sides_padding(padding):
    """It swapped the right and top padding: v2.RandomCrop(32, padding=(4, 8)) padded 4 above and 8 on the left."""
    # v2's plain fill 0 fills masks too (its _setup_fill_arg: {"others": 0}), hence the per-kind fill
    assert same(convert(v2_random_crop(padding), T), [T.RandomCrop(32, padding=padding, fill={"image": 0, "mask": 0})])
    v1 = tv(V1, "RandomCrop", size=(32, 32), padding=padding, pad_if_needed=False, fill=0, padding_mode="constant")
    assert same(convert(v1, T), [T.RandomCrop(32, padding=padding)])  # v1 keeps the argument as given


def test_v2_random_erasing_with_noise_converts():
    """v2 keeps value='random' as ``value=None``: it ran per sample, and after Normalize (torchvision's recipe
    order) the pipeline was refused with 'ToDtype/Normalize must come after...' instead of the erasing's own
    message."""
    given = tv(V2["augment"], "RandomErasing", p=0.25, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=None,
               inplace=False)
    assert same(convert(given, T), [T.RandomErasing(0.25, value="random")])


Image = type("Image", (), {"__module__": "torchvision.tv_tensors._image"})
Mask = type("Mask", (), {"__module__": "torchvision.tv_tensors._mask"})


@pytest.mark.parametrize("dtype", [
    {Image: torch.float32, Mask: torch.int64, "others": None},  # torchvision's segmentation reference
    {Image: torch.float32, "others": torch.float64},
], ids=["image, mask, others None", "image and others"])
def test_v2_to_dtype_by_type_takes_the_images_dtype(dtype):
    """Both Image and 'others' were taken as the image's: not converted, it ran per sample and returned floats,
    and the pipeline was refused with 'Normalize needs a float batch: put ToDtype(...) before it'."""
    got = convert(tv(V2["misc"], "ToDtype", dtype=dtype, scale=True), T)
    assert same(got, [T.ToDtype(torch.float32, scale=True)])


def test_v2_to_dtype_without_an_image_dtype_still_runs_per_sample_saying_why():
    (got,) = convert(tv(V2["misc"], "ToDtype", dtype={Mask: torch.int64, "others": None}, scale=True), T)
    assert isinstance(got, UserTransform) and "dtype for images" in got.reason


def test_real_torchvision_v2_objects_convert_as_their_arguments():
    v2 = pytest.importorskip("torchvision.transforms.v2")
    from torchvision import tv_tensors

    # v2 fills every tv_tensor type with a plain fill, masks included: fastload's per-kind spelling says so
    pairs = [(v2.RandomCrop(32, padding=(4, 8)), T.RandomCrop(32, padding=(4, 8), fill={"image": 0, "mask": 0})),
             (v2.RandomCrop(32, padding=[1, 2, 3, 4], fill=7),
              T.RandomCrop(32, padding=(1, 2, 3, 4), fill={"image": 7, "mask": 7})),
             (v2.RandomErasing(0.25, value="random"), T.RandomErasing(0.25, value="random")),
             (v2.ToDtype({tv_tensors.Image: torch.float32, tv_tensors.Mask: torch.int64, "others": None}, scale=True),
              T.ToDtype(torch.float32, scale=True))]
    for given, expected in pairs:
        assert same(convert(given, T), [expected]), (given, convert(given, T))
