"""torchvision's and timm's own evaluation transforms (Resize(short side) then CenterCrop, then to a tensor and
normalized), given unchanged to ``fastload.open``: ``ds[i]`` and the loader equal ``ImageFolder(root, transform)[i]``
exactly, on pictures whose crop starts between two source pixels (tests/eval_exact_common.py); on pictures the resize
shrinks 2x or more, with ``decoder='exact'`` (through ``fastload.timm.create_loader`` and a torchvision ImageFolder
given to ``fastload.DataLoader``). Skipped where
torchvision or timm does not import (CI): ``bash scripts/timm_test_venv.sh`` builds ``bench/.venvs/timm``, then
``PYTHONPATH=. bench/.venvs/timm/bin/python -m pytest tests/test_eval_exact_real.py``. Without them,
test_eval_exact.py checks the same against PIL's resize-then-crop.

Float outputs are compared in pixel levels (``|a - b| * std * 255``, rounded); the exactness holds with Pillow-SIMD
(the venv's PIL), whose int16 weights fastload's resize reproduces (plain Pillow: test_eval_exact.py's bound)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
from eval_exact_common import SHRUNK_SIZES, TOLERANCE, image_folder

torchvision = pytest.importorskip("torchvision", reason="torchvision is not importable here (timm_test_venv.sh)")
timm_data = pytest.importorskip("timm.data", reason="timm is not importable here (bash scripts/timm_test_venv.sh)")
from torchvision import transforms as tv  # noqa: E402
from torchvision.transforms import InterpolationMode  # noqa: E402

MEAN, STD = timm_data.IMAGENET_DEFAULT_MEAN, timm_data.IMAGENET_DEFAULT_STD
BICUBIC = InterpolationMode.BICUBIC

RECIPES = {
    "torchvision classic eval": lambda: tv.Compose(
        [tv.Resize(256), tv.CenterCrop(224), tv.ToTensor(), tv.Normalize(MEAN, STD)]
    ),
    "torchvision bicubic, uint8": lambda: tv.Compose(
        [tv.Resize(160, interpolation=BICUBIC), tv.CenterCrop(129), tv.PILToTensor()]
    ),
    "torchvision (h, w) crop": lambda: tv.Compose([tv.Resize(200), tv.CenterCrop((150, 177)), tv.PILToTensor()]),
    "timm eval": lambda: timm_data.create_transform(224),
    "timm eval bicubic": lambda: timm_data.create_transform(224, interpolation="bicubic"),
    "timm eval crop_pct 0.95": lambda: timm_data.create_transform(
        192, interpolation="bicubic", crop_pct=0.95, is_training=False
    ),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return image_folder(tmp_path_factory.mktemp("eval_exact_real"))


def levels(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in pixel levels: uint8 as it is, normalized floats through std."""
    if a.dtype == torch.uint8:
        return float((a.int() - b.int()).abs().max())
    std = torch.tensor(STD)[:, None, None]
    return float(torch.round((a.float() - b.float()).abs() * std * 255).max())


@pytest.mark.parametrize("recipe", RECIPES)
def test_fastload_equals_torchvisions_imagefolder_exactly(folder, tmp_path, recipe):
    make = RECIPES[recipe]
    ref = torchvision.datasets.ImageFolder(str(folder), transform=make())
    ds = fastload.open(folder, transforms={"image": make()}, cache_dir=tmp_path / "cache")
    pipe = ds.pipelines["image"]
    assert not pipe.fallback and not pipe.after, pipe  # converted: the native engine runs it
    expected = [ref[i] for i in range(len(ref))]
    for i, (image, label) in enumerate(expected):
        got, got_label = ds[i]
        assert int(got_label) == label and got.dtype == image.dtype and got.shape == image.shape
        d = levels(got, image)
        assert d <= TOLERANCE, f"{recipe}: ds[{i}] ({ref.samples[i][0]}) differs by {d}"
    k = 0
    for images, labels in fastload.DataLoader(ds, batch_size=3, shuffle=False, num_workers=2):
        for j in range(images.shape[0]):
            image, label = expected[k]
            assert int(labels[j]) == label
            d = levels(images[j], image)
            assert d <= TOLERANCE, f"{recipe}: loader sample {k} differs by {d}"
            k += 1
    assert k == len(expected)


def test_the_recipes_plan_frames(folder, tmp_path):
    """The fix is what runs: the converted pipelines plan Plan.frames on these pictures (test_eval_exact.py shows
    the rounded boxes alone differ by tens of levels)."""
    for recipe, make in RECIPES.items():
        ds = fastload.open(folder, transforms={"image": make()}, cache_dir=tmp_path / "cache")
        plan = ds.pipelines["image"].plan(np.array([301, 427]), np.array([427, 301]), np.random.default_rng(0))
        assert plan.frames is not None, recipe


@pytest.mark.parametrize("decoder", ["exact", "native"])
def test_create_loader_and_imagefolder_with_the_exact_decoder_give_timms_pixels(tmp_path_factory, monkeypatch, decoder):
    """Pictures timm's eval resize shrinks 2x or more: decoder='exact' gives timm's (and torchvision's ImageFolder's)
    pixels through fastload.timm.create_loader and through fastload.DataLoader over torchvision's ImageFolder (the
    folder's fast path); decoder='native' (the default) decodes them DCT-scaled: not those pixels."""
    from timm.data import ImageDataset

    from fastload.timm import create_loader

    folder = image_folder(tmp_path_factory.mktemp(f"shrunk_{decoder}"), SHRUNK_SIZES)
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(folder.parent / "cache"))  # the folders' packs

    def make():
        return timm_data.create_transform(80, interpolation="bicubic", crop_pct=0.875)  # Resize(91), CenterCrop(80)

    ref = torchvision.datasets.ImageFolder(str(folder), transform=make())
    expected = [ref[i] for i in range(len(ref))]
    loaders = {
        "create_loader": create_loader(ImageDataset(str(folder)), input_size=(3, 80, 80), batch_size=4,
                                       interpolation="bicubic", crop_pct=0.875, use_prefetcher=False, num_workers=2,
                                       device=torch.device("cpu"), decoder=decoder),
        "DataLoader(ImageFolder)": fastload.DataLoader(torchvision.datasets.ImageFolder(str(folder), transform=make()),
                                                       batch_size=4, num_workers=2, decoder=decoder),
    }
    for name, loader in loaders.items():
        assert loader.fast_path_reason is None, (name, loader.fast_path_reason)
        d = [levels(images[j], expected[k + j][0]) for k, (images, _) in zip(range(0, len(expected), 4), loader)
             for j in range(images.shape[0])]
        assert len(d) == len(expected), name
        if decoder == "exact":
            assert max(d) <= TOLERANCE, f"{name}, decoder='exact': max |diff| per sample {d}"
        else:
            assert min(d) > TOLERANCE + 2, f"{name}, decoder='native' DCT-scales these: max |diff| per sample {d}"
