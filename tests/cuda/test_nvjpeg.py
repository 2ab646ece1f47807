"""decoder='nvjpeg' (torchvision on the GPU): same shapes/dtypes as the native path, pixels close.
Skipped without CUDA and torchvision."""

from __future__ import annotations


import fastload
from fastload import transforms as T

from gpu_common import NEEDS_CUDA_AND_TORCHVISION
from conftest import make_image_folder  # noqa: E402 (gpu_common puts tests/ on sys.path)

pytestmark = NEEDS_CUDA_AND_TORCHVISION
DECODER = "nvjpeg"  # for gpu_verdicts: these tests prove decoder="nvjpeg"


def test_nvjpeg_matches_native(tmp_path):
    make_image_folder(tmp_path / "src", classes=2, per_class=8)
    fastload.pack(tmp_path / "src", tmp_path / "ds", workers=0)
    ds = fastload.open(tmp_path / "ds", transforms={"image": [T.RandomResizedCrop(48), T.RandomHorizontalFlip()]})
    native = [x.clone() for x, _ in fastload.DataLoader(ds, batch_size=4, seed=5)]
    gpu = [x.cpu() for x, _ in fastload.DataLoader(ds, batch_size=4, seed=5, decoder="nvjpeg", device="cuda")]
    for a, b in zip(native, gpu):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert (a.float() - b.float()).abs().mean() < 4.0
