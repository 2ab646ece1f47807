"""GPU decoders with augmentations on the simulated GPU (tests/sim_streams.py; the decoders as
tests/test_gpu_decoders_sim.py runs them: nvjpeg with PIL decoding, DALI's fake pipeline): the batched torch
engine runs on the decoder's own stream, after the decode's writes and before the event the rows are handed on
with; its columns go up from pinned staging (no host wait in any thread); a lagging consumer sees the batches a
keeping-up one does; decoder='auto' pairs native threads (fused native engine) with the GPU decoder (torch
engine) instead of falling back to native threads, a padded RandomCrop included."""

from __future__ import annotations

import pytest
import torch

import fastload
from fastload import _ring
from fastload import transforms as T
from fastload.decoders.dali import DaliDecoder
from fastload.decoders.nvjpeg import NvjpegDecoder
from test_gpu_decoders_sim import dali_on_sim, nvjpeg_on_sim, one_truncated, run  # noqa: F401  (fixtures)
from test_ring import sim_cuda  # noqa: F401  (the fixture)

RECIPE = [T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.TrivialAugmentWide(), T.RandomErasing(1.0)]
CLASSES = {"nvjpeg": NvjpegDecoder, "dali": DaliDecoder}


def watch(sim, monkeypatch, decoder: str) -> list:
    """Per decode call of ``decoder``: (its augmentation launches as (stream, position on it), the ready event it
    handed the rows on with). A launch's position is its index among the ops queued on its stream."""
    launches: list = []
    real_launch = sim.launch

    def launch(fn, reads=(), writes=(), what="kernel"):
        st = sim.current_stream()
        launches.append((st, st.queued, what))
        return real_launch(fn, reads, writes, what)

    sim.launch = launch
    calls: list = []
    cls = CLASSES[decoder]
    real_decode = cls.decode

    def decode(self, sources, plan, out):
        start = len(launches)
        fails = real_decode(self, sources, plan, out)
        mine = [(st, pos) for st, pos, what in launches[start:] if what == f"{decoder} augment"]
        calls.append((mine, self.ready))
        return fails

    monkeypatch.setattr(cls, "decode", decode)
    return calls


@pytest.mark.parametrize("decoder", ["nvjpeg", "dali"])
def test_the_augmentation_is_queued_on_the_decoders_stream_before_its_ready_event(request, monkeypatch,
                                                                                  one_truncated, decoder):
    """Each batch's augmentation is one launch on the stream the decoder decoded on, queued before the event the
    batch carries; under lag no thread waits for the GPU, no access races, and the batches equal a keeping-up
    run's. Fails with the engine launched on another stream (the rows' or the caller's) or after the event."""
    sim = request.getfixturevalue(f"{decoder}_on_sim")
    ds = fastload.open(one_truncated, transforms={"image": RECIPE})
    kw = dict(batch_size=4, shuffle=True, seed=3, num_workers=2, decoder=decoder, on_error="skip", device="cuda")
    ref = run(sim, fastload.DataLoader(ds, **kw), sim.default, lag=False)
    del sim.host_waits[:]
    calls = watch(sim, monkeypatch, decoder)
    seen = run(sim, fastload.DataLoader(ds, **kw), sim.default, lag=True)
    assert not sim.races
    assert not sim.waits_in() and not sim.waits_in("fastload-batcher", busy=False), sim.host_waits
    assert len(seen) == len(ref) == 5
    for (x, y), (sx, sy) in zip(ref, seen):
        assert torch.equal(x, sx) and torch.equal(y, sy)
    assert len(calls) == 5
    for mine, ready in calls:
        assert len(mine) == 1, mine  # one launch per batch: the whole batch, no loop over samples
        (stream, position), = mine
        assert stream == ready.stream and stream.name == decoder, (stream, ready.stream)
        assert position < ready.position, (position, ready.position)


def test_augmented_rows_differ_from_the_crop_only_rows_on_the_simulator(nvjpeg_on_sim, one_truncated):
    """The engine ran on the device rows (not only the host engine in the unit tests): the same loader without the
    pixel augmentations gives other pixels, the same labels."""
    sim = nvjpeg_on_sim
    kw = dict(batch_size=6, seed=2, decoder="nvjpeg", on_error="skip", device="cuda")
    aug = run(sim, fastload.DataLoader(fastload.open(one_truncated, transforms={"image": RECIPE}), **kw),
              sim.default, lag=False)
    plain = run(sim, fastload.DataLoader(fastload.open(one_truncated, transforms={"image": RECIPE[:2]}), **kw),
                sim.default, lag=False)
    assert [torch.equal(a[1], b[1]) for a, b in zip(aug, plain)] == [True] * 3
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(aug, plain))


def test_auto_pairs_native_threads_with_the_gpu_decoder_for_augmented_pipelines(nvjpeg_on_sim, one_truncated,
                                                                                monkeypatch):
    """decoder='auto' with an augmented pipeline: the hybrid (no fallback warning), the native half augmenting fused
    with its decoding, the GPU half with the torch engine on nvjpeg's stream; no race, no host wait; pixels
    near the native loader's (the halves' resampling differs: tests/decoders/test_dali_augment.py's bound)."""
    import warnings

    from fastload import decoders
    from fastload.decoders import hybrid

    sim = nvjpeg_on_sim
    monkeypatch.setattr(hybrid, "_installed_gpu_decoder", lambda: (decoders.kind("nvjpeg"), []))
    monkeypatch.setattr(hybrid.HybridSplit, "_update", lambda self, *a: None)  # half and half
    monkeypatch.setattr(_ring, "_warned", set())
    calls = watch(sim, monkeypatch, "nvjpeg")
    ds = fastload.open(one_truncated, transforms={"image": RECIPE})
    kw = dict(batch_size=6, seed=4, on_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 'auto' no longer decodes with native threads only (and says so)
        loader = fastload.DataLoader(ds, decoder="auto", device="cuda", **kw)
    assert loader._batcher.images.hybrid is not None
    seen = run(sim, loader, sim.default, lag=True)
    ref = [(x.clone(), y.clone()) for x, y in fastload.DataLoader(ds, **kw)]
    assert not sim.races and not sim.waits_in()
    assert len(seen) == len(ref) == 3 and calls and all(len(mine) == 1 for mine, _ in calls)
    for (x, y), (sx, sy) in zip(ref, seen):
        assert torch.equal(y, sy) and (x.float() - sx.float()).abs().mean() < 2.0


def test_auto_pairs_native_threads_with_the_gpu_decoder_for_a_padded_random_crop(nvjpeg_on_sim, one_truncated,
                                                                                 monkeypatch):
    """A padded RandomCrop no longer sends 'auto' to native threads only (it did, saying the GPU decoders decode
    windows inside the image only): the hybrid, no warning, the GPU half assembling the windows on nvjpeg's
    stream. Fails with the GPU decoder's kind refusing the padded crop again."""
    import warnings

    from fastload import decoders
    from fastload.decoders import hybrid

    monkeypatch.setattr(hybrid, "_installed_gpu_decoder", lambda: (decoders.kind("nvjpeg"), []))
    monkeypatch.setattr(hybrid.HybridSplit, "_update", lambda self, *a: None)  # half and half
    monkeypatch.setattr(_ring, "_warned", set())
    ds = fastload.open(one_truncated, transforms={"image": [T.RandomCrop(16, padding=4), T.TrivialAugmentWide()]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = fastload.DataLoader(ds, batch_size=6, decoder="auto", device="cuda", on_error="skip")
    assert loader._batcher.images.hybrid is not None
    assert len(run(nvjpeg_on_sim, loader, nvjpeg_on_sim.default, lag=False)) == 3
    assert not nvjpeg_on_sim.races and not nvjpeg_on_sim.waits_in()
