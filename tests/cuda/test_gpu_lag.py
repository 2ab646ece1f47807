"""Tests that can fail the way the H100 failed: the consumer stream lags the host every step
(``torch.cuda._sleep`` queued before the step reads the batch), batches are compared with their
references on the device with no host sync in the loop, datasets leave a partial last batch, batches are
dropped at once so that slots are reused, and the cases that exposed or could expose stream-ordering bugs
are forced: a freed block of exactly a slot's size with queued readers, a consumer that switches streams
between epochs, GPU decoders under lag with a corrupt JPEG and ``on_error='skip'``, and the matrix of
configurations (decoder x num_workers x persistent, with layout x Normalize; see ``lag_matrix``; ``to_device`` over torch's
loader, pinned and unpinned), and loaders sharing a dataset's Normalize on different streams.
tests/test_ring.py, tests/test_ring_streams.py, tests/test_gpu_decoders_sim.py and tests/test_gpu_matrix_sim.py
run the same cases on the simulated GPU (tests/sim_streams.py), where each was shown to fail with its bug put back.

Skipped without CUDA (and per case without its GPU decoder). Run with ``python -m pytest tests/cuda -q``
or ``make gpu-check``.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import fastload
from fastload import transforms as T

from gpu_common import (MAD_TOLERANCE, MEAN, NEEDS_CUDA, STD, DeviceCheck, corrupt_sample, cycles_per_ms, decoder_param,
                        lag)
from conftest import packed_image_folder  # noqa: E402 (gpu_common puts tests/ on sys.path)

pytestmark = NEEDS_CUDA

LAG_MS = 15  # per step: the host runs several batches ahead of the consumer stream
BATCH = 8  # 30 samples: three full batches and a partial one of 6
EPOCHS = 2
SIZE = 48


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return packed_image_folder(tmp_path_factory.mktemp("lag"), classes=3, per_class=10, workers=2)


@pytest.fixture(scope="module")
def corrupt(tmp_path_factory):
    path = packed_image_folder(tmp_path_factory.mktemp("lag-corrupt"), classes=3, per_class=10, workers=2)
    corrupt_sample(path, 4)
    return path


def transforms(normalize: bool) -> dict:
    tail = [T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)] if normalize else []
    return {"image": [T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip()] + tail}


def mad_limit(normalize: bool) -> float:
    return MAD_TOLERANCE / 255 / min(STD) if normalize else MAD_TOLERANCE


def references(ds, decoder: str, kw: dict, normalize: bool, epochs: int = EPOCHS):
    """What each epoch must hand out, and how to compare. native: the CPU loader's batches (exact, or
    within float rounding after Normalize); nvjpeg/dali: the same GPU loader's batches taken without lag
    (synchronised each step: exact); auto: the native batches within the decoders' tolerance (which
    decoder takes a sample depends on timing)."""
    if decoder in ("native", "auto"):
        cpu = fastload.DataLoader(ds, **kw)
        refs = [[(x.clone(), y.clone()) for x, y in cpu] for _ in range(epochs)]
        if decoder == "auto":
            return refs, ("mad", mad_limit(normalize))
        return refs, ("atol", 1e-4) if normalize else "exact"
    gpu = fastload.DataLoader(ds, device="cuda", decoder=decoder, **kw)
    refs = []
    for _ in range(epochs):
        epoch = []
        for x, y in gpu:
            torch.cuda.synchronize()
            epoch.append((x.cpu(), y.cpu()))
        refs.append(epoch)
    return refs, ("atol", 1e-4) if normalize else "exact"


def lagging(loader, checks: list, streams: list | None = None) -> None:
    """One epoch per check: each step queues the lag, then compares on the consumer stream; the batch is
    dropped at once so its slot is reused while the GPU is still behind. ``streams[e]``: epoch e's consumer.

    Nothing orders one epoch's stream with the next's (no ``wait_stream`` at a switch): that would make the new
    stream's fence cover the old stream's queued reads, and the switch test could not fail without the fence
    on the stream that received each slot. ``DeviceCheck`` orders its own counters (``assert_clean``)."""
    cycles_per_ms()  # measured before the loop: the measurement synchronises
    for e, check in enumerate(checks):
        stream = streams[e] if streams else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for x, y in loader:
                lag(LAG_MS)
                check(x, y)
                del x, y


def loader_kw(num_workers: int, persistent: bool, layout: str, **extra) -> dict:
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    return dict(batch_size=BATCH, shuffle=True, seed=5, num_workers=num_workers,
                persistent_workers=persistent, memory_format=fmt, **extra)


def lag_matrix() -> list:
    """decoder x num_workers in full; layout x Normalize in full for the native decoder, and for each GPU decoder
    two of the four (channels_last + Normalize, contiguous + uint8): every layout and every dtype once per decoder
    and worker setting, at 30 cases instead of 48 (the slot's layout and the Normalize constants are the loader's,
    after whichever decoder filled the rows)."""
    workers = [(0, False, "nw0"), (2, False, "nw2"), (2, True, "nw2-pers")]
    cases = []
    for decoder in ("native", "nvjpeg", "dali", "auto"):
        combos = ([(lay, norm) for lay in ("channels_last", "contiguous") for norm in (False, True)]
                  if decoder == "native" else [("channels_last", True), ("contiguous", False)])
        for nw, persistent, wid in workers:
            for layout, normalize in combos:
                d = decoder_param(decoder) if decoder != "native" else decoder
                marks = d.marks if decoder != "native" else ()
                cases.append(pytest.param(decoder, nw, persistent, layout, normalize, marks=marks,
                                          id=f"{decoder}-{wid}-{layout}-{'normalize' if normalize else 'uint8'}"))
    return cases


@pytest.mark.parametrize("decoder,num_workers,persistent,layout,normalize", lag_matrix())
def test_lagging_consumer_gets_the_expected_batches(packed, decoder, num_workers, persistent, layout, normalize):
    ds = fastload.open(packed, transforms=transforms(normalize))
    kw = loader_kw(num_workers, persistent, layout)
    refs, mode = references(ds, decoder, kw, normalize)
    checks = [DeviceCheck(r, mode) for r in refs]
    loader = fastload.DataLoader(ds, device="cuda", decoder=decoder, **kw)
    lagging(loader, checks)
    for e, check in enumerate(checks):
        check.assert_clean(f"epoch {e}")
    want = torch.contiguous_format if layout == "contiguous" else torch.channels_last
    x, _ = next(iter(loader))
    assert x.is_contiguous(memory_format=want)


@pytest.mark.parametrize("pin", [True, False], ids=["pinned", "unpinned"])
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("normalize", [False, True], ids=["uint8", "normalize"])
def test_to_device_over_a_torch_loader_under_lag(pin, num_workers, normalize):
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (30, 3, 20, 20), dtype=torch.uint8, generator=g)
    tds = torch.utils.data.TensorDataset(images, torch.arange(30))
    perm = torch.randperm(30, generator=g).tolist()  # one fixed order for every pass
    make = lambda **k: torch.utils.data.DataLoader(tds, batch_size=BATCH, sampler=perm,  # noqa: E731
                                                   num_workers=num_workers, **k)
    refs = [[(x.clone(), y.clone()) for x, y in make()] for _ in range(EPOCHS)]
    tfs = {0: [T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)]} if normalize else None
    if normalize:
        m, s = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
        refs = [[(((x.float() / 255) - m) / s, y) for x, y in r] for r in refs]
    checks = [DeviceCheck(r, ("atol", 1e-4) if normalize else "exact") for r in refs]
    lagging(fastload.to_device(make(pin_memory=pin), "cuda", transforms=tfs), checks)
    for e, check in enumerate(checks):
        check.assert_clean(f"epoch {e}")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_freed_block_of_a_slots_size_with_queued_readers_is_not_written_early(packed, num_workers):
    """The allocator trap: each step frees a block of exactly the image slot's size whose fill and reader
    are still queued behind the lag, while every batch is held, so the next slot is allocated from that
    block. Without the fence the side stream's copy lands before the queued fill: the batch turns into 7s
    (the comparison fails) or the reader sees the batch (``trapped`` counts it)."""
    ds = fastload.open(packed, transforms=transforms(False))
    kw = loader_kw(num_workers, False, "channels_last")
    refs, mode = references(ds, "native", kw, False)
    checks = [DeviceCheck(r, mode) for r in refs]
    loader = fastload.DataLoader(ds, device="cuda", **kw)
    trapped = torch.zeros((), dtype=torch.int64, device="cuda")
    cycles_per_ms()  # measured before the loop: the measurement synchronises
    for check in checks:
        held = []
        for x, y in loader:
            lag(LAG_MS)
            check(x, y)
            held.append((x, y))  # the ring grows: the next batch needs a new slot
            junk = torch.empty(x.numel(), dtype=torch.uint8, device="cuda")  # the image slot's size
            junk.fill_(7)
            trapped += (junk != 7).sum()
            del junk, x, y  # back to the allocator, its kernels still queued
        del held
    for e, check in enumerate(checks):
        check.assert_clean(f"epoch {e}")
    assert int(trapped) == 0


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_consumer_that_switches_streams_between_epochs(packed, num_workers):
    """Epoch 0 on the default stream, epoch 1 under torch.cuda.stream(s), epoch 2 on the default stream
    again, lagging every step, with nothing ordering the two streams: a slot last read on one stream is
    reused while the other is current, its reads there still queued behind the lag. The simulator's mirror of
    this test (tests/test_ring_streams.py, ``test_a_loader_whose_consumer_switches_streams_between_epochs``) fails
    without the fence on the stream that received each slot."""
    ds = fastload.open(packed, transforms=transforms(False))
    kw = loader_kw(num_workers, num_workers > 0, "channels_last")
    refs, mode = references(ds, "native", kw, False, epochs=3)
    checks = [DeviceCheck(r, mode) for r in refs]
    side = torch.cuda.Stream()
    lagging(fastload.DataLoader(ds, device="cuda", **kw), checks,
            streams=[torch.cuda.default_stream(), side, torch.cuda.default_stream()])
    for e, check in enumerate(checks):
        check.assert_clean(f"epoch {e}")


def test_loaders_over_one_dataset_normalize_with_constants_of_their_own_stream(packed):
    """Every loader over a dataset shares its Normalize. The first one is consumed under torch.cuda.stream(s)
    far behind the host, so its side stream waits behind that lag; a second one, on the default stream, must
    not read constants that the first one's side stream has yet to write (they were once made by the first
    loader's side stream, after its wait, and cached on the dataset's pipeline for every loader). The
    simulator's version: tests/test_ring_streams.py, ``test_loaders_sharing_a_pipeline_never_read_...``."""
    ds = fastload.open(packed, transforms=transforms(True))
    kw = loader_kw(0, False, "channels_last")
    refs, mode = references(ds, "native", kw, True, epochs=1)
    checks = [DeviceCheck(refs[0], mode)]
    first = iter(fastload.DataLoader(ds, device="cuda", **kw))
    s = torch.cuda.Stream()
    cycles_per_ms()
    with torch.cuda.stream(s):
        lag(20 * LAG_MS)  # the first loader's consumer far behind: its side stream's work waits for it
        x, _ = next(first)
        del x
    lagging(fastload.DataLoader(ds, device="cuda", **kw), checks)  # on the default stream
    checks[0].assert_clean("the second loader")
    s.synchronize()
    del first


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("decoder", [decoder_param("nvjpeg"), decoder_param("dali"), decoder_param("auto")])
def test_gpu_decoders_under_lag_with_a_corrupt_jpeg(corrupt, decoder, num_workers):
    ds = fastload.open(corrupt, transforms=transforms(False))
    kw = loader_kw(num_workers, False, "channels_last", on_error="skip")
    refs, mode = references(ds, decoder, kw, False)
    checks = [DeviceCheck(r, mode) for r in refs]
    loader = fastload.DataLoader(ds, device="cuda", decoder=decoder, **kw)
    lagging(loader, checks)
    for e, check in enumerate(checks):
        check.assert_clean(f"epoch {e}")
    assert loader.stats()["skipped"] == EPOCHS
    if decoder == "auto":
        assert loader._batcher.images.hybrid is not None, "decoder='auto' found no GPU decoder"
