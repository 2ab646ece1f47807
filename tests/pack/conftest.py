"""What the pack tests share: a photo folder with odd files and a byte-for-byte comparison of two packs
(parts, Ray)."""

from __future__ import annotations

import filecmp
import os
from pathlib import Path

from conftest import make_image_folder, png_bytes


def photo_folder(root: Path) -> Path:
    """JPEGs, PNGs (re-encoded by the packer) and one broken file (skipped with skip_bad)."""
    make_image_folder(root, classes=3, per_class=9)
    for k in range(4):
        (root / "class_1" / f"png_{k}.png").write_bytes(png_bytes(30 + k, 40, seed=k))
    (root / "class_2" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    return root


def identical(a: Path, b: Path) -> bool:
    names = sorted(os.listdir(a))
    return names == sorted(os.listdir(b)) and all(filecmp.cmp(a / n, b / n, shallow=False) for n in names)


KW = dict(shard_size="12KB", block=5, skip_bad=True, workers=1)
