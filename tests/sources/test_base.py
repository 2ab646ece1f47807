"""fastload/sources/_base.py: ``as_source`` -- which adapter each kind of source gets, and sources that are
empty or of no known kind refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
from fastload import Field, SourceError
from fastload.sources import ArraySource, DatasetSource, ImageFolderSource, ManifestSource, as_source


def test_empty_and_bad_sources(tmp_path):
    with pytest.raises(SourceError, match="does not exist"):
        fastload.pack(tmp_path / "nope", tmp_path / "o")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="no class subdirectories"):
        fastload.pack(tmp_path / "empty", tmp_path / "o")
    with pytest.raises(SourceError, match="different lengths"):
        fastload.pack({"a": np.zeros(3), "b": np.zeros(4)}, tmp_path / "o")
    with pytest.raises(SourceError, match="cannot pack"):
        fastload.pack(42, tmp_path / "o")
    with pytest.raises(ValueError, match="image_mode"):
        fastload.pack(tmp_path / "empty", tmp_path / "o", image_mode="png")


def test_each_kind_of_source_gets_its_adapter(tmp_path, image_folder):
    x = np.zeros((4, 2), np.float32)
    np.save(tmp_path / "a.npy", x)
    np.savez(tmp_path / "b.npz", x=x)
    (tmp_path / "m.csv").write_text("path,label\na.jpg,1\n")
    (tmp_path / "m.jsonl").write_text('{"path": "a.jpg", "label": 1}\n')
    assert isinstance(as_source(image_folder), ImageFolderSource)
    for src in (tmp_path / "a.npy", str(tmp_path / "b.npz"), x, {"x": x}, (x, x[:, 0]), [x]):
        assert isinstance(as_source(src), ArraySource), src
    for src in (tmp_path / "m.csv", tmp_path / "m.jsonl"):
        assert isinstance(as_source(src), ManifestSource)
    assert isinstance(as_source(torch.utils.data.TensorDataset(torch.zeros(3))), DatasetSource)
    mine = ArraySource(x)
    assert as_source(mine) is mine
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(SourceError, match="expected a folder, .npy, .npz, .csv or .jsonl file"):
        as_source(tmp_path / "notes.txt")
    with pytest.raises(SourceError, match="schema overrides are not supported for ImageFolder"):
        as_source(image_folder, schema={"label": Field.int("label")})
    with pytest.raises(SourceError, match="schema overrides are not supported for manifest"):
        as_source(tmp_path / "m.csv", schema={"label": Field.int("label")})
