"""The docs' "Bringing Parquet / WebDataset data": each diff's result runs as written on files built here
(Hugging Face's Parquet layout, WebDataset shards), packed once into the cache, and gives the batches it says.

The section lives in docs/guide/migrating.md; tests/test_docs.py leaves its diffs to this file, which builds
their data (the page marks them ``ran-by`` this file)."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.parquet as pq
import torch

from sources.test_parquet import hf_table
from sources.test_webdataset import write_tar

from conftest import jpeg_bytes

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "migrating.md"
TITLE = "## Bringing Parquet / WebDataset data"


def section() -> str:
    text = PAGE.read_text()
    assert TITLE in text, f"{PAGE} has no section {TITLE!r}"
    return TITLE + text.split(TITLE, 1)[1].split("\n## ", 1)[0]


def after_scripts() -> list[str]:
    """Each diff's result: its context and added lines, as a script."""
    diffs = re.findall(r"```diff\n(.*?)```", section(), re.S)
    return ["\n".join(line[1:] for line in d.splitlines() if line[:1] in (" ", "+")) for d in diffs]


def run(script: str, capture: str) -> dict:
    """The script with a small batch and two workers (this machine's), stopping after one batch."""
    small = script.replace("batch_size=256", "batch_size=16").replace("num_workers=8", "num_workers=2")
    assert small.count("batch_size=16") == 1 and "num_workers=2" in small
    seen: dict = {}
    exec(compile(small.replace("    ...", f"    seen['batch'] = {capture}\n    break"), "docs", "exec"),
         {"seen": seen})
    return seen


def test_the_hugging_face_script_runs_on_parquet_files(tmp_path, monkeypatch, capsys):
    hf, _ = after_scripts()
    assert "datasets" not in hf and "torchvision" not in hf
    (tmp_path / "data").mkdir()
    for k in range(2):
        pq.write_table(hf_table(12, seed=k).select(["image", "label"]),  # an image-classification dataset
                       tmp_path / "data" / f"train-{k:05d}-of-00002.parquet", row_group_size=5)
    pq.write_table(hf_table(3), tmp_path / "data" / "test-00000-of-00001.parquet")  # another split: not named
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "cache"))
    images, labels = run(hf, "(images, labels)")["batch"]
    assert "['cat', 'dog', 'emu']" in capsys.readouterr().out
    assert images.shape == (16, 3, 224, 224) and images.dtype == torch.float32
    assert labels.dtype == torch.int64 and set(labels.tolist()) <= {0, 1, 2}
    assert (tmp_path / "cache" / "folders").is_dir()


def test_the_webdataset_script_runs_on_tar_shards(tmp_path, monkeypatch):
    _, wds = after_scripts()
    assert "webdataset" not in wds and "torchvision" not in wds
    (tmp_path / "shards").mkdir()
    for s in range(100):  # train-{000..099}.tar, one sample each
        key = f"{s:06d}"
        write_tar(tmp_path / "shards" / f"train-{s:03d}.tar",
                  [(f"{key}.jpg", jpeg_bytes(40, 48, seed=s)), (f"{key}.cls", str(s % 5).encode())])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "cache"))
    images, labels = run(wds, "(images, labels)")["batch"]
    assert images.shape == (16, 3, 224, 224) and images.dtype == torch.float32
    assert labels.dtype == torch.int64 and set(labels.tolist()) <= set(range(5))
