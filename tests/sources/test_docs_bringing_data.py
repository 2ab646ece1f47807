"""The docs' "Bringing Parquet / WebDataset data": each diff's result runs as written on files built here
(Hugging Face's Parquet layout, WebDataset shards), packed once into the cache, and gives the batches it says.

The section lives in README.md once placed there (this file then reads it from there); until then its text is
``SECTION`` below, word for word what the report hands over."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.parquet as pq
import torch

from sources.test_parquet import hf_table
from sources.test_webdataset import write_tar

from conftest import jpeg_bytes

README = Path(__file__).resolve().parents[2] / "README.md"
TITLE = "## Bringing Parquet / WebDataset data"

SECTION = r'''## Bringing Parquet / WebDataset data

Parquet files (Hugging Face's among them) and WebDataset tar shards open as they are: `fastload.open` packs
them once into its cache, as it does an ImageFolder, and `fastload pack` takes them too. Name them by a file, a
folder, a glob (`data/train-*.parquet`) or a brace pattern (`shards/train-{000..099}.tar`), local or at a URL
fsspec reads (`fastload pack 's3://bucket/data/train-*.parquet' train_packed`; from Python,
`storage_options=` reach the backend). Images are stored as the bytes they are (a JPEG byte for byte, so the
pixels are the source's), a `ClassLabel`'s names become `ds.classes`, other columns become fields; a tar
shard's members become fields by extension (`jpg`, `png`, `webp`: images; `cls`: int; `txt`, `json`: str;
`npy`: arrays; anything else: bytes). A null image, a sample missing a field, a corrupt shard: the error
names the file and the row or key. A Hugging Face script:

```diff
 import torch
-from datasets import load_dataset
-from torchvision.transforms import v2 as T
+import fastload
+from fastload import transforms as T

-train = load_dataset("parquet", data_files="data/train-*.parquet", split="train")
-augment = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToImage(),
-    T.ToDtype(torch.float32, scale=True), T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
-train.set_transform(lambda b: {"image": [augment(im.convert("RGB")) for im in b["image"]], "label": b["label"]})
-loader = torch.utils.data.DataLoader(train, batch_size=256, shuffle=True, num_workers=8, drop_last=True)
+train = fastload.open("data/train-*.parquet", as_dict=True, transforms={"image": [
+    T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToDtype(torch.float32, scale=True),
+    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]})
+print(train.classes)
+loader = fastload.DataLoader(train, batch_size=256, shuffle=True, num_workers=8, drop_last=True)
 for batch in loader:
     images, labels = batch["image"], batch["label"]
     ...
```

A WebDataset script (fields are named by extension; the order is a full shuffle of every sample each epoch,
not a 1,000-sample buffer):

```diff
 import torch
-import webdataset as wds
-from torchvision.transforms import v2 as T
+import fastload
+from fastload import transforms as T

-augment = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToImage(),
-    T.ToDtype(torch.float32, scale=True), T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
-train = (wds.WebDataset("shards/train-{000..099}.tar", shardshuffle=True).shuffle(1000).decode("pil")
-         .to_tuple("jpg", "cls").map_tuple(augment, int).batched(256))
-loader = wds.WebLoader(train, batch_size=None, num_workers=8)
+train = fastload.open("shards/train-{000..099}.tar", transforms={"jpg": [
+    T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToDtype(torch.float32, scale=True),
+    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]})
+loader = fastload.DataLoader(train, batch_size=256, shuffle=True, num_workers=8, drop_last=True)
 for images, labels in loader:
     ...
```
'''


def section() -> str:
    text = README.read_text() if README.exists() else ""
    return TITLE + text.split(TITLE, 1)[1].split("\n## ", 1)[0] if TITLE in text else SECTION


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
