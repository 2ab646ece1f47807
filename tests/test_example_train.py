"""Smoke test of examples/train.py: one epoch with each loader on a tiny ImageFolder built here."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "train.py"
COLOURS = [(200, 40, 40), (40, 180, 60), (50, 70, 210)]


def tiny_folder(root: Path, per_class: int, seed: int) -> Path:
    """Noisy JPEGs of one dominant colour per class, in varied sizes (so crops and resizes differ)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c, colour in enumerate(COLOURS):
        (root / f"class_{c}").mkdir(parents=True)
        for k in range(per_class):
            h, w = (int(x) for x in rng.integers(36, 90, size=2))
            pixels = np.clip(np.array(colour) + rng.normal(0, 30, size=(h, w, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / f"class_{c}" / f"img_{k:03d}.jpg", quality=85)
    return root


def test_both_loaders_train_one_epoch(tmp_path: Path) -> None:
    train = tiny_folder(tmp_path / "train", per_class=8, seed=0)
    val = tiny_folder(tmp_path / "val", per_class=4, seed=1)
    out = tmp_path / "out"
    cmd = [sys.executable, str(SCRIPT), "--seeds", "0", "--epochs", "1", "--image-size", "32", "--batch-size", "8",
           "--workers", "1", "--threads", "1", "--train-folder", str(train), "--val-folder", str(val),
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=100, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    finals = re.findall(r"final val accuracy ([\d.]+)% +\((\w+), seed 0", proc.stdout)
    assert sorted(kind for _, kind in finals) == ["fastload", "torch"], proc.stdout
    assert all(0.0 <= float(acc) <= 100.0 for acc, _ in finals)
    table = proc.stdout.split("== summary")[1]
    assert re.search(r"\| torch \| 1 \| [\d.]+ ± 0\.0 % \|", table), table
    assert re.search(r"\| fastload \| 1 \| [\d.]+ ± 0\.0 % \|", table), table
    assert "throughput fastload / torch:" in table

    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["loader"] for r in rows] == ["torch", "fastload"]
    assert all(float(r["img_per_s"]) > 0 for r in rows)


def load_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("example_train", SCRIPT)
    train = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = train  # dataclasses look their module up there
    try:
        spec.loader.exec_module(train)
    finally:
        del sys.modules[spec.name]
    return train


def test_augment_trains_both_loaders(tmp_path: Path) -> None:
    """--augment: both loaders train with TrivialAugmentWide + RandomErasing and the summary says so."""
    train = tiny_folder(tmp_path / "train", per_class=8, seed=0)
    val = tiny_folder(tmp_path / "val", per_class=4, seed=1)
    cmd = [sys.executable, str(SCRIPT), "--seeds", "0", "--epochs", "1", "--image-size", "32", "--batch-size", "8",
           "--workers", "1", "--threads", "1", "--train-folder", str(train), "--val-folder", str(val),
           "--out", str(tmp_path / "out"), "--augment"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=100, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(re.findall(r"final val accuracy [\d.]+% +\((\w+), seed 0", proc.stdout)) == ["fastload", "torch"]
    assert proc.stdout.count("workers, TrivialAugmentWide + RandomErasing(0.25)") == 2, proc.stdout
    assert "augment: TrivialAugmentWide + RandomErasing(0.25)" in proc.stdout.split("== summary")[1]


@pytest.mark.parametrize("kind", ["torch", "fastload"])
def test_augment_changes_the_training_images(tmp_path: Path, kind: str) -> None:
    """The same seed with and without augment: the same order (and fastload's same crops), other pixels. Fails
    when either loader drops the augmentations."""
    import torch

    train = load_script()
    splits = train.prepare_data(tmp_path / "out", 1, 1, tiny_folder(tmp_path / "train", 8, seed=0),
                                tiny_folder(tmp_path / "val", 2, seed=1))
    batches = {}
    for augment in (False, True):
        torch.manual_seed(0)  # the torch Dataset's generator in the main process (num_workers=0)
        loader, _ = train.make_loaders(kind, splits, 32, 24, 0, seed=0, augment=augment)
        batches[augment] = next(iter(loader))
    (plain, la), (aug, lb) = batches[False], batches[True]
    assert la.tolist() == lb.tolist()
    assert plain.shape == aug.shape == (24, 3, 32, 32)
    changed = [not torch.equal(x, y) for x, y in zip(plain, aug)]
    assert sum(changed) >= 8, changed


def test_validation_pixels_agree_between_loaders(tmp_path: Path) -> None:
    """The deterministic validation pipeline gives nearly the same pixels through PIL and through fastload."""
    train = load_script()
    splits = train.prepare_data(tmp_path / "out", 1, 1, tiny_folder(tmp_path / "train", 4, seed=0),
                                tiny_folder(tmp_path / "val", 4, seed=1))
    _, torch_val = train.make_loaders("torch", splits, 32, 64, 0, seed=0)
    _, fast_val = train.make_loaders("fastload", splits, 32, 64, 0, seed=0)
    (a, la), (b, lb) = next(iter(torch_val)), next(iter(fast_val))
    assert a.shape == b.shape == (12, 3, 32, 32)
    assert la.tolist() == lb.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert (a.float() - b.float()).abs().mean() < 3.0  # fastload decodes DCT-scaled; PIL at full size
