"""Issue 19's configuration matrix on the simulated GPU (tests/sim_streams.py), the part it can express:
decoder native/nvjpeg/dali/auto x num_workers 0/2 x persistent workers x contiguous/channels_last x
Normalize on/off, and ``to_device`` over torch's DataLoader with pinned and pageable batches. Each case runs
two epochs with the consumer stream lagging (it catches up every third step; the copy engine and the
decoders' streams run ahead) and compares every batch with a run that never lags: labels and uint8 pixels
exactly, Normalize's floats within 1e-5 of the CPU loader (native; exactly the non-lagging run's otherwise).
The dataset leaves a partial last batch (18 samples, batches of 4, one corrupt JPEG skipped); the training
thread never waits for the GPU (``waits_in()``: every host wait, even on an idle GPU); no unordered access.

nvjpeg runs with PIL standing in for nvJPEG, dali with a fake pipeline that queues its work late
(tests/test_gpu_decoders_sim.py), auto with nvjpeg as its GPU half at a held split. tests/cuda/test_gpu_lag.py
runs the same matrix on a real GPU.
"""

from __future__ import annotations

import pytest
import torch

import fastload
from fastload import decoders
from fastload._fill import images as _images
from fastload import transforms as T
from fastload.decoders import hybrid
from test_gpu_decoders_sim import dali_on_sim, nvjpeg_on_sim, one_truncated, run  # noqa: F401  (fixtures)
from test_ring import MEAN, STD, sim_cuda  # noqa: F401  (a fixture)

EPOCHS = 2


def on_sim(request, decoder: str, monkeypatch):
    """The simulated GPU with ``decoder``'s stand-in installed."""
    if decoder == "native":
        return request.getfixturevalue("sim_cuda")
    if decoder == "dali":
        return request.getfixturevalue("dali_on_sim")
    sim = request.getfixturevalue("nvjpeg_on_sim")
    if decoder == "auto":  # nvjpeg as the GPU half; the split held at half (timings would move it)
        monkeypatch.setattr(hybrid, "_installed_gpu_decoder", lambda: (decoders.kind("nvjpeg"), []))
        monkeypatch.setattr(hybrid.HybridSplit, "_update", lambda self, *a: None)
    return sim


def epochs(sim, loader, lag: bool) -> list:
    return [s for _ in range(EPOCHS) for s in run(sim, loader, sim.default, lag=lag)]


def assert_same(ref: list, seen: list, normalize: bool, exact: bool = True) -> None:
    assert len(seen) == len(ref)
    for (x, y), (sx, sy) in zip(ref, seen):
        assert torch.equal(y, sy)
        assert x.shape == sx.shape and x.dtype == sx.dtype
        assert torch.equal(x, sx) if exact or not normalize else (x - sx).abs().max() <= 1e-5


@pytest.mark.parametrize("normalize", [False, True], ids=["uint8", "normalize"])
@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)], ids=["nw0", "nw2", "nw2-pers"])
@pytest.mark.parametrize("decoder", ["native", "nvjpeg", "dali", "auto"])
def test_a_lagging_consumer_gets_the_batches_of_one_that_never_lags(request, monkeypatch, one_truncated, decoder,
                                                                     num_workers, persistent, layout, normalize):
    sim = on_sim(request, decoder, monkeypatch)
    tail = [T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)] if normalize else []
    ds = fastload.open(one_truncated, transforms={"image": [T.RandomResizedCrop(16), T.RandomHorizontalFlip()]
                                                  + tail})
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    kw = dict(batch_size=4, shuffle=True, seed=3, num_workers=num_workers, persistent_workers=persistent,
              memory_format=fmt, on_error="skip")
    ref = epochs(sim, fastload.DataLoader(ds, device="cuda", decoder=decoder, **kw), lag=False)
    del sim.host_waits[:]
    made = []  # the decoders the loader made (kept across epochs, persistent or not)
    real_make = _images.ImageDecoding._decoder
    monkeypatch.setattr(_images.ImageDecoding, "_decoder",
                        lambda self, *a: made.append(real_make(self, *a)) or made[-1])
    loader = fastload.DataLoader(ds, device="cuda", decoder=decoder, **kw)
    seen = epochs(sim, loader, lag=True)
    assert not sim.races
    assert not sim.waits_in(), sim.waits_in()  # the training thread never waited, not even on an idle GPU
    assert len(seen) == 5 * EPOCHS and len(seen[4][1]) == 2  # 18 samples: a partial last batch each epoch
    assert_same(ref, seen, normalize)
    want = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    assert all(x.is_contiguous(memory_format=want) for x, _ in seen)
    assert loader.stats()["skipped"] == EPOCHS
    images = loader._batcher.images  # the decoder asked for is the one that ran
    assert (images.device is None) == (decoder == "native") and (images.hybrid is not None) == (decoder == "auto")
    assert len(made) == 1  # made once
    for dec in made:  # 'auto': a hybrid with nvjpeg's GPU half switched on (cpu_only is a hybrid too)
        gpu = dec.gpu if decoder == "auto" else dec
        assert type(getattr(gpu, "decoder", gpu)).__name__ == {"native": "NativeDecoder", "nvjpeg": "NvjpegDecoder",
                                                               "dali": "DaliDecoder", "auto": "NvjpegDecoder"}[decoder]
    if decoder == "auto":
        assert not images.hybrid.cpu_only and loader.stats()["hybrid"] is not None
    if decoder == "native":  # and the CPU loader's batches
        cpu = fastload.DataLoader(ds, **kw)
        assert_same([(x.clone(), y.clone()) for _ in range(EPOCHS) for x, y in cpu], seen, normalize, exact=False)


class SimPinned:
    """Torch's ``pin_memory=True`` on the simulated GPU: each batch copied into page-locked memory in the
    training process (torch's pin-memory thread), which the simulator's copies read late, as DMA."""

    def __init__(self, sim, loader):
        self.sim, self.loader = sim, loader

    def __iter__(self):
        for batch in self.loader:
            yield [self.sim.host_empty(t.shape, t.dtype).copy_(t) for t in batch]

    def __len__(self) -> int:
        return len(self.loader)


@pytest.mark.parametrize("normalize", [False, True], ids=["uint8", "normalize"])
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("pin", [True, False], ids=["pinned", "pageable"])
def test_to_device_over_a_torch_loader_with_a_lagging_consumer(sim_cuda, pin, num_workers, normalize):  # noqa: F811
    sim = sim_cuda
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (30, 3, 20, 20), dtype=torch.uint8, generator=g)
    tds = torch.utils.data.TensorDataset(images, torch.arange(30))
    perm = torch.randperm(30, generator=g).tolist()  # one order for every pass
    loader = torch.utils.data.DataLoader(tds, batch_size=8, sampler=perm, num_workers=num_workers)
    tfs = {0: [T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)]} if normalize else None
    source = SimPinned(sim, loader) if pin else loader
    ref = epochs(sim, fastload.to_device(source, "cuda", transforms=tfs), lag=False)
    del sim.host_waits[:]
    seen = epochs(sim, fastload.to_device(source, "cuda", transforms=tfs), lag=True)
    assert not sim.races and not sim.waits_in(), sim.waits_in()
    assert len(seen) == 4 * EPOCHS and len(seen[3][1]) == 6  # 30 samples: a partial last batch each epoch
    assert_same(ref, seen, normalize)
    cpu = [(x, y) for _ in range(EPOCHS) for x, y in loader]
    if normalize:
        pipe = T.ImagePipeline(tfs[0]).tensor
        cpu = [(pipe.apply(x), y) for x, y in cpu]
    assert_same(cpu, seen, normalize, exact=False)
