"""RandomCrop with padding on the GPU decoders (no GPU: DALI's CPU-only mode, nvjpeg with PIL decoding on CPU
tensors): each padded window's box is decoded at its own ``decode_hw``, unflipped, and the batched torch engine
assembles the window (``engine_torch.assemble_rows``) as the native decoder does (``padding.assemble``).

Bounds, against the native decoder without DCT scaling on the same plan (tests/decoders/conftest.py's samples,
Resize((20, 28)) then RandomCrop((24, 32)) padded on every side, 3 seeds x 4 modes): the constant fill equal exactly
(its pixels are the fill in both); per sample mean absolute difference measured <= 0.76 (DALI; single pixels up
to 12 where a box shrunk from a large photo has its edges resampled differently, dali.py's note) and <= 0.17
(nvjpeg; single pixels 1), bounded at 1.0 as the plain crops are (dali.py, nvjpeg.py without DCT scaling).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import fastload
from fastload import transforms as T
from fastload._augment.engine_torch import assemble_rows, padding_columns
from fastload._augment.padding import MODES, Padding, assemble, index_map
from fastload.decoders._base import ImageSources
from fastload.decoders.native import NativeDecoder
from fastload.decoders.nvjpeg import NvjpegDecoder
from decoders.conftest import HAVE_DALI, OUT_HW, SAMPLES, pil_decode, sizes

FILL = (10, 200, 30)
MEAN = 1.0  # per sample, against the native decoder (module docstring)
needs_dali = pytest.mark.skipif(not HAVE_DALI, reason="needs NVIDIA DALI (pip install 'torch-fastload[dali]')")


# -- the assembly alone ---------------------------------------------------------------------------------------
def padded_boxes(mode: str, seed: int, n: int = 9, h: int = 11, w: int = 13):
    """n boxes of random sizes <= (h, w) at the top left of (h, w) rows whose rest is noise (an assembly reading
    outside its box shows it), windows that reach past the box on each side under ``mode``, random flips."""
    rng = np.random.default_rng(seed)
    bh, bw = rng.integers(1, h + 1, n), rng.integers(1, w + 1, n)
    top = rng.integers(-h, h // 2, n)  # before the box's first row ... past its last
    left = rng.integers(-w, w // 2, n)
    rows = index_map(top, h, bh, mode).astype(np.int32)
    cols = index_map(left, w, bw, mode).astype(np.int32)
    active = rng.random(n) < 0.8
    active[0] = True
    fill = rng.integers(0, 256, (n, 3)).astype(np.float64) + 0.6  # truncated, as padding.assemble does
    pad = Padding(active, np.stack([bh, bw], 1), rows, cols, fill)
    hflip = rng.random(n) < 0.5
    tiles = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
    boxes = [rng.integers(0, 256, (bh[k], bw[k], 3), dtype=np.uint8) for k in range(n)]
    for k in range(n):
        tiles[k, :bh[k], :bw[k]] = boxes[k]
    plan = SimpleNamespace(geometry=SimpleNamespace(pad=pad, hflip=hflip))
    return plan, tiles, boxes


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(4))
def test_the_torch_assembly_equals_padding_assemble(mode, seed):
    """assemble_rows on rows holding each box at the top left equals padding.assemble on the boxes, byte for byte,
    for every mode, flips and windows past the box on each side; rows of samples that are not padded untouched.
    Fails with the flip not mirrored into the columns, the fill taken from the wrong sample or the box read with
    the box's own width as its row stride."""
    plan, tiles, boxes = padded_boxes(mode, seed)
    pad = plan.geometry.pad
    rows = torch.from_numpy(tiles.copy())
    assemble_rows(rows, [torch.from_numpy(a) for a in padding_columns(plan)])
    for k in range(len(boxes)):
        if not pad.active[k]:
            assert np.array_equal(rows[k].numpy(), tiles[k])
            continue
        expect = assemble(boxes[k], pad.rows[k], pad.cols[k], pad.fill[k], bool(plan.geometry.hflip[k]))
        assert np.array_equal(rows[k].numpy(), expect), (mode, k)


# -- the decoders against the native one on the same plan -----------------------------------------------------
def padded_plan(mode: str, seed: int, **crop):
    hw = sizes(SAMPLES)
    crop = crop or dict(padding=(5, 3, 7, 2))
    pipe = T.ImagePipeline([T.Resize((20, 28)), T.RandomCrop(OUT_HW, padding_mode=mode, fill=FILL, **crop),
                            T.RandomHorizontalFlip()])
    p = pipe.plan(hw[:, 0], hw[:, 1], np.random.default_rng(seed))
    assert p.augment.geometry.pad.active.all() and p.flips.any() and not p.flips.all()
    return p


def native_of(p):
    out = np.zeros((len(SAMPLES), *OUT_HW, 3), np.uint8)
    assert NativeDecoder(dct_scaling=False).decode(ImageSources.from_bytes(SAMPLES, sizes(SAMPLES)), p, out) == []
    return out


def decoded(make, p):
    dec = make()
    out = torch.full((len(SAMPLES), *OUT_HW, 3), 77, dtype=torch.uint8)
    assert dec.decode(ImageSources.from_bytes(SAMPLES, sizes(SAMPLES)), p, out) == []
    dec.close()
    return out.numpy()


def dali():
    from fastload.decoders.dali import DaliDecoder

    return DaliDecoder(len(SAMPLES), OUT_HW)


def nvjpeg():
    return NvjpegDecoder(len(SAMPLES), OUT_HW, device="cpu", decode_fn=pil_decode)


DECODERS = [pytest.param(dali, id="dali", marks=needs_dali), pytest.param(nvjpeg, id="nvjpeg")]


def check_against_native(got, ref, p):
    pad = p.augment.geometry.pad
    cols = np.where(p.flips[:, None], pad.cols[:, ::-1], pad.cols)
    border = (pad.rows < 0)[:, :, None] | (cols < 0)[:, None, :]  # (n, H, W): the constant fill's pixels
    assert np.array_equal(got[border], ref[border])
    assert (got[border] == FILL).all() if border.any() else True
    d = np.abs(got.astype(np.int64) - ref.astype(np.int64)).mean(axis=(1, 2, 3))
    assert d.max() <= MEAN, d
    return border


@pytest.mark.parametrize("make", DECODERS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(3))
def test_a_padded_random_crop_on_a_gpu_decoder_equals_the_native_decoders(make, mode, seed):
    """decode() with a padded RandomCrop (after a Resize, then flips) vs the native decoder on the same plan: the
    constant fill exactly, everything else within the resampling difference. Fails with the box decoded at the
    tile's size (not decode_hw), mirrored by the decoder (then again by the assembly), or not assembled."""
    p = padded_plan(mode, seed)
    border = check_against_native(decoded(make, p), native_of(p), p)
    assert border.any() == (mode == "constant")


@pytest.mark.parametrize("make", DECODERS)
def test_pad_if_needed_on_a_gpu_decoder_equals_the_native_decoders(make):
    """pad_if_needed: a window larger than the (resized) image on both axes, filled around it."""
    hw = sizes(SAMPLES)
    pipe = T.ImagePipeline([T.Resize((15, 20)), T.RandomCrop(OUT_HW, pad_if_needed=True, fill=FILL),
                            T.RandomHorizontalFlip()])
    p = pipe.plan(hw[:, 0], hw[:, 1], np.random.default_rng(7))
    assert (p.augment.geometry.pad.decode_hw == (15, 20)).all()
    assert check_against_native(decoded(make, p), native_of(p), p).any()


@needs_dali
def test_a_loader_with_a_padded_random_crop_runs_on_dali_as_on_native(small_images):
    """The CIFAR recipe, RandomCrop(32, padding=4) + flip (+ a vertical flip: the engine after the assembly), is no
    longer refused by decoder='dali': the same labels and shapes as the native decoder, pixels within the
    resampling bound, and the fill exactly where the native decoder has it."""
    ds = fastload.open(small_images, transforms={"image": [T.RandomCrop(32, padding=4, fill=FILL),
                                                           T.RandomHorizontalFlip(), T.RandomVerticalFlip()]})
    kw = dict(batch_size=5, seed=3, shuffle=True)
    native = [(x.clone(), y.clone()) for x, y in fastload.DataLoader(ds, **kw)]
    dali = [(x.clone(), y.clone()) for x, y in fastload.DataLoader(ds, decoder="dali", **kw)]
    assert len(native) == len(dali) == 3
    bordered = 0
    for (a, la), (b, lb) in zip(native, dali):
        assert a.shape == b.shape and torch.equal(la, lb)
        a, b = a.permute(0, 2, 3, 1), b.permute(0, 2, 3, 1)  # NCHW batches
        fill = (a == torch.tensor(FILL, dtype=torch.uint8)).all(dim=-1)
        bordered += int(fill.any())
        assert torch.equal(b[fill], a[fill])
        assert (a.float() - b.float()).abs().mean() < 2.0
    # a border in some batch (which ones depends on the draws: a window may stay inside its image)
    assert bordered


@needs_dali
def test_dali_keeps_one_graph_for_a_padded_pipelines_batches_with_and_without_padded_windows(monkeypatch):
    """A batch of a padded pipeline none of whose windows leaves its image runs on the padded graph too (sizes all
    out_hw): built once, not rebuilt whenever a batch (or the hybrid's GPU share) has no padded window; every batch
    as the native decoder's. Fails with decode_sizes giving None for such a batch (4 builds instead of 2)."""
    from fastload.decoders.dali import DaliDecoder

    builds = []
    real = DaliDecoder._build
    monkeypatch.setattr(DaliDecoder, "_build", lambda self: (builds.append(self._padded), real(self))[1])
    hw = sizes(SAMPLES)
    pipe = T.ImagePipeline([T.Resize((40, 50)), T.RandomCrop(OUT_HW, padding=1, fill=FILL)])
    plans = [pipe.plan(hw[:, 0], hw[:, 1], np.random.default_rng(seed)) for seed in range(40)]
    some = next(p for p in plans if p.augment.geometry.pad.active.any())
    none = next(p for p in plans if not p.augment.geometry.pad.active.any())
    dec = DaliDecoder(len(SAMPLES), OUT_HW)
    for p in (some, none, some):
        out = torch.zeros((len(SAMPLES), *OUT_HW, 3), dtype=torch.uint8)
        assert dec.decode(ImageSources.from_bytes(SAMPLES, hw), p, out) == []
        d = np.abs(out.numpy().astype(np.int64) - native_of(p).astype(np.int64)).mean(axis=(1, 2, 3))
        assert d.max() <= MEAN, d
    assert builds == [False, True], builds
    dec.close()


def test_resampling_to_per_sample_sizes_puts_each_box_at_the_top_left_of_a_zero_row():
    """crop_resize_flip with ``sizes``: sample k equals its crop resampled to ``sizes[k]`` alone, at the top left,
    zeros elsewhere (what the DALI graph's fn.pad gives). Fails with the rows past a sample's size not zeroed."""
    from fastload.decoders._resample import crop_resize_flip

    rng = np.random.default_rng(0)
    images = torch.from_numpy(rng.integers(0, 256, (4, 3, 40, 50), dtype=np.uint8))
    crops = torch.tensor([[0, 0, 40, 50], [3, 5, 20, 30], [10, 2, 7, 9], [0, 0, 1, 1]])
    sizes_ = torch.tensor([[24, 32], [20, 28], [5, 31], [1, 1]])
    flips = torch.zeros(4, dtype=torch.bool)
    out = torch.full((4, 24, 32, 3), 77, dtype=torch.uint8)
    crop_resize_flip(images, crops, flips, (24, 32), out, sizes=sizes_)
    for k in range(4):
        h, w = sizes_[k].tolist()
        alone = torch.empty((1, h, w, 3), dtype=torch.uint8)
        crop_resize_flip(images[k:k + 1], crops[k:k + 1], flips[k:k + 1], (h, w), alone)
        assert torch.equal(out[k, :h, :w], alone[0]), k
        rest = torch.ones((24, 32), dtype=torch.bool)
        rest[:h, :w] = False
        assert not out[k][rest].any(), k
