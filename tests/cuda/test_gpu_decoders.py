"""decoder='dali' and decoder='auto' (CPU threads + the GPU decoder sharing each batch) on a GPU: batches
match the native decoder's within the decoders' stated tolerance, labels exactly, and a corrupt JPEG is
reported per sample. Skipped without CUDA (and DALI for the DALI cases)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
from fastload import transforms as T

from gpu_common import MAD_TOLERANCE as TOLERANCE, NEEDS_CUDA, decoder_param
from conftest import packed_image_folder  # noqa: E402 (gpu_common puts tests/ on sys.path)

pytestmark = NEEDS_CUDA


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return packed_image_folder(tmp_path_factory.mktemp("gpudec"), classes=4, per_class=24, workers=2)


def batches(ds, **kw):
    return [(x.cpu().clone(), y.cpu().clone()) for x, y in fastload.DataLoader(ds, batch_size=16, seed=9, **kw)]


@pytest.mark.parametrize("decoder", [decoder_param("dali"), decoder_param("auto")])
@pytest.mark.parametrize("num_workers", [0, 4])
def test_gpu_decoders_match_native(packed, decoder, num_workers):
    ds = fastload.open(packed, transforms={"image": [T.RandomResizedCrop(64), T.RandomHorizontalFlip()]})
    ref = batches(ds, num_workers=num_workers)
    loader_kw = dict(num_workers=num_workers, decoder=decoder, device="cuda")
    got = batches(ds, **loader_kw)
    if decoder == "auto":  # else it would compare native with native
        assert fastload.DataLoader(ds, batch_size=16, **loader_kw)._batcher.images.hybrid is not None
    assert len(ref) == len(got)
    for (rx, ry), (gx, gy) in zip(ref, got):
        assert torch.equal(ry, gy) and rx.shape == gx.shape and rx.dtype == gx.dtype
        diff = (rx.float() - gx.float()).abs().flatten(1).mean(1)
        assert diff.max() < TOLERANCE, diff


@pytest.mark.parametrize("decoder", [decoder_param("auto")])
def test_auto_shares_batches_between_cpu_and_gpu(packed, decoder):
    ds = fastload.open(packed, transforms={"image": [T.RandomResizedCrop(64)]})
    dl = fastload.DataLoader(ds, batch_size=16, num_workers=4, decoder=decoder, device="cuda")
    for _ in range(2):
        for _ in dl:
            pass
    split = dl._batcher.images.hybrid
    assert split is not None, "decoder='auto' found no GPU decoder (install nvidia-dali or a CUDA torchvision)"
    # The GPU half's rate is device time (hybrid.DeviceTimer), read a batch or more late, when its end event
    # has completed: the attribute may still hold an older value, or None. Let the device finish (a test may
    # synchronise) and read the rates through stats(), which collects every completed half first.
    torch.cuda.synchronize()
    stats = split.stats()
    assert 0.0 < stats["cpu_share"] < 1.0 and stats["cpu_rate"] and stats["gpu_rate"], stats
    assert np.isfinite(stats["cpu_share"])
