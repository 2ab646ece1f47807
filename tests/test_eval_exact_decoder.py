"""``decoder="exact"`` (fastload/decoders/exact.py): the loader's native threads decode every JPEG at full size, so an
evaluation recipe (``Resize(short side)``, ``CenterCrop``) gives PIL's resize-then-crop on images that the resize
shrinks 2x or more, which ``decoder="native"`` (the default) decodes DCT-scaled at 1/2 or 1/4 size: tens of levels
from PIL's pixels there. Checked against PIL's own resize-then-crop (torchvision's and timm's objects, and
``fastload.timm.create_loader``: test_eval_exact_real.py).

Pillow-SIMD (the project's venv) is matched bit for bit; plain Pillow within eval_exact_common.TOLERANCE."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
import fastload.transforms as T
from eval_exact_common import SHRUNK_RECIPES, SHRUNK_SIZES, TOLERANCE, files, image_folder, resize_then_crop, shrinks_2x

Image = pytest.importorskip("PIL.Image", reason="Pillow is required. Run `pip install pillow-simd`")

MODES = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return image_folder(tmp_path_factory.mktemp("eval_exact_decoder"), SHRUNK_SIZES)


def loader_levels(loader, refs) -> list[int]:
    """Each sample's max |diff| in levels against ``refs`` (the loader's order)."""
    out = []
    for images, _ in loader:
        for j in range(images.shape[0]):
            got = images[j].permute(1, 2, 0).numpy().astype(np.int64)
            out.append(int(np.abs(got - refs[len(out)].astype(np.int64)).max()))
    assert len(out) == len(refs)
    return out


def test_the_pictures_shrink_2x_or_more():
    """Else decoder='native' would decode them at full size too and the tests below could not tell the two apart."""
    for size, _ in SHRUNK_RECIPES:
        assert all(shrinks_2x(h, w, size) for h, w in SHRUNK_SIZES), size


@pytest.mark.parametrize("size,crop", SHRUNK_RECIPES)
@pytest.mark.parametrize("mode", MODES)
def test_the_exact_decoder_gives_pils_pixels_where_native_dct_scales(folder, tmp_path, size, crop, mode):
    ds = fastload.open(folder, transforms={"image": [T.Resize(size, interpolation=mode), T.CenterCrop(crop)]},
                       cache_dir=tmp_path / "cache")
    refs = [resize_then_crop(Image.open(p).convert("RGB"), size, crop, MODES[mode]) for p, _ in files(folder)]
    exact = loader_levels(fastload.DataLoader(ds, batch_size=4, shuffle=False, num_workers=2, decoder="exact"), refs)
    assert max(exact) <= TOLERANCE, f"decoder='exact': max |diff| per sample {exact}"
    native = loader_levels(fastload.DataLoader(ds, batch_size=4, shuffle=False, num_workers=2), refs)
    assert min(native) > TOLERANCE + 2, f"decoder='native' DCT-scales these: max |diff| per sample {native}"


def test_the_exact_decoder_runs_the_augmentation_too(folder, tmp_path):
    """Everything but the decode's size is the native decoder's: a train pipeline (its crops, flips and pixel
    operations) runs on it, each sample keyed by (seed, epoch, index) as with 'native'; the pixels differ from
    'native''s only where the DCT-scaled decode did."""
    steps = [T.RandomResizedCrop(64, scale=(0.9, 1.0)), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3)]
    ds = fastload.open(folder, transforms={"image": steps}, cache_dir=tmp_path / "cache")
    runs = {d: [b for b, _ in fastload.DataLoader(ds, batch_size=3, num_workers=2, seed=5, decoder=d)]
            for d in ("exact", "native")}
    again = [b for b, _ in fastload.DataLoader(ds, batch_size=3, num_workers=2, seed=5, decoder="exact")]
    assert all(torch.equal(a, b) for a, b in zip(runs["exact"], again))
    assert all(a.shape == b.shape for a, b in zip(runs["exact"], runs["native"]))
    assert not all(torch.equal(a, b) for a, b in zip(runs["exact"], runs["native"]))


def test_torchs_path_refuses_exact_over_a_fastload_dataset_and_keeps_it_over_one_that_decodes_itself(folder, tmp_path):
    """Over a fastload Dataset torch's path (a collate_fn of the user's) decodes with __getitems__, the native
    decoder's default: decoder='exact' is refused there, with the reason, not dropped. A dataset decoding its own
    samples (PIL) is what 'exact' asks for: taken."""
    ds = fastload.open(folder, transforms={"image": [T.Resize(96), T.CenterCrop(80)]}, cache_dir=tmp_path / "cache")

    def collate(batch):
        return batch

    with pytest.raises(ValueError, match=r"decoder='exact' needs fastload's fast path, which this loader cannot take"):
        fastload.DataLoader(ds, batch_size=2, collate_fn=collate, decoder="exact")

    class Own(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.full((3, 4, 4), i, dtype=torch.uint8)

    batches = list(fastload.DataLoader(Own(), batch_size=2, collate_fn=collate, decoder="exact"))
    assert len(batches) == 2 and int(batches[1][1][0, 0, 0]) == 3
    with pytest.raises(ValueError, match="decoder='pil' should be one of 'native', 'exact', "):
        fastload.DataLoader(Own(), batch_size=2, collate_fn=collate, decoder="pil")


def test_the_exact_decoder_with_a_gpu_device_decodes_into_host_rows_at_full_size():
    """With device='cuda' 'exact' is still the CPU threads (copied to the device as 'native''s rows are), never a GPU
    decoder; the decoder it makes is the loader's native one, DCT scaling off (made without a GPU: no CUDA call)."""
    from fastload._fill.images import ImageDecoding

    for device in (None, torch.device("cuda")):
        images = ImageDecoding("exact", device, 4, 0)
        assert images.kind.name == "exact" and images.device is None
        made = images._decoder((8, 8), "image")
        assert made is images.native and made.dct_scaling is False
    assert ImageDecoding("native", torch.device("cuda"), 4, 0)._decoder((8, 8)).dct_scaling is True
