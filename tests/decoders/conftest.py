"""What the decoder tests share (tests/decoders/, one file per module of fastload/decoders/, and the GPU
tests outside): a set of JPEGs of every flavour built at test time, their plans, the native reference decode,
PIL standing in for nvJPEG, and the per-sample difference the tolerances are stated in."""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from conftest import jpeg_bytes
from fastload import _C
from fastload.transforms import ImagePipeline, Plan, RandomHorizontalFlip, RandomResizedCrop

try:
    import nvidia.dali  # noqa: F401

    HAVE_DALI = True
except Exception:  # noqa: BLE001  (a broken DALI raises anything at import, e.g. RuntimeError for a missing libcudart)
    HAVE_DALI = False

OUT_HW = (24, 32)


def encode(h, w, seed, mode="RGB", **kw):
    """A smooth picture (conftest.jpeg_bytes) re-encoded with PIL options (progressive, subsampling)."""
    img = Image.open(io.BytesIO(jpeg_bytes(h, w, seed=seed, quality=95))).convert(mode)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


SAMPLES = [  # various sizes and JPEG flavours, built at test time
    encode(120, 160, 1),
    encode(37, 53, 2),
    encode(300, 200, 3, progressive=True),
    encode(90, 90, 4, mode="L"),
    encode(64, 256, 5, subsampling=0),
    encode(200, 150, 6, subsampling=1),
    encode(50, 70, 7, mode="L", progressive=True),
    encode(81, 47, 8, mode="CMYK"),
    encode(17, 400, 9),
    encode(256, 192, 10, progressive=True, subsampling=0),
    encode(33, 33, 11),
]


def sizes(blobs):
    return np.array([Image.open(io.BytesIO(b)).size[::-1] for b in blobs], np.int64)


def plan(blobs, seed=0):
    hw = sizes(blobs)
    pipe = ImagePipeline([RandomResizedCrop(OUT_HW), RandomHorizontalFlip()])
    return pipe.plan(hw[:, 0], hw[:, 1], np.random.default_rng(seed))


def plan_of(crops, flips, out_hw=OUT_HW):
    """A plan written by hand: boxes ``crops`` (n, 4) and ``flips`` (n,), every output ``out_hw``."""
    crops = np.asarray(crops)
    return Plan(crops, np.asarray(flips), np.tile(np.asarray(out_hw, np.int32), (len(crops), 1)))


def native(blobs, p, dct_scaling):
    """What the Batcher does: one native decode_batch over a region holding all blobs."""
    n = len(blobs)
    lengths = np.array([len(b) for b in blobs], np.int64)
    out = np.full((n, *OUT_HW, 3), 77, np.uint8)
    fails = _C.decode_batch(_C.Pool(1), [b"".join(blobs)], np.zeros(n, np.int64),
                            np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64), lengths,
                            np.zeros(n, np.uint8), sizes(blobs).astype(np.int32), p.crops, p.flips, out,
                            dct_scaling=dct_scaling)
    assert fails == []
    return out


def mad(a, b):
    """Mean absolute difference per sample."""
    return np.abs(a.astype(np.int32) - b.astype(np.int32)).reshape(len(a), -1).mean(axis=1)


def pil_decode(datas: list) -> list:
    """nvJPEG's contract: a list of (3, H, W) uint8 tensors, RuntimeError for a corrupt image."""
    out = []
    for d in datas:
        try:
            img = Image.open(io.BytesIO(d.numpy().tobytes()))
            img.load()
        except Exception as e:  # noqa: BLE001  (what torchvision raises for a bad image)
            raise RuntimeError(f"decode failed: {e}") from None
        out.append(torch.from_numpy(np.array(img.convert("RGB"))).permute(2, 0, 1).contiguous())
    return out
