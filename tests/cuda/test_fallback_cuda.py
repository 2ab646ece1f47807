"""Per-sample transforms (issue 21 item 4) with ``device="cuda"`` (skipped without CUDA): the host slots are
pinned and CUDA is initialised before the transform workers fork, so the rows must reach them through the
shared-memory staging area (never the pinned slot itself) and the workers must not touch CUDA."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fastload  # noqa: E402
import fastload.transforms as T  # noqa: E402
from conftest import packed_image_folder  # noqa: E402

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def invert(img: torch.Tensor) -> torch.Tensor:
    assert img.device.type == "cpu"
    return 255 - img


def test_per_sample_transforms_before_the_device_copy(tmp_path):
    torch.cuda.init()  # as a training script has, before the loader's workers fork
    path = packed_image_folder(tmp_path)
    ds = fastload.open(path, transforms={"image": [T.RandomResizedCrop(24), T.RandomHorizontalFlip(), invert]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        on_gpu = [b[0].cpu() for b in fastload.DataLoader(ds, batch_size=4, seed=0, shuffle=True, num_workers=2,
                                                          device="cuda")]
        on_cpu = [b[0].clone() for b in fastload.DataLoader(ds, batch_size=4, seed=0, shuffle=True, num_workers=0)]
    assert len(on_gpu) == len(on_cpu) and all(torch.equal(a, b) for a, b in zip(on_gpu, on_cpu))
