"""A padded RandomCrop on the GPU decoders on the simulated GPU (tests/sim_streams.py; nvjpeg with PIL decoding,
DALI with the fake pipeline, ``FakeDali``, given the per-sample ``size`` it pads as ``fn.pad`` does): the windows'
assembly is queued on the decoder's own stream, after its writes and before the event the rows are handed on
with, its columns go up from pinned staging (no thread waits for the device: no pageable copy), a lagging
consumer sees what a keeping-up one does, and the fill lands where the native decoder puts it."""

from __future__ import annotations

import pytest
import torch

import fastload
from fastload import transforms as T
from test_gpu_decoders_sim import dali_on_sim, nvjpeg_on_sim, one_truncated, run  # noqa: F401  (fixtures)
from test_ring import sim_cuda  # noqa: F401  (the fixture)
from decoders.test_augment_sim import watch

FILL = (10, 200, 30)
RECIPE = [T.RandomCrop(64, padding=(6, 3, 5, 9), pad_if_needed=True, fill=FILL), T.RandomHorizontalFlip()]


@pytest.mark.parametrize("decoder", ["nvjpeg", "dali"])
def test_the_padded_windows_are_assembled_on_the_decoders_stream_before_its_ready_event(request, monkeypatch,
                                                                                       one_truncated, decoder):
    """Each batch's assembly is one launch on the stream the decoder decoded on, queued before the event the batch
    carries; under lag no thread waits for the device (a copy from pageable memory would), no access races, the
    batches equal a keeping-up run's, and the fill is where the native decoder has it. Fails with the assembly
    launched on another stream or after the event, with its columns copied from pageable memory, or not run."""
    sim = request.getfixturevalue("nvjpeg_on_sim" if decoder == "nvjpeg" else "dali_on_sim")
    ds = fastload.open(one_truncated, transforms={"image": RECIPE})
    kw = dict(batch_size=4, shuffle=True, seed=3, num_workers=2, on_error="skip")
    ref = run(sim, fastload.DataLoader(ds, decoder=decoder, device="cuda", **kw), sim.default, lag=False)
    del sim.host_waits[:]
    calls = watch(sim, monkeypatch, decoder)
    seen = run(sim, fastload.DataLoader(ds, decoder=decoder, device="cuda", **kw), sim.default, lag=True)
    assert not sim.races
    assert not sim.host_waits, sim.host_waits
    assert len(seen) == len(ref) == 5 and len(calls) == 5
    for (x, y), (sx, sy) in zip(ref, seen):
        assert torch.equal(x, sx) and torch.equal(y, sy)
    for mine, ready in calls:
        assert len(mine) == 1, mine  # one launch per batch: the whole batch, no loop over samples
        (stream, position), = mine
        assert stream == ready.stream and stream.name == decoder, (stream, ready.stream)
        assert position < ready.position, (position, ready.position)
    native = [(x.clone(), y.clone()) for x, y in fastload.DataLoader(ds, **kw)]
    fill = torch.tensor(FILL, dtype=torch.uint8).view(1, 3, 1, 1)
    for (x, y), (nx, ny) in zip(seen, native):
        assert torch.equal(y, ny)
        where = (nx == fill).all(dim=1, keepdim=True).expand_as(nx)
        assert where.any() and torch.equal(x[where], nx[where])


@pytest.mark.parametrize("decoder", ["nvjpeg", "dali"])
def test_a_center_crop_larger_than_its_images_is_zero_padded_by_the_gpu_decoders_as_natively(request, one_truncated,
                                                                                             decoder):
    """CenterCrop zero-pads an image smaller than the crop (torchvision's F.center_crop, issue 27 item 2) through
    the padded-window path: the GPU decoders put the zeros where the native decoder does, and the batches
    arrive with no race."""
    sim = request.getfixturevalue("nvjpeg_on_sim" if decoder == "nvjpeg" else "dali_on_sim")
    ds = fastload.open(one_truncated, transforms={"image": [T.CenterCrop(72), T.RandomHorizontalFlip()]})
    kw = dict(batch_size=4, shuffle=True, seed=3, num_workers=2, on_error="skip")
    seen = run(sim, fastload.DataLoader(ds, decoder=decoder, device="cuda", **kw), sim.default, lag=True)
    assert not sim.races and len(seen) == 5
    native = [(x.clone(), y.clone()) for x, y in fastload.DataLoader(ds, **kw)]
    for (x, y), (nx, ny) in zip(seen, native):
        assert torch.equal(y, ny) and x.shape == nx.shape == (len(y), 3, 72, 72)
        where = (nx == 0).all(dim=1, keepdim=True).expand_as(nx)
        assert where[:, :, :, :4].all()  # width 64 in 72: 4 columns of zeros on each side, every sample
        assert torch.equal(x[where], nx[where])
