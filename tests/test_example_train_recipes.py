"""examples/train.py --recipe: the library's own recipe objects, the same objects in both loaders (issue 30 item 5).

torch's side is torchvision's ImageFolder running the objects per sample; fastload's converts them and must stay
on its fast path. Needs torchvision and timm, so it runs in the test-only venv of scripts/timm_test_venv.sh and
skips elsewhere (CI), as tests/augment/test_timm_real.py does:

    bench/.venvs/timm/bin/python -m pytest tests/test_example_train_recipes.py
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import fastload
import fastload.transforms as T
from test_example_train import load_script, tiny_folder

pytestmark = pytest.mark.timeout(180)

RECIPES = ("torchvision", "torchvision-v2", "timm", "timm-ra")


def test_without_torchvision_a_library_recipe_says_what_it_needs() -> None:
    try:
        import torchvision.transforms  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torchvision imports here: the message for its absence cannot be seen")
    train = load_script()
    with pytest.raises(SystemExit, match="torchvision does not import here"):
        train.library_recipe("torchvision", 32)


@pytest.fixture(scope="module")
def timm_data():
    pytest.importorskip("torchvision.transforms", reason="torchvision is not importable here")
    return pytest.importorskip("timm.data", reason="timm is not importable here (bash scripts/timm_test_venv.sh)")


@pytest.fixture(scope="module")
def splits(tmp_path_factory, timm_data):
    root = tmp_path_factory.mktemp("recipes")
    train = load_script()
    folders = tiny_folder(root / "train", per_class=6, seed=0), tiny_folder(root / "val", per_class=4, seed=1)
    return train, train.prepare_data(root / "out", 6, 4, *folders)


@pytest.mark.parametrize("name", RECIPES)
def test_both_loaders_get_the_same_library_objects_and_fastload_runs_them_natively(splits, name) -> None:
    train, sp = splits
    size = 32
    recipe = train.library_recipe(name, size)
    timm_made = name.startswith("timm")
    assert type(recipe.train).__module__.split(".")[0] == ("timm" if timm_made else "torchvision") or (
        timm_made and type(recipe.train).__module__.startswith("torchvision")  # timm returns tv's Compose
    )
    if timm_made:
        assert any(type(t).__module__.startswith("timm.") for t in recipe.train.transforms)
    torch_train, torch_val = train.make_loaders("torch", sp, size, 8, 0, 0, recipe=recipe)
    fl_train, fl_val = train.make_loaders("fastload", sp, size, 8, 1, 0, recipe=recipe)

    # torch: torchvision's ImageFolder running the very objects per sample
    from torchvision.datasets import ImageFolder

    assert isinstance(torch_train.dataset, ImageFolder) and torch_train.dataset.transform is recipe.train
    assert isinstance(torch_val.dataset, ImageFolder) and torch_val.dataset.transform is recipe.val
    # fastload: the same objects converted, nothing left to run per sample
    for loader, objects in ((fl_train, recipe.train), (fl_val, recipe.val)):
        pipe = loader.dataset.pipelines["image"]
        want = T.ImagePipeline(objects)
        assert pipe == want and not pipe.fallback and not pipe.after, pipe
        # ImagePipeline's == leaves out the tensor stage (ToDtype / Normalize): compared here
        assert repr(pipe.tensor.transforms) == repr(want.tensor.transforms) and pipe.tensor.transforms

    with warnings.catch_warnings():
        warnings.simplefilter("error", fastload.FastPathWarning)
        batches = {k: next(iter(loader)) for k, loader in (("torch", torch_train), ("fastload", fl_train))}
        val = {k: next(iter(loader)) for k, loader in (("torch", torch_val), ("fastload", fl_val))}
    for images, labels in batches.values():
        assert images.dtype == torch.float32 and images.shape == (8, 3, size, size)
        assert labels.dtype == torch.int64 and 0 <= int(labels.min()) and int(labels.max()) < 3
    # validation is deterministic: the same images, labels equal, pixels within the converter's resize tolerance
    (tv_images, tv_labels), (fl_images, fl_labels) = val["torch"], val["fastload"]
    assert torch.equal(tv_labels, fl_labels)
    # within 4 levels of 255 on average, in normalized units (std ~0.225): these tiny pictures are pixel noise
    # (std 30 levels) resampled by PIL and by fastload's resize (2.5 levels apart here); a wrong crop, size or
    # normalization is tens of levels
    assert float((tv_images - fl_images).abs().mean()) < 4 / 255 / 0.225


def test_the_timm_ra_recipe_is_deits_randaugment_run_natively_and_its_reorder_warning_is_reported(
    splits, timm_data, monkeypatch
) -> None:
    """--recipe timm-ra: timm's own RandAugment (DeiT's rand-m9-mstd0.5-inc1: 15 ops, 2 layers, magnitude 9, std
    0.5, the increasing variants) after timm's bicubic crop, converted whole to the native engine. fastload warns
    that it reorders a sample's geometric ops before its colour ops: a UserWarning the script neither hides nor
    turns into an error, but returns to print with the results (it is part of what the runs measure)."""
    from fastload import _ring

    train, _ = splits
    recipe = train.library_recipe("timm-ra", 32)
    (ra,) = [t for t in recipe.train.transforms if type(t).__name__ == "RandAugment"]
    assert type(ra).__module__.startswith("timm.") and ra.num_layers == 2 and len(ra.ops) == 15
    names = {op.name for op in ra.ops}
    assert {"Rotate", "ShearX", "TranslateXRel", "SolarizeAdd", "PosterizeIncreasing"} <= names, names
    assert {(op.magnitude, op.magnitude_std) for op in ra.ops} == {(9, 0.5)}
    (crop,) = [t for t in recipe.train.transforms if type(t).__name__ == "RandomResizedCropAndInterpolation"]
    assert str(crop.interpolation).lower().endswith("bicubic"), crop.interpolation
    erasing = recipe.train.transforms[-1]
    # timm's train.py default and DeiT's --remode pixel: per-pixel noise, erased natively in the fill stage
    assert type(erasing).__name__ == "RandomErasing" and erasing.probability == 0.25 and erasing.mode == "pixel"

    monkeypatch.setattr(_ring, "_warned", set())  # warn_once: an earlier conversion in this process warned already
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastload.FastPathWarning)
        notes = train.require_fast_path(recipe)
    assert len(notes) == 1 and notes[0].startswith("train: UserWarning: ") and "RandAugment(num_layers=2)" in notes[0]
    assert "geometric ops" in notes[0] and "before its colour ops" in notes[0], notes
    pipe = T.ImagePipeline(recipe.train)
    assert [type(t).__name__ for t in pipe.augment] == ["TimmRandAugment"], pipe
    assert [(type(t).__name__, t.mode) for t in pipe.erase] == [("NoiseErasing", "pixel")], pipe
    assert not pipe.fallback and not pipe.after, pipe


def test_a_fast_path_warning_while_converting_a_recipe_is_an_error(splits, monkeypatch) -> None:
    """A FastPathWarning fastload gives while building the pipeline ends the script; other warnings do not."""
    train, _ = splits
    recipe = train.library_recipe("torchvision", 32)

    class WarningPipeline(T.ImagePipeline):
        def __init__(self, objects) -> None:
            warnings.warn("fastload: pretend this leaves the fast path", fastload.FastPathWarning, stacklevel=2)
            super().__init__(objects)

    monkeypatch.setattr(train.T, "ImagePipeline", WarningPipeline)
    with pytest.raises(SystemExit, match="leaves its fast path on the train recipe.*pretend this leaves"):
        train.require_fast_path(recipe)


def test_a_recipe_fastload_would_run_per_sample_is_refused(splits, timm_data) -> None:
    """The comparison is torch vs fastload's native engine: a recipe with a per-sample fallback (timm's AugMix,
    a blend of several augmented copies) is an error with the reason. (timm's erasing with noise, this test's
    example before, is native now.)"""
    train, _ = splits
    slow = timm_data.create_transform(32, is_training=True, auto_augment="augmix-m3-w3")
    with pytest.raises(SystemExit, match="per sample, not on its native engine.*AugMixAugment"):
        train.require_fast_path(train.Recipe("timm", slow, timm_data.create_transform(32)))


def test_a_recipe_fastload_refuses_is_reported_with_its_reason(splits) -> None:
    """A recipe fastload refuses at build (a Lambda before the crop) ends the script with fastload's reason."""
    import torchvision.transforms as tv1

    train, _ = splits
    refused = tv1.Compose([tv1.Lambda(lambda im: im), tv1.RandomResizedCrop(32), tv1.ToTensor()])
    with pytest.raises(SystemExit, match="fastload refuses the train recipe: .*comes after Lambda"):
        train.require_fast_path(train.Recipe("torchvision", refused, refused))


def test_main_trains_both_loaders_with_the_timm_recipe(splits, tmp_path: Path) -> None:
    train, sp = splits
    results = train.main(
        ["--seeds", "0,1", "--recipe", "timm", "--epochs", "1", "--image-size", "32", "--batch-size", "8",
         "--workers", "1", "--threads", "1", "--train-folder", str(sp.train_folder), "--val-folder",
         str(sp.val_folder), "--out", str(tmp_path / "out")]
    )  # fmt: skip
    assert [(r.loader, r.seed, r.recipe) for r in results] == [
        ("torch", 0, "timm"),
        ("fastload", 0, "timm"),
        ("torch", 1, "timm"),
        ("fastload", 1, "timm"),
    ]
    assert all(0.0 <= r.accuracy <= 1.0 for r in results)


def test_welch_t_and_its_p_value() -> None:
    """t and df by hand for a = 1..3, b = 4..7 (va = 1/3, vb = 5/12: t = 3.5 / sqrt(0.75), df = 0.5625 / (1/18 +
    25/432)); the two-sided p at Student's t table's 5 % and 1 % critical values."""
    train = load_script()
    t, df, _ = train.welch([1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0])
    assert t == pytest.approx(3.5 / 0.75**0.5) and df == pytest.approx(0.5625 / (1 / 18 + 25 / 432))
    for crit, dof, p in ((12.706, 1, 0.05), (2.776, 4, 0.05), (2.228, 10, 0.05), (3.169, 10, 0.01), (2.042, 30, 0.05)):
        assert train._t_two_sided(crit, dof) == pytest.approx(p, abs=2e-4), (crit, dof)
    assert train.welch([1.0, 1.0], [1.0, 1.0])[0] == 0.0


def test_to_input_leaves_a_recipes_normalized_floats_alone_and_normalizes_uint8() -> None:
    train = load_script()
    floats = torch.randn(2, 3, 4, 4)
    assert torch.equal(train.to_input(floats), floats)
    assert train.to_input(floats).is_contiguous(memory_format=torch.channels_last)
    pixels = torch.full((1, 3, 2, 2), 255, dtype=torch.uint8)
    assert torch.allclose(
        train.to_input(pixels)[0, :, 0, 0],
        (1 - torch.tensor([0.485, 0.456, 0.406])) / 0.229 * torch.tensor([1, 0.229 / 0.224, 0.229 / 0.225]),
    )
