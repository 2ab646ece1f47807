"""GPU decoders run the plan's augmentation on hardware (skipped without CUDA; per decoder without torchvision /
DALI): TrivialAugmentWide + RandomErasing with the batched torch engine on the decoder's rows, on its stream,
without a host sync (``torch.cuda.set_sync_debug_mode("error")`` during ``decode()`` and, in a fresh process,
over whole epochs of the loader with nvjpeg, dali and auto), agreeing with the native engine on the same rows.

Bounds (not yet measured on a GPU: no GPU was lent when this was written):
- the decoder's augmented rows vs ``run_torch`` on its own geometry-only rows, on the GPU: equal (same engine,
  same device);
- vs the native engine on those rows (copied to the host): values more than 1 level apart <= 0.5% (nearest
  affine edge ties, tests/decoders/test_dali_augment.py measured <= 0.16% on the CPU; CUDA may fuse
  multiply-adds: 1 level), mean <= 0.1;
- the loader vs the native decoder's loader: labels equal, mean absolute difference per batch <= 6.0 (the GPU
  decoders' 4.0 vs DCT-scaled native, gpu_common.MAD_TOLERANCE, plus what equalize/autocontrast stretch);
- a padded RandomCrop (every padding mode, then flips and a vertical flip: the engine after the assembly) vs the
  native decoder without DCT scaling on the same plan: the constant fill equal exactly, mean absolute difference
  per sample <= gpu_common.MAD_TOLERANCE (on the CPU, tests/decoders/test_gpu_padding.py measured <= 0.76).
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch

from gpu_common import MAD_TOLERANCE, NEEDS_CUDA, FreshProcess, decoder_param, lag
from conftest import packed_image_folder  # noqa: E402 (gpu_common puts tests/ on sys.path)
from decoders.conftest import OUT_HW, SAMPLES, plan, plan_of, sizes
from fastload._augment.engine_native import run_native
from fastload._augment.engine_torch import run_torch
from fastload._augment.plan import PlanBuilder
from fastload import transforms as T

pytestmark = NEEDS_CUDA

QUEUED_MS = 200
LIMIT_S = 0.080  # decode() + the augmentation's launches for a dozen small JPEGs; a wait takes ~200 ms


def augmented_plan(seed: int):
    p = plan(SAMPLES, seed)
    b = PlanBuilder.from_crop_plan(p)
    rng = np.random.default_rng(seed)
    for t in (T.TrivialAugmentWide(), T.RandomErasing(0.5)):
        t.plan(b, np.arange(p.n), rng)
    return p.with_augment(b.finish())


def make(decoder: str, n: int):
    if decoder == "nvjpeg":
        from fastload.decoders.nvjpeg import NvjpegDecoder

        return NvjpegDecoder(n, OUT_HW, device=torch.device("cuda", torch.cuda.current_device()))
    from fastload.decoders.dali import DaliDecoder

    return DaliDecoder(n, OUT_HW, device_id=torch.cuda.current_device())


@pytest.mark.parametrize("decoder", [decoder_param("nvjpeg"), decoder_param("dali")])
def test_gpu_decoder_augments_on_its_stream_without_a_host_sync(decoder):
    import time

    n = len(SAMPLES)
    dec = make(decoder, n)
    rows = torch.empty((n, *OUT_HW, 3), dtype=torch.uint8, device="cuda")
    dec.fence(rows)
    for seed in range(4):
        q = augmented_plan(seed)
        assert dec.decode(SAMPLES, plan_of(q.crops, q.flips), rows) == []  # geometry only (and the warm-up)
        torch.cuda.current_stream().wait_event(dec.ready_event())
        tiles = rows.clone()
        expect = run_torch(tiles.permute(0, 3, 1, 2).contiguous(), q.augment, flips=False).permute(0, 2, 3, 1)
        native = run_native(tiles.cpu().numpy().copy(), q.augment)
        torch.cuda.synchronize()
        with torch.cuda.stream(dec.streams.side):
            lag(QUEUED_MS)  # the decoder's stream is busy: a decode that waits for it takes that long
        torch.cuda.set_sync_debug_mode("error")  # a synchronize or a blocking (pageable) copy raises
        try:
            t = time.perf_counter()
            fails = dec.decode(SAMPLES, q, rows)
            took = time.perf_counter() - t
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert fails == []
        torch.cuda.current_stream().wait_event(dec.ready_event())  # the hand-over, on the device
        assert torch.equal(rows, expect), seed
        d = (rows.cpu().numpy().astype(np.int64) - native.astype(np.int64))
        d = np.abs(d)
        assert (d > 1).mean() <= 0.005 and d.mean() <= 0.1, (seed, (d > 1).mean(), d.mean())
        assert took < LIMIT_S, f"decode() took {took * 1e3:.0f} ms with {QUEUED_MS} ms queued: it waited for the GPU"
    dec.close()


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric"])
@pytest.mark.parametrize("decoder", [decoder_param("nvjpeg"), decoder_param("dali")])
def test_gpu_decoder_assembles_a_padded_random_crop_as_the_native_decoder_without_a_host_sync(decoder, mode):
    """Each padded window's box decoded at its own size and assembled on the decoder's stream: no synchronize or
    pageable copy during decode(), the constant fill exactly the native decoder's, the rest within the GPU
    decoders' tolerance."""
    from fastload.decoders._base import ImageSources
    from fastload.decoders.native import NativeDecoder

    n, fill = len(SAMPLES), (10, 200, 30)
    hw = sizes(SAMPLES)
    pipe = T.ImagePipeline([T.Resize((20, 28)), T.RandomCrop(OUT_HW, padding=(5, 3, 7, 2), padding_mode=mode,
                                                             fill=fill), T.RandomHorizontalFlip(),
                            T.RandomVerticalFlip()])
    dec = make(decoder, n)
    rows = torch.empty((n, *OUT_HW, 3), dtype=torch.uint8, device="cuda")
    dec.fence(rows)
    for seed in range(3):
        p = pipe.plan(hw[:, 0], hw[:, 1], np.random.default_rng(seed))
        ref = np.zeros((n, *OUT_HW, 3), np.uint8)
        assert NativeDecoder(dct_scaling=False).decode(ImageSources.from_bytes(SAMPLES, hw), p, ref) == []
        if seed:  # the first decode builds the padded graph (DALI) and warms up
            torch.cuda.set_sync_debug_mode("error")
        try:
            fails = dec.decode(SAMPLES, p, rows)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert fails == []
        torch.cuda.current_stream().wait_event(dec.ready_event())
        got = rows.cpu().numpy()
        pad, g = p.augment.geometry.pad, p.augment.geometry
        cols = np.where(g.hflip[:, None], pad.cols[:, ::-1], pad.cols)
        hole = (pad.rows < 0)[:, :, None] | (cols < 0)[:, None, :]
        hole = np.where(g.vflip[:, None, None], hole[:, ::-1], hole)
        assert np.array_equal(got[hole], ref[hole]), (mode, seed)
        d = np.abs(got.astype(np.int64) - ref.astype(np.int64)).mean(axis=(1, 2, 3))
        assert d.max() <= MAD_TOLERANCE, (mode, seed, d)
    dec.close()


FRESH = FreshProcess(textwrap.dedent("""
    import torch, fastload
    from fastload import transforms as T

    def run(path, decoder, num_workers, crop):
        first = (T.RandomCrop(48, padding=6, pad_if_needed=True, padding_mode="reflect") if crop == "padded"
                 else T.RandomResizedCrop(48))
        recipe = [first, T.RandomHorizontalFlip(), T.TrivialAugmentWide(), T.RandomErasing(0.5)]
        ds = fastload.open(path, transforms={"image": recipe})
        kw = dict(batch_size=4, shuffle=True, seed=1, num_workers=num_workers)
        native = fastload.DataLoader(ds, **kw)  # the native decoder and engine, the same two epochs
        refs = []
        for epoch in range(2):
            native.set_epoch(epoch)
            refs.append([(x.cuda(), y.cuda()) for x, y in native])
        loader = fastload.DataLoader(ds, decoder=decoder, device="cuda", **kw)
        worst = torch.zeros((), device="cuda")
        bad_labels = torch.zeros((), dtype=torch.int64, device="cuda")
        next(iter(loader))  # the decoders made (torchvision's probe decode, DALI's pipeline) before the mode
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # process-wide: the producer thread's decode and augmentation too
        try:
            for epoch in range(2):
                loader.set_epoch(epoch)  # the warm-up's abandoned iteration aside: the reference's epochs
                for (x, y), (rx, ry) in zip(loader, refs[epoch]):
                    worst = torch.maximum(worst, (x.float() - rx.float()).abs().mean())
                    bad_labels += (y != ry).sum()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        return f"ok {float(worst)} {int(bad_labels)}"
"""))


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return packed_image_folder(tmp_path_factory.mktemp("augment-gpu"), classes=3, per_class=10, workers=2)


# all cases in one new process (gpu_common.FreshProcess): num_workers=0 once, GPU decoders run in a producer thread
# either way. "padded": RandomCrop(48, padding=6, pad_if_needed=True, padding_mode="reflect") instead of
# RandomResizedCrop
@pytest.mark.parametrize("decoder,num_workers,crop", [
    (decoder_param("nvjpeg"), 0, "rrc"), (decoder_param("nvjpeg"), 2, "rrc"), (decoder_param("dali"), 2, "rrc"),
    (decoder_param("auto"), 2, "rrc"), (decoder_param("nvjpeg"), 2, "padded"), (decoder_param("dali"), 2, "padded")])
def test_loader_with_augmentations_on_gpu_decoders_under_sync_debug_error(request, packed, decoder, num_workers, crop):
    out = FRESH.result(request, path=str(packed))
    assert out.split()[:1] == ["ok"], out
    _, worst, bad_labels = out.split()
    assert int(bad_labels) == 0 and float(worst) <= 6.0, out
