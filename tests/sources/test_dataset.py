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
