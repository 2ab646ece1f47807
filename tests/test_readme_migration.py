"""README.md's "Swap your DataLoader": the script after the diff runs as written, on an unpacked
ImageFolder (packed once into the cache), and gives the batches the README says."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from conftest import make_image_folder

README = Path(__file__).resolve().parent.parent / "README.md"


def after_script() -> str:
    """The diff's result: its context and added lines, as a script."""
    section = README.read_text().split("## Swap your DataLoader", 1)[1]
    diff = re.search(r"```diff\n(.*?)```", section, re.S).group(1)
    return "\n".join(line[1:] for line in diff.splitlines() if line[:1] in (" ", "+"))


def test_the_migrated_script_runs(tmp_path, monkeypatch):
    script = after_script()
    assert "fastload.open(\"data/train\"" in script and "torchvision" not in script
    make_image_folder(tmp_path / "data" / "train", classes=2, per_class=130)  # 260 images: one batch of 256
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "cache"))
    seen = {}
    body = script.replace("    ...", "    seen['batch'] = (images, labels)\n    break")
    exec(compile(body, "README.md", "exec"), {"seen": seen})
    images, labels = seen["batch"]
    assert images.shape == (256, 3, 224, 224) and images.dtype == torch.float32
    assert images.is_contiguous(memory_format=torch.channels_last) and labels.dtype == torch.int64
    assert (tmp_path / "cache" / "folders").is_dir()
