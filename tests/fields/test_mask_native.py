"""csrc/mask.cc: masks decoded with libpng and moved natively equal the PIL reference (``run_pil_mask``) bit for bit
under every geometric transform, and every malformed PNG is one sample's failure, never a crash."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
from PIL import Image

from fastload import _C
from fastload import transforms as T
from fastload._augment.masks import decode_masks, geometry_of, move_mask
from fastload.fields.mask import encode_png

from .test_mask import blobs

PIPELINES = {
    "rrc-flip": [T.RandomResizedCrop(24), T.RandomHorizontalFlip()],
    "resize-center": [T.Resize(30), T.CenterCrop((20, 26))],
    "upscale": [T.Resize((97, 83))],
    "pad-constant": [T.Resize(36), T.RandomHorizontalFlip(), T.RandomCrop(48, padding=6, pad_if_needed=True)],
    "pad-reflect": [T.RandomCrop(44, padding=(3, 9), pad_if_needed=True, padding_mode="reflect")],
    "pad-edge": [T.RandomCrop(40, padding=5, pad_if_needed=True, padding_mode="edge"), T.RandomHorizontalFlip()],
    "rotation": [T.RandomResizedCrop(32), T.RandomRotation(40)],
    "affine": [T.Resize(40), T.CenterCrop(30), T.RandomAffine(20, translate=(0.2, 0.1), scale=(0.7, 1.3), shear=10)],
    "scale-only": [T.Resize(40), T.CenterCrop(30), T.RandomAffine(0, translate=(0.3, 0.3), scale=(0.5, 1.6))],
    "vflip-rotate": [T.RandomResizedCrop(28), T.RandomVerticalFlip(), T.RandomRotation(90), T.RandomHorizontalFlip()],
}
FILLED = {"pad-constant", "rotation", "affine", "scale-only", "vflip-rotate"}  # reflect and edge copy pixels


def batch(n: int, seed: int):
    rng = np.random.default_rng(seed)
    hw = [(int(rng.integers(20, 70)), int(rng.integers(20, 70))) for _ in range(n)]
    masks = [blobs(h, w, seed * 100 + i, labels=5) for i, (h, w) in enumerate(hw)]
    return masks, [encode_png(m) for m in masks]


def sources(pngs: list[bytes]):
    flat = b"".join(pngs)
    lengths = np.array([len(p) for p in pngs], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return [flat], np.zeros(len(pngs), np.int64), offsets, lengths


@pytest.mark.parametrize("name", list(PIPELINES))
@pytest.mark.parametrize("seed", range(2))
def test_native_masks_equal_the_pil_reference(name, seed):
    masks, pngs = batch(16, seed)
    meta = np.array([m.shape for m in masks], np.int64)
    pipeline = T.ImagePipeline(PIPELINES[name])
    plan = pipeline.plan(meta[:, 0], meta[:, 1], np.random.default_rng(seed))
    out = np.full((16,) + pipeline.output_size, 7, np.uint8)
    assert decode_masks(_C.Pool(2), sources(pngs), meta, plan, out) == []
    geometry = geometry_of(plan)
    for k, m in enumerate(masks):
        ref = move_mask(m, geometry, k, frame=plan.frame_of(k))  # a resize then a crop: Plan.frames, both engines
        assert np.array_equal(out[k], ref), (name, k, int((out[k] != ref).sum()))
    if name in FILLED:
        assert (out == 255).any()  # the fill is the mask's own


def test_every_affine_loop_is_pils():
    """Pillow resamples an affine NEAREST by one of three loops (a pure scale; 16.16 fixed point while the corners
    map within 32768 pixels; double beyond), each rounding its own way: random matrices reach all three."""
    rng = np.random.default_rng(0)
    m = blobs(23, 31, 5, labels=5)
    png = encode_png(m)
    for trial in range(60):
        a = rng.normal(0, 1.5, 6) + [1, 0, 0, 0, 1, 0]
        a[[2, 5]] *= 10
        if trial % 3 == 0:
            a[[1, 3]] = 0  # a scale
        elif trial % 3 == 1:
            a[1] = rng.choice([-1, 1]) * rng.uniform(1500, 3000)  # corners beyond 32768: the double loop
            a[2] = -a[1] * rng.uniform(0, 23)
        out = np.zeros((1, 23, 31), np.uint8)
        ones = np.ones(1, np.uint8)
        fails = _C.decode_mask_batch(_C.Pool(0), [png], np.zeros(1, np.int64), np.zeros(1, np.int64),
                                     np.array([len(png)]), np.array([[23, 31]]), np.array([[0, 0, 23, 31]]),
                                     np.array([[23, 31]]), ones * 0, np.zeros((1, 23), np.int32),
                                     np.zeros((1, 31), np.int32), ones * 0, ones * 0, ones, a[None], 255, out)
        ref = np.asarray(Image.fromarray(m).transform((31, 23), Image.Transform.AFFINE, tuple(a),
                                                      resample=Image.Resampling.NEAREST, fillcolor=255))
        assert fails == [] and np.array_equal(out[0], ref), (trial, a)


def test_decode_mask_is_pils_decode():
    for m in batch(4, 3)[0]:
        png = encode_png(m)
        assert np.array_equal(_C.decode_mask(png, *m.shape), np.asarray(Image.open(io.BytesIO(png))))


def _chunk(kind: bytes, body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")


def _png(arr: np.ndarray, mode: str) -> bytes:
    out = io.BytesIO()
    Image.fromarray(arr).convert(mode).save(out, format="PNG")
    return out.getvalue()


def malformed() -> dict[str, tuple[bytes, tuple[int, int], str]]:
    m = blobs(24, 30, 7)
    good = encode_png(m)
    idat = good.index(b"IDAT") - 4
    n = int.from_bytes(good[idat:idat + 4], "big")
    body = bytearray(good[idat + 8:idat + 8 + n])
    body[len(body) // 2] ^= 0xFF
    corrupt = good[:idat] + _chunk(b"IDAT", bytes(body)) + good[idat + 12 + n:]
    ihdr = bytearray(good[:33])
    ihdr[24] = 16
    sixteen = bytes(ihdr[:29]) + zlib.crc32(bytes(ihdr[12:29])).to_bytes(4, "big") + good[33:]
    return {
        "empty": (b"", (24, 30), "not a PNG"),
        "jpeg": (b"\xff\xd8\xff\xe0" + bytes(60), (24, 30), "not a PNG"),
        "truncated": (good[: len(good) // 2], (24, 30), "does not decode"),
        "header only": (good[:33], (24, 30), "does not decode"),
        "corrupt data": (corrupt, (24, 30), "does not decode"),
        "rgb": (_png(np.repeat(m[..., None], 3, 2), "RGB"), (24, 30), "colour type 2"),
        "palette": (_png(m, "P"), (24, 30), "colour type 3"),
        "16-bit header": (sixteen, (24, 30), "bit depth 16"),
        "other size": (good, (30, 24), "the shard records 24x30"),
        "huge meta": (good, (1 << 20, 1 << 20), "the shard records"),
    }


@pytest.mark.parametrize("case", list(malformed()))
def test_a_malformed_png_fails_its_sample_only(case):
    data, (h, w), words = malformed()[case]
    with pytest.raises(ValueError, match=words):
        _C.decode_mask(data, h, w)
    good = encode_png(blobs(24, 30, 1))
    pngs = [good, data, good]
    meta = np.array([[24, 30], [h, w], [24, 30]], np.int64)
    plan = T.ImagePipeline([T.CenterCrop(20), T.RandomRotation(20)]).plan(
        np.full(3, 24), np.full(3, 30), np.random.default_rng(0))
    out = np.full((3, 20, 20), 7, np.uint8)
    fails = decode_masks(_C.Pool(2), sources(pngs), meta, plan, out)
    assert len(fails) == 1 and fails[0][0] == 1 and words in fails[0][1]
    assert not out[1].any() and (out[[0, 2]] != 7).all()


def test_a_batch_reads_only_inside_its_regions():
    good = encode_png(blobs(24, 30, 1))
    regions, region, offset, length = sources([good, good])
    length[1] += 5  # past the region's end
    plan = T.ImagePipeline([T.CenterCrop(20)]).plan(np.full(2, 24), np.full(2, 30), np.random.default_rng(0))
    out = np.zeros((2, 20, 20), np.uint8)
    fails = decode_masks(_C.Pool(0), (regions, region, offset, length), np.full((2, 2), (24, 30)), plan, out)
    assert fails == [(1, "mask bytes lie outside their shard region")]
