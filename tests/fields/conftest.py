"""Fixtures shared by the tests of fastload/fields/ (one codec per field kind)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fastload

FORMATS = ("shards", "lmdb")


class Samples(torch.utils.data.Dataset):
    """A map-style dataset of dict samples, packed through fastload's any-Dataset source."""

    def __init__(self, samples: list[dict]):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict:
        return self.samples[i]


@pytest.fixture(params=FORMATS)
def pack_samples(request, tmp_path: Path):
    """``pack_samples(samples, schema=None, **options) -> path``: ``samples`` (dicts) packed in one format; a
    test that takes this runs once for shards and once for LMDB."""

    def pack(samples: list[dict], schema: dict | None = None, **options) -> Path:
        dest = tmp_path / f"ds_{request.param}"
        fastload.pack(Samples(samples), dest, format=request.param, schema=schema, workers=0, **options)
        return dest

    pack.format = request.param
    return pack


def batches(ds, batch_size: int, **options) -> list:
    """Every batch of ``ds`` through fastload's loader (the fast path, in order)."""
    options.setdefault("num_workers", 0)
    return list(fastload.DataLoader(ds, batch_size=batch_size, **options))
