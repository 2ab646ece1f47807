"""Fixtures of the formats tests: the datasets they read (packed once per session through the shared
``pack_once``), copied before a test damages them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import make_image_folder
from fastload.formats._manifest import MANIFEST_NAME

from .corrupt_common import FIELDS, make_samples, read_all


@pytest.fixture(scope="module")
def packed(pack_once) -> tuple[Path, list]:
    """90 samples of every non-image field kind in 4K shards (at least 3), and every sample as read back."""
    root = pack_once("corrupt", lambda: make_samples(90), shard_size="4K", workers=0, schema=FIELDS)
    shards = sorted(p.name for p in root.glob("shard-*.fls"))
    assert len(shards) >= 3, shards
    return root, read_all(root)


@pytest.fixture
def ds(packed, tmp_path) -> Path:
    root = tmp_path / "ds"
    shutil.copytree(packed[0], root)
    return root


@pytest.fixture
def expected(packed) -> list:
    return packed[1]


@pytest.fixture
def shard1_start(ds) -> int:
    doc = json.loads((ds / MANIFEST_NAME).read_text())
    return doc["shards"][0]["num_samples"]


@pytest.fixture(scope="module")
def photos(pack_once) -> Path:
    """36 pictures (3 classes of 12) in 24KB shards: the remote tests' dataset, uploaded or served as is."""
    return pack_once("photos", lambda: make_image_folder(Path(pack_once.root) / "photos_src", classes=3, per_class=12),
                     shard_size="24KB", workers=1)
