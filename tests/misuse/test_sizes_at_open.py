"""Issue 27 item 2: nothing that depends on a sample's size fails mid-epoch. Each dataset here holds ordinary
images and, LAST, the one sample a transform cannot take as the others: today's loader met it at the last batch,
after every other batch had trained. Either fastload does what torchvision does with it (``CenterCrop`` zero-pads)
through a whole epoch, or ``fastload.open`` refuses it from the stored sizes, naming how many samples and which,
and what to write instead.
"""

from __future__ import annotations

import numpy as np
import pytest

import fastload
from fastload import transforms as T

from conftest import jpeg_bytes

from .conftest import unchanged, user_error

N = 9  # 8 ordinary samples, then the odd one: batch_size 4 meets it in the last batch


def pack_with_last(root, last_hw, hw=(40, 48), mask_hw=None):
    """N JPEGs of ``hw`` but the last, of ``last_hw``, with a label (and a mask of the image's size, or of
    ``mask_hw`` for the last sample)."""
    samples = []
    for i in range(N):
        h, w = last_hw if i == N - 1 else hw
        s = {"image": jpeg_bytes(h, w, seed=i), "label": i}
        if mask_hw is not None:
            mh, mw = mask_hw if i == N - 1 else (h, w)
            s["mask"] = (np.arange(mh * mw) % 7).astype(np.uint8).reshape(mh, mw)
        samples.append(s)
    schema = {"image": fastload.Field.image("image"), "label": fastload.Field.int("label")}
    if mask_hw is not None:
        schema["mask"] = fastload.Field.mask("mask")
    fastload.pack(samples, root / "ds", workers=0, schema=schema)
    return root / "ds"


def epoch(ds, batch_size=4):
    return [b for b in fastload.DataLoader(ds, batch_size=batch_size)]


def torchvision_center_crop(img: np.ndarray, ch: int, cw: int) -> np.ndarray:
    """torchvision's ``F.center_crop`` on an HWC array: zero-pad (crop - size) // 2 before and the rest after on a
    short axis, then crop at int(round((size - crop) / 2.0))."""
    h, w = img.shape[:2]
    pt, pb = ((ch - h) // 2, (ch - h + 1) // 2) if ch > h else (0, 0)
    pl, pr = ((cw - w) // 2, (cw - w + 1) // 2) if cw > w else (0, 0)
    img = np.pad(img, ((pt, pb), (pl, pr)) + ((0, 0),) * (img.ndim - 2))
    h, w = img.shape[:2]
    top, left = int(round((h - ch) / 2.0)), int(round((w - cw) / 2.0))
    return img[top:top + ch, left:left + cw]


@pytest.mark.parametrize("crop, flip", [((32, 32), None), ((25, 41), None), ((32, 32), 1.0)],
                         ids=["square", "odd sizes", "flipped"])
def test_center_crop_of_a_smaller_last_image_zero_pads_as_torchvision(tmp_path, crop, flip):
    """Was: the epoch stopped at the last batch ("torchvision would zero-pad, fastload does not")."""
    path = pack_with_last(tmp_path, last_hw=(20, 30))
    plain = fastload.open(path)
    chain = [T.CenterCrop(crop)] + ([T.RandomHorizontalFlip(flip)] if flip else [])
    ds = fastload.open(path, transforms={"image": chain})
    batches = epoch(ds)
    assert sum(len(b[1]) for b in batches) == N
    for i in (0, N - 1):
        src = plain[i][0].permute(1, 2, 0).numpy()
        want = torchvision_center_crop(src, *crop)
        if flip:
            want = want[:, ::-1]
        got_loader = batches[i // 4][0][i % 4].permute(1, 2, 0).numpy()
        got_item = ds[i][0].permute(1, 2, 0).numpy()
        assert np.array_equal(got_loader, want) and np.array_equal(got_item, want), i


def test_center_crop_pads_a_mask_with_zeros_as_torchvision(tmp_path):
    path = pack_with_last(tmp_path, last_hw=(20, 30), mask_hw=(20, 30))
    mask = fastload.open(path, as_dict=True)[N - 1]["mask"].numpy()
    ds = fastload.open(path, as_dict=True, transforms={"image": [T.CenterCrop(32)]})
    last = epoch(ds)[-1]
    assert np.array_equal(last["mask"][-1].numpy(), torchvision_center_crop(mask, 32, 32))
    assert np.array_equal(ds[N - 1]["mask"].numpy(), torchvision_center_crop(mask, 32, 32))


REFUSED = {
    # transforms, the last sample's size, words the message must hold (beside the sample and the count)
    "CenterCrop before a Resize": ([T.CenterCrop(32), T.Resize(16)], (20, 30),
                                   ["CenterCrop(size=(32, 32))", "Resize(size=16", "zero-pad",
                                    "Resize of at least the crop size before CenterCrop"]),
    "RandomCrop without padding": ([T.RandomCrop(32)], (20, 30),
                                   ["RandomCrop(size=(32, 32)", "at least 32x32", "20x30", "pad_if_needed=True"]),
    "flip then RandomCrop": ([T.RandomHorizontalFlip(), T.RandomCrop((24, 36))], (30, 30),
                             ["RandomCrop(size=(24, 36)", "at least 24x36", "30x30"]),
    "Resize with max_size": ([T.Resize(4, max_size=5)], (2, 300),
                             ["Resize(size=4", "max_size=5", "at least one pixel per side", "0x5", "raise max_size"]),
    "RandomResize then RandomCrop": ([T.RandomResize(30, 60), T.RandomCrop((28, 34))], (48, 40),
                                     ["RandomCrop(size=(28, 34)", "36x30", "RandomResize at its min_size"]),
    "GaussianBlur on a small output": ([T.Resize(24, max_size=40), T.GaussianBlur(29)], (20, 60),
                                       ["GaussianBlur(kernel_size=(29, 29)", "half the kernel", "13x40",
                                        "smaller kernel_size"]),
    "GaussianBlur alone": ([T.GaussianBlur(43)], (20, 60), ["GaussianBlur(kernel_size=(43, 43)", "20x60 there"]),
    "GaussianBlur in RandomApply": ([T.Resize(24, max_size=40), T.RandomApply([T.GaussianBlur(29)], p=0.1)],
                                    (20, 60), ["GaussianBlur(kernel_size=(29, 29)", "13x40"]),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_last_sample_no_batch_could_take_is_refused_at_open(tmp_path, case):
    """Was: ``fastload.open`` succeeded and the loader (or ``ds[i]``) raised at the last sample."""
    chain, last_hw, words = REFUSED[case]
    path = pack_with_last(tmp_path, last_hw)
    with unchanged(path), user_error(ValueError, "fastload.open", "transforms['image']", f"sample {N - 1}",
                                     f"1 of the dataset's {N} samples does not", *words):
        fastload.open(path, transforms={"image": chain})
    fastload.open(path, transforms={"image": [T.Resize((8, 8))]})  # the data itself is fine


def test_the_message_counts_every_refused_sample_and_names_the_first_few(tmp_path):
    path = pack_with_last(tmp_path, last_hw=(20, 30), hw=(20, 30))
    with user_error(ValueError, f"{N} of the dataset's {N} samples do not", "sample 0: 20x30", "sample 4: 20x30",
                    f"and {N - 5} more"):
        fastload.open(path, transforms={"image": [T.RandomCrop(32)]})


def test_a_mask_of_another_size_than_its_image_is_refused_at_open(tmp_path):
    """Was: opened, then the batch holding the last sample raised 'mask is 20x20 but its image is 20x30'."""
    path = pack_with_last(tmp_path, last_hw=(20, 30), mask_hw=(20, 20))
    with unchanged(path), user_error(ValueError, "mask field 'mask'", "transforms['image']",
                                     f"1 of the dataset's {N} samples has", f"sample {N - 1}: mask 20x20, image 20x30",
                                     "without transforms"):
        fastload.open(path, transforms={"image": [T.CenterCrop(16)]})
    assert fastload.open(path, as_dict=True)[N - 1]["mask"].shape == (20, 20)  # as stored, untransformed


def test_what_plans_at_every_size_still_opens(tmp_path):
    """The check refuses only what no batch could plan: padded crops, PadIfSmaller, RandomResizedCrop and a
    CenterCrop padding before a flip all take the small last sample."""
    path = pack_with_last(tmp_path, last_hw=(20, 30))
    for chain in ([T.RandomResizedCrop(32)], [T.RandomCrop(32, pad_if_needed=True)],
                  [T.PadIfSmaller(32), T.RandomCrop(32)], [T.RandomCrop(32, padding=6)],
                  [T.Resize(36), T.CenterCrop(32), T.RandomHorizontalFlip()], [T.Resize((32, 32)), T.GaussianBlur(29)]):
        ds = fastload.open(path, transforms={"image": chain})
        assert sum(len(b[1]) for b in epoch(ds)) == N, chain


class FiveCrop:
    """Stands in for torchvision's FiveCrop (not installed here): its module, name and result (a tuple)."""

    __module__ = "torchvision.transforms.transforms"

    def __init__(self, size):
        self.size = (size, size)

    def __call__(self, x):
        return tuple(x[..., :self.size[0], :self.size[1]] for _ in range(5))


def test_five_crop_is_refused_at_open_with_what_to_write(tmp_path):
    """Was: opened, then the first sample failed ("FiveCrop returned tuple (tensor(...")."""
    path = pack_with_last(tmp_path, last_hw=(20, 30))
    with unchanged(path), user_error(ValueError, "transforms['image']", "FiveCrop makes 5 images of each sample",
                                     "five_crop(images, size)"):
        fastload.open(path, transforms={"image": [T.Resize((16, 16)), FiveCrop(8)]})


def test_a_blur_inside_three_augment_is_checked_at_open(tmp_path):
    """ThreeAugment blurs a third of the samples with its own GaussianBlur (not in a ``transforms`` list): a tile
    too small for its kernel is refused at open, as a GaussianBlur in RandomApply is. Was: opened, then whichever
    batch drew the blur for the small sample raised."""
    path = pack_with_last(tmp_path, last_hw=(20, 60))
    chain = [T.Resize(24, max_size=40), T.ThreeAugment(blur_kernel_size=29)]
    with unchanged(path), user_error(ValueError, "fastload.open", "transforms['image']", f"sample {N - 1}",
                                     "GaussianBlur(kernel_size=(29, 29)", "13x40"):
        fastload.open(path, transforms={"image": chain})
