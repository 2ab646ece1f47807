"""fastload/sources/dataset.py: any map-style torch Dataset as a source -- packed and read back in both formats,
its classes kept and every sample checked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
from fastload import SourceError
from fastload.sources import DatasetSource

from conftest import FORMATS


class DictDataset(torch.utils.data.Dataset):
    def __init__(self, n=20):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        from PIL import Image

        rng = np.random.default_rng(i)
        return {
            "img": Image.fromarray(rng.integers(0, 255, (20 + i, 30, 3), dtype=np.uint8)),
            "tokens": torch.arange(i % 5 + 1, dtype=torch.int64),
            "emb": torch.full((4,), float(i)),
            "score": float(i) / 3,
            "id": i,
            "name": f"s{i}",
            "blob": bytes([i]) * i,
        }


@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_dataset_source(tmp_path, fmt):
    src = DictDataset()
    fastload.pack(src, tmp_path / "out", format=fmt, workers=2, shard_size="2K")
    ds = fastload.open(tmp_path / "out", as_dict=True)
    assert ds.schema["tokens"].shape == (None,) and ds.schema["emb"].shape == (4,)
    assert ds.schema["img"].kind == "image"
    for i in (0, 7, 19):
        s, ref = ds[i], src[i]
        assert np.array_equal(s["img"].permute(1, 2, 0).numpy(), np.asarray(ref["img"]))  # small -> raw, lossless
        assert torch.equal(s["tokens"], ref["tokens"]) and torch.equal(s["emb"], ref["emb"])
        assert (s["score"], s["id"], s["name"], s["blob"]) == (ref["score"], ref["id"], ref["name"], ref["blob"])
    tup = fastload.open(tmp_path / "out")[3]
    assert isinstance(tup, tuple) and len(tup) == 7


class Classy(torch.utils.data.Dataset):
    classes = ["cat", "dog"]

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"x": torch.full((2,), i), "label": i % 2} if i != 3 else (torch.zeros(2), 1)


def test_dataset_sources_keep_classes_and_check_every_sample():
    src = DatasetSource(Classy(), infer_samples=2)
    assert src.as_dict and src.schema.names == ("x", "label") and src.metadata["classes"] == ["cat", "dog"]
    assert src.load(1)[1] == 1 and src.describe(3) == "Classy[3]"
    with pytest.raises(fastload.SchemaError, match="expected a dict sample like sample 0, got tuple"):
        src.load(3)
    with pytest.raises(SourceError, match="the source TensorDataset has no samples"):
        DatasetSource(torch.utils.data.TensorDataset(torch.zeros(0)))
    with pytest.raises(SourceError, match="is not a map-style dataset"):
        DatasetSource(iter([1, 2]))


def test_hugging_face_formats_columns_and_class_names(tmp_path):
    """Issue 27 row 3, the adapter's details: a real ``datasets.Dataset`` in torch format with only some columns
    shown still gives its images' own bytes; several ClassLabel columns keep all their names, ``classes`` from
    the one called label; the source's own dataset is not changed."""
    from datasets import ClassLabel, Dataset, Features, Image, Value

    from conftest import jpeg_bytes

    paths = []
    for i in range(4):
        paths.append(tmp_path / f"{i}.jpg")
        paths[-1].write_bytes(jpeg_bytes(40, 50, seed=i))
    features = Features({"image": Image(), "label": ClassLabel(names=["a", "b"]), "kind": ClassLabel(names=["x", "y", "z"]),
                         "note": Value("string")})
    hf = Dataset.from_dict({"image": [str(p) for p in paths], "label": [0, 1, 1, 0], "kind": [2, 1, 0, 2],
                            "note": ["n"] * 4}, features=features)
    shown = hf.with_format("torch", columns=["image", "label", "kind"])
    src = DatasetSource(shown)
    assert src.schema.names == ("image", "label", "kind") and src.schema["image"].kind == "image"
    assert src.metadata["classes"] == ["a", "b"]
    assert src.metadata["class_names"] == {"label": ["a", "b"], "kind": ["x", "y", "z"]}
    assert shown.features["image"].decode and shown.format["type"] == "torch"  # the user's dataset as it was
    fastload.pack(shown, tmp_path / "out", workers=2)
    ds = fastload.open(tmp_path / "out", decode=False)
    assert [bytes(ds[i][0]) for i in range(4)] == [p.read_bytes() for p in paths]
    assert [(int(ds[i][1]), int(ds[i][2])) for i in range(4)] == [(0, 2), (1, 1), (1, 0), (0, 2)]
    assert ds.classes == ["a", "b"]
    from datasets import DatasetDict

    with pytest.raises(SourceError, match=r"DatasetDict holds splits \(train, test\), not samples: pack one split, "
                                          r"e.g. fastload.pack\(ds\['train'\]"):
        fastload.pack(DatasetDict({"train": hf, "test": hf}), tmp_path / "dict")
