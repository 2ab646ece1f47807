"""What the tests of the native core (fastload._C, csrc/) share: synthetic photos encoded in every JPEG
variant, PIL references, and the decode_batch argument builder. One test file per C++ file:

  test_jpeg.py     csrc/jpeg.cc     decode, header info, windowed and DCT-scaled decoding, corrupt input
  test_resize.py   csrc/resize.cc   crop + resize + flip against PIL, every SIMD kernel the same bytes
  test_batch.py    csrc/batch.cc    decode_batch: mixed batches, failures reported per sample
  test_gather.py   csrc/gather.cc   gather_rows and gather_pieces against numpy, bounds checks
  test_pool.py     csrc/pool.cc     the thread pool: joined on delete, shared by threads, after fork
  test_binding.py  csrc/binding.cc, csrc/bind_*  argument checking, buffer objects, the GIL released

Tolerances (mean absolute difference in gray levels against PIL's
``Image.open(jpeg).convert("RGB").crop(box).resize(size, Image.BILINEAR)``):
  full decode                 0.5 (measured 0: same libjpeg-turbo ISLOW decoder)
  crop + resize, no DCT scale 0.5, max 3 (measured <= 0.01, max 1: int16 vs int32 weights)
  with DCT-scaled decoding    3.0 (measured 0.3-1.6 on these synthetic images)
  flip, thread counts, windowed decoding vs full decoding: exact.
"""

import io

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

_C = pytest.importorskip("fastload._C")

DCT_TOLERANCE = 3.0


def photo(h, w, seed=0):
    """Smooth gradients, a few shapes and mild noise: JPEG-friendly like a photo."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.stack([x * 255 / w, y * 255 / h, 128 + 100 * np.sin((x + y) / 17.0)], -1)
    img[h // 4 : h // 2, w // 5 : w // 2] = (200, 40, 90)
    img[(x - w * 0.7) ** 2 + (y - h * 0.6) ** 2 < (min(h, w) * 0.15) ** 2] = (20, 220, 60)
    img += rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def encode(arr, mode="RGB", quality=90, **kw):
    buf = io.BytesIO()
    Image.fromarray(arr).convert(mode).save(buf, "JPEG", quality=quality, **kw)
    return buf.getvalue()


def pil_rgb(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def pil_crop_resize(rgb, crop, out_hw):
    top, left, h, w = crop
    img = Image.fromarray(rgb).crop((left, top, left + w, top + h))
    return np.asarray(img.resize((out_hw[1], out_hw[0]), Image.BILINEAR))


def mad(a, b):
    return float(np.abs(a.astype(np.int32) - b.astype(np.int32)).mean())


def maxdiff(a, b):
    return int(np.abs(a.astype(np.int32) - b.astype(np.int32)).max())


IMG = photo(375, 500)
VARIANTS = {
    "rgb420": encode(IMG),
    "rgb444": encode(IMG, subsampling=0),
    "rgb422": encode(IMG, subsampling=1),
    "progressive": encode(IMG, progressive=True),
    "gray": encode(IMG, "L"),
    "cmyk": encode(IMG, "CMYK"),
}
JPEG = VARIANTS["rgb420"]
CROPS = [  # (top, left, height, width), (out_h, out_w)
    ((0, 0, 375, 500), (224, 224)),
    ((10, 20, 300, 400), (224, 224)),
    ((37, 101, 150, 90), (224, 224)),  # upscale
    ((200, 333, 175, 167), (64, 48)),  # touches the bottom-right corner
    ((3, 7, 33, 41), (5, 9)),
    ((100, 100, 1, 1), (3, 3)),
]


def batch_args(samples, out_hw=(32, 32)):
    """samples: list of (bytes, encoding, (h, w), crop, flip) packed into one region."""
    blob = b"".join(s[0] for s in samples)
    lengths = np.array([len(s[0]) for s in samples], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    n = len(samples)
    return dict(
        regions=[blob],
        region=np.zeros(n, np.int64),
        offset=offsets,
        length=lengths,
        encoding=np.array([s[1] for s in samples], np.uint8),
        src_hw=np.array([s[2] for s in samples], np.int32).reshape(n, 2),
        crop=np.array([s[3] for s in samples], np.int32).reshape(n, 4),
        flip=np.array([s[4] for s in samples], np.uint8),
        out=np.full((n, out_hw[0], out_hw[1], 3), 77, np.uint8),
    )


def run_batch(pool, args, **kw):
    return _C.decode_batch(pool, args["regions"], args["region"], args["offset"], args["length"],
                           args["encoding"], args["src_hw"], args["crop"], args["flip"],
                           args["out"], **kw)


def mixed_samples():
    small = photo(61, 83, seed=3)
    out = []
    for i, name in enumerate(sorted(VARIANTS)):
        out.append((VARIANTS[name], 0, (375, 500), (i * 20, i * 30, 300 - i * 20, 400 - i * 40),
                    i % 2))
    out.append((small.tobytes(), 1, (61, 83), (5, 6, 50, 70), 1))
    out.append((small.tobytes(), 1, (61, 83), (0, 0, 61, 83), 0))
    out.append((JPEG, 0, (375, 500), (0, 0, 375, 500), 0))
    return out
