"""GPU decoders inside the loader on the simulated GPU (tests/sim_streams.py): the decoders' streams, their
row buffers and their fix-ups go through the same streams backend as the prefetcher. decoder='nvjpeg' runs
with PIL standing in for nvJPEG (tests/decoders/test_nvjpeg.py); decoder='dali' with a fake DALI pipeline
(``FakeDali``) that queues its decode and its copies late on the streams it is given, as DALI does. The
consumer lags; a corrupt JPEG is skipped."""

from __future__ import annotations

import collections
import gc
import io
import re
import threading
import time
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload import _ring
from fastload._fill import images as _images
from fastload import transforms as T
from fastload.decoders import dali, nvjpeg
from conftest import jpeg_bytes
from decoders.conftest import pil_decode
from sim_streams import _describe, _raw
from test_ring import photos, sim_cuda  # noqa: F401  (fixtures)


def pictures_with_one_truncated(root, n: int):
    """``n`` pictures packed under ``root``, the sixth with its JPEG header zeroed in the shard (nvJPEG and PIL
    refuse it)."""
    for i in range(n):
        (root / "src" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (root / "src" / f"c{i % 2}" / f"{i:02d}.jpg").write_bytes(jpeg_bytes(40 + 3 * (i % 18), 64, seed=i))
    fastload.pack(root / "src", root / "ds", workers=0)
    ds = fastload.open(root / "ds", decode=False)
    seg, local = ds.locate(5)
    shard = next((root / "ds").glob("shard-*.fls"))
    data = bytearray(shard.read_bytes())
    start = seg.data_start["image"] + int(seg.offsets["image"][local])
    data[start + 2:start + 22] = bytes(20)
    shard.write_bytes(bytes(data))
    return root / "ds"


@pytest.fixture(scope="module")
def one_truncated(tmp_path_factory):
    """Eighteen pictures, the sixth truncated."""
    return pictures_with_one_truncated(tmp_path_factory.mktemp("gpu-sim"), 18)


@pytest.fixture(scope="module")
def more_batches_than_slots(tmp_path_factory):
    """Thirty-four pictures, the sixth truncated: nine batches of four an epoch (the last one of two), more than
    the host ring's slots under lag (``fill.host_limit``: 7 at the default depth)."""
    return pictures_with_one_truncated(tmp_path_factory.mktemp("gpu-sim-34"), 34)


@pytest.fixture
def nvjpeg_on_sim(sim_cuda, monkeypatch):  # noqa: F811
    monkeypatch.setattr(_ring, "streams_for", lambda device: sim_cuda)  # the decoders' backend
    monkeypatch.setattr(nvjpeg, "_torchvision_decoder", lambda device: pil_decode)
    # the simulated device's tensors live on the CPU: the device check would refuse them
    monkeypatch.setattr(nvjpeg.NvjpegDecoder, "_check_out", lambda self, out, n: None)
    return sim_cuda


class FakeOutputs:
    """DALI's outputs of one run (a TensorListGPU, or one sample of it): ``copy_to_external`` queues the copy
    on the stream it is given (the default stream without one), as DALI does."""

    def __init__(self, sim, t: torch.Tensor):
        self.sim, self.t = sim, t

    def shape(self) -> list:
        return [list(self.t.shape[1:])] * len(self.t)

    def __getitem__(self, j: int) -> "FakeOutputs":
        return FakeOutputs(self.sim, self.t[j:j + 1])

    def copy_to_external(self, ptr, cuda_stream=None, non_blocking=False) -> None:
        src = self.t
        dst = _raw((ptr.value, src.numel(), tuple(src.shape), tuple(src.stride()), torch.uint8))
        s, d = _describe(src), _describe(dst)
        with self.sim.stream(cuda_stream if cuda_stream is not None else self.sim.default):
            self.sim.launch(lambda: _raw(d).copy_(_raw(s)), reads=(src,), writes=(dst,), what="dali copy")


class FakeDali:
    """DALI's pipeline as DaliDecoder uses it, on the simulated GPU: ``run(stream, data=, anchor=, shape=,
    flip=)`` decodes with PIL (crop, bilinear resize, flip) now, but writes its output buffer (one, reused by
    every run, as DALI's memory pool may) late, on ``stream``, and returns outputs on that stream. The padded
    graph's ``size=`` input (a padded RandomCrop): each sample resized to its own size and placed at the top left
    of a zero row, as ``fn.pad`` to ``out_hw`` does."""

    def __init__(self, sim, batch_size: int, out_hw: tuple[int, int]):
        self.sim, self.batch_size, self.out_hw = sim, batch_size, out_hw
        self.buf = None

    def run(self, stream, data, anchor, shape, flip, size=None):
        sim, (h, w) = self.sim, self.out_hw
        if self.buf is None:
            with sim.stream(stream):
                self.buf = sim.alloc((self.batch_size, h, w, 3), torch.uint8)
        res = torch.zeros((len(data), h, w, 3), dtype=torch.uint8)
        for k, d in enumerate(data):
            try:
                img = Image.open(io.BytesIO(d.tobytes()))
                img.load()
            except Exception:  # noqa: BLE001  (DALI raises RuntimeError for the whole batch)
                raise RuntimeError(f"Error in thread 0: Failed to decode sample #{k}") from None
            (top, left), (ch, cw) = anchor[k].tolist(), shape[k].tolist()
            sh, sw = (h, w) if size is None else size[k].astype(int).tolist()
            img = img.convert("RGB").crop((left, top, left + cw, top + ch)).resize((sw, sh), Image.BILINEAR)
            if flip[k]:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
            res[k, :sh, :sw] = torch.from_numpy(np.array(img))
        out = self.buf[:len(data)]
        d = _describe(out)
        with sim.stream(stream):
            sim.launch(lambda: _raw(d).copy_(res), writes=(out,), what="dali decode")
        return (FakeOutputs(sim, out),)


@pytest.fixture
def dali_on_sim(sim_cuda, monkeypatch):  # noqa: F811
    monkeypatch.setattr(_ring, "streams_for", lambda device: sim_cuda)
    monkeypatch.setattr(dali, "_import_dali", lambda strict=False: (None, None, None))
    monkeypatch.setattr(dali.DaliDecoder, "_build",
                        lambda self: setattr(self, "_pipe", FakeDali(sim_cuda, self.batch_size, self.out_hw)))
    # the simulated device's tensors live on the CPU: the device check would refuse them
    monkeypatch.setattr(dali.DaliDecoder, "_check_out", lambda self, out, n: out)
    return sim_cuda


def others(sim, consumer) -> None:
    """Run every stream but ``consumer`` as far as it can go: the decoders' and the copies' streams keep
    up while the training stream lags."""
    while sum(sim.run(st) for st in sim.streams if st is not consumer):
        pass


def run(sim, loader, consumer, lag: bool) -> list:
    """Iterate ``loader`` with next() and each step on ``consumer``; the consumer stream catches up only
    every third step when ``lag``. The other streams run after each step: the simulator frees host memory
    at once, where torch's caching host allocator keeps a freed pinned block until its copies completed, so
    a decoder closed at the epoch's end must not leave copies from its pinned rows queued. Returns what each
    step's kernel saw."""
    seen: list = []
    with sim.stream(consumer):
        for k, (x, y) in enumerate(loader):
            sim.model_step([x, y], seen)
            others(sim, consumer)
            if not lag or k % 3 == 2:
                sim.run(consumer)
    sim.run_all()
    return seen


@pytest.mark.parametrize("decoder", ["nvjpeg", "dali"])
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("stream", ["default", "user"])
def test_gpu_decoder_under_lag_never_makes_the_training_thread_wait(request, more_batches_than_slots, decoder,
                                                                   num_workers, stream, monkeypatch):
    sim = request.getfixturevalue(f"{decoder}_on_sim")
    consumer = sim.default if stream == "default" else sim.new_stream("user")
    waits_on_decoder = []
    real_wait = sim.wait
    sim.wait = lambda s, ev: (waits_on_decoder.append((s, ev and ev.stream.name, ev)) if s.name == decoder
                              else None, real_wait(s, ev))[1]
    ds = fastload.open(more_batches_than_slots,
                       transforms={"image": [T.RandomResizedCrop(16), T.RandomHorizontalFlip()]})
    kw = dict(batch_size=4, shuffle=True, seed=3, num_workers=num_workers, decoder=decoder, on_error="skip",
              device="cuda")
    plain = fastload.DataLoader(ds, **kw)
    ref = [s for _ in range(2) for s in run(sim, plain, consumer, lag=False)]
    del sim.host_waits[:]
    waits_on_decoder.clear()
    filled = collections.defaultdict(list)  # each decoder's stream -> the row buffer of each batch it decoded
    handovers = {}  # the events a row buffer was handed on with before each fill (ImageDecoding._ready), by id
    real_fill = _images.ImageDecoding.fill

    def fill(self, pool, pipeline, f, slot, *a, **kw):
        ev = self._ready.get(slot.tensors[f.name].data_ptr())
        handovers[id(ev)] = ev  # kept: an id is unique only while its object lives
        failures = real_fill(self, pool, pipeline, f, slot, *a, **kw)
        filled[id(self._decoders[f.name].decoder.streams.side)].append(slot.tensors[f.name].data_ptr())
        return failures

    monkeypatch.setattr(_images.ImageDecoding, "fill", fill)
    loader = fastload.DataLoader(ds, **kw)
    seen = [s for _ in range(2) for s in run(sim, loader, consumer, lag=True)]  # two epochs, one host ring
    assert not sim.races
    assert not sim.waits_in(), sim.waits_in()
    # the producer thread never waits for the decoders' work either: each batch is handed on with the decoder's
    # event (a synchronize per batch paced it by the decoder's stream, and a pageable copy by its queue). Its
    # only waits are the host ring's bound (fill.py: at its limit, the oldest pending copy of the prefetcher's
    # stream), which an epoch of more batches than slots reaches under lag
    producer_waits = sim.waits_in("fastload-batcher", busy=False)
    assert all((w.stream, w.why) == ("side", "event synchronize") for w in producer_waits), producer_waits
    assert len(seen) == len(ref) == 18  # 34 samples: a partial last batch of 2 each epoch
    for (x, y), (sx, sy) in zip(ref, seen):
        assert torch.equal(x, sx) and torch.equal(y, sy)
    assert loader.stats()["skipped"] == 2
    # a decoder's stream waited on the training loop never, on the rows' allocation stream (the fence) only at its
    # first use of a row buffer (an epoch has more batches than the host ring has slots, so buffers are reused),
    # and at every later fill on that buffer's previous hand-over only (a batch may have been dropped unread,
    # ImageDecoding.fill), the events of the decoders, of the hybrid's copy or of the on_error fix-up. The loader is
    # not persistent, and still keeps its decoder, with its stream, across the epochs (ImageDecoding.end_epoch)
    # nvjpeg's stream waits once per batch on its output stream, after torchvision's writes (decoders/nvjpeg.py)
    outputs = [w for w in waits_on_decoder if w[1] == "nvjpeg outputs"]
    assert len(outputs) == (18 if decoder == "nvjpeg" else 0), len(outputs)
    waits_on_decoder = [w for w in waits_on_decoder if w[1] != "nvjpeg outputs"]
    fences = [(st, on) for st, on, ev in waits_on_decoder if id(ev) not in handovers]
    after = [(st, on) for st, on, ev in waits_on_decoder if id(ev) in handovers]
    assert fences and {on for _, on in fences} == {"rows"}, fences
    assert {on for _, on in after} <= {decoder, "rows"}, after
    per_stream = collections.Counter(id(st) for st, _ in fences)
    afters = collections.Counter(id(st) for st, _ in after)
    assert len(per_stream) == 1 and per_stream.keys() == filled.keys()
    for stream, buffers in filled.items():
        assert len(buffers) == 18  # the batches of both epochs
        assert per_stream[stream] == len(set(buffers)) < 9, (per_stream[stream], buffers)
        assert afters[stream] == len(buffers) - len(set(buffers)), (afters[stream], buffers)


def test_hybrid_under_lag_hands_its_rows_on_with_one_event(nvjpeg_on_sim, one_truncated, monkeypatch):
    """decoder='auto' with nvjpeg: native threads decode the first half of each batch into pinned host rows,
    copied on the hybrid's stream, nvjpeg the rest on its own. No host wait anywhere; the prefetcher waits on
    one event recorded after the copy and after nvjpeg's writes; host rows are refilled only once their copy
    completed. The split is held at half (timings would make it vary) so both runs cut batches alike."""
    from fastload import decoders
    from fastload.decoders import hybrid

    sim = nvjpeg_on_sim
    monkeypatch.setattr(hybrid, "_installed_gpu_decoder", lambda: (decoders.kind("nvjpeg"), []))
    monkeypatch.setattr(hybrid.HybridSplit, "_update", lambda self, *a: None)
    ds = fastload.open(one_truncated, transforms={"image": [T.RandomResizedCrop(16), T.RandomHorizontalFlip()]})
    kw = dict(batch_size=4, shuffle=True, seed=5, num_workers=2, decoder="auto", on_error="skip", device="cuda")
    ref = run(sim, fastload.DataLoader(ds, **kw), sim.default, lag=False)
    del sim.host_waits[:]
    seen = run(sim, fastload.DataLoader(ds, **kw), sim.default, lag=True)
    assert not sim.races
    assert not sim.waits_in() and not sim.waits_in("fastload-batcher", busy=False)
    assert not [w for w in sim.host_waits if "hybrid" in w.thread], sim.host_waits
    assert len(seen) == len(ref) == 5
    for (x, y), (sx, sy) in zip(ref, seen):
        assert torch.equal(x, sx) and torch.equal(y, sy)


def test_the_hybrid_split_follows_the_gpus_device_time(nvjpeg_on_sim, photos, monkeypatch):
    """A slow GPU (its resampling kernel takes ~77 simulated ms a sample when it runs): the GPU half's rate is
    read from timing events on nvjpeg's stream once they completed, so the CPU threads take nearly every
    sample. Timed on the host, the GPU half took what queuing it (and PIL standing in for nvJPEG) cost this
    thread, and the split stayed near half, feeding the slow GPU as much as the threads."""
    from fastload import decoders
    from fastload.decoders import hybrid

    sim = nvjpeg_on_sim
    monkeypatch.setattr(hybrid, "_installed_gpu_decoder", lambda: (decoders.kind("nvjpeg"), []))
    sim.cost = lambda what, nbytes: nbytes * 1e-4 if what == "nvjpeg resample" else 1e-6
    ds = fastload.open(photos, transforms={"image": [T.RandomResizedCrop(16)]})
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=1, num_workers=2, decoder="auto",
                                 device="cuda", persistent_workers=True)
    for _ in range(3):
        run(sim, loader, sim.default, lag=False)
    split = loader.stats()["hybrid"]  # what a user reads: the split's share and its measured rates
    assert split == loader._batcher.images.hybrid.stats()
    assert split["gpu_rate"] < 20  # samples per simulated second: 1 / 77 ms is 13
    assert split["cpu_share"] > 0.9, split
    assert not sim.races and not sim.waits_in() and not sim.waits_in("fastload-batcher", busy=False)


def test_skipped_rows_are_fixed_on_the_decoders_stream(nvjpeg_on_sim, one_truncated):
    """on_error='skip' copies a good row over a failed one: on the rows' stream, after the decoder's event and
    before the event the prefetcher waits on, not on the producer thread's default stream (unordered with the
    prefetcher's copy when the loop runs on another stream)."""
    sim = nvjpeg_on_sim
    ops = []
    real_launch = sim.launch
    sim.launch = lambda fn, reads=(), writes=(), what="kernel": (
        ops.append((sim.current_stream().name, what)), real_launch(fn, reads, writes, what))[1]
    ds = fastload.open(one_truncated, transforms={"image": [T.RandomResizedCrop(16)]})
    loader = fastload.DataLoader(ds, batch_size=18, decoder="nvjpeg", on_error="skip", device="cuda")
    with sim.stream(sim.new_stream("user")):
        (x, y), = list(loader)
    sim.run_all()
    fixups = [name for name, what in ops if what == "on_error fix-up"]
    assert fixups and "default" not in fixups and "user" not in fixups
    raw = fastload.open(one_truncated, decode=False)
    labels = [int(raw[k][1]) for k in range(18)]
    assert y.tolist() == [labels[0] if k == 5 else labels[k] for k in range(18)]
    assert torch.equal(x[5], x[0])


def test_auto_with_a_gpu_decoder_that_cannot_decode_falls_back_to_cpu_threads(nvjpeg_on_sim, monkeypatch,
                                                                            one_truncated):
    """decoder='auto' found torchvision, but it cannot decode on the GPU (no nvJPEG): one warning, and
    native threads decode every sample into the device rows, the batches the CPU loader gives."""
    from fastload import decoders
    from fastload.decoders import hybrid

    sim = nvjpeg_on_sim

    def no_nvjpeg(device):
        raise ImportError("torchvision cannot decode JPEG on cuda:0 (RuntimeError: no nvJPEG)")

    monkeypatch.setattr(hybrid, "_installed_gpu_decoder", lambda: (decoders.kind("nvjpeg"), []))
    monkeypatch.setattr(nvjpeg, "_torchvision_decoder", no_nvjpeg)
    monkeypatch.setattr(_ring, "_warned", set())
    ds = fastload.open(one_truncated, transforms={"image": [T.RandomResizedCrop(16)]})
    kw = dict(batch_size=4, shuffle=True, seed=2, on_error="skip")
    ref = [(x.clone(), y.clone()) for x, y in fastload.DataLoader(ds, **kw)]
    with pytest.warns(RuntimeWarning, match="cannot use 'nvjpeg'.*no nvJPEG"):
        seen = run(sim, fastload.DataLoader(ds, decoder="auto", device="cuda", **kw), sim.default, lag=True)
    assert not sim.races and not sim.waits_in()
    assert len(seen) == len(ref)
    for (x, y), (sx, sy) in zip(ref, seen):
        assert torch.equal(x, sx) and torch.equal(y, sy)


def test_gpu_decoders_decode_on_the_device_current_at_the_first_iteration(nvjpeg_on_sim, monkeypatch,
                                                                         one_truncated):
    """A loader built before torch.cuda.set_device(local_rank): its GPU decoder and rows are on the rank's
    device, resolved in the training thread (a producer thread's current device is not the loop's)."""
    current = [0]
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    ds = fastload.open(one_truncated, transforms={"image": [T.RandomResizedCrop(16)]})
    loader = fastload.DataLoader(ds, batch_size=4, decoder="nvjpeg", on_error="skip", device="cuda", num_workers=2,
                                 persistent_workers=True)  # the decoders stay after the epoch
    current[0] = 2
    run(nvjpeg_on_sim, loader, nvjpeg_on_sim.default, lag=False)
    images = loader._batcher.images
    assert images.device == torch.device("cuda", 2) and loader._device_ring.device == torch.device("cuda", 2)
    assert images._decoders["image"].decoder.device == torch.device("cuda", 2)


@pytest.mark.parametrize("lifetime", ["persistent", "epoch", "closed"])
def test_an_abandoned_epochs_queued_decodes_are_ordered_before_the_next_decoders_writes(dali_on_sim, one_truncated,
                                                                                       lifetime):
    """An epoch left after one batch while the producer had decoded more (their work still queued on the
    decoder's stream): the next epoch writes the same row buffers only after that work, with the decoder kept
    (persistent or not: its own stream and its wait on each buffer's latest hand-over order it), or with a new
    one, with a stream of its own, after ``ImageDecoding.close`` (as ``Batcher.close`` does). (The rule is in
    _fill/images.py, common to the decoders; with nvjpeg's stand-in this scenario did not reach a reused buffer in the
    runs tried, so the test runs DALI's fake.)"""
    sim = dali_on_sim
    ds = fastload.open(one_truncated, transforms={"image": [T.RandomResizedCrop(16)]})
    kw = dict(batch_size=4, seed=1, num_workers=2, decoder="dali", on_error="skip", device="cuda",
              persistent_workers=lifetime != "epoch")
    plain = fastload.DataLoader(ds, **kw)
    ref = [run(sim, plain, sim.default, lag=False) for _ in range(2)][1]  # the second epoch
    loader = fastload.DataLoader(ds, **kw)
    it = iter(loader)
    next(it)  # the decoder's stream does not run: the producer's next decodes stay queued
    kept = loader._batcher.images._decoders["image"]
    for _ in range(100):
        if loader._ring is not None and len(loader._ring) >= 3:
            break
        time.sleep(0.01)
    assert len(loader._ring) >= 3  # batches decoded ahead, never handed out
    del it
    gc.collect()
    assert "image" in loader._batcher.images._decoders  # kept at the epoch's end, persistent or not
    if lifetime == "closed":
        loader._batcher.images.close()
    made = []
    real_make = _images.ImageDecoding._decoder
    loader._batcher.images._decoder = lambda *a: made.append(a) or real_make(loader._batcher.images, *a)
    seen = run(sim, loader, sim.default, lag=True)
    assert (loader._batcher.images._decoders.get("image") is kept) == (lifetime != "closed")
    assert len(made) == (lifetime == "closed")  # a new decoder after close, or none
    assert not sim.races
    for (x, y), (sx, sy) in zip(ref, seen):
        assert torch.equal(x, sx) and torch.equal(y, sy)


def dali_cannot_build(monkeypatch, built: list) -> None:
    """DALI imports, but its pipeline cannot be built here (as when DALI sees no device it can use): each try's
    thread is appended to ``built``."""
    from fastload.decoders import dali as dali_module

    def fail(self):
        built.append(threading.current_thread().name)
        raise RuntimeError("[/opt/dali/dali/pipeline/pipeline.cc:412] Assert on \"device_id < num_devices\" "
                           "failed: no CUDA device DALI can use\nC++ context: [...]")

    monkeypatch.setattr(dali_module.DaliDecoder, "_build", fail)
    monkeypatch.setattr(_ring, "_warned", set())


@pytest.mark.parametrize("nvjpeg_works", [False, True])
def test_auto_whose_dali_cannot_build_its_pipeline_falls_back_with_one_warning(request, monkeypatch, one_truncated,
                                                                              nvjpeg_works):
    """decoder='auto' paired DALI (it imports), whose pipeline fails to build when the decoder is made, at the first
    batch in the producer thread: one warning with DALI's reason, and the batches are those of the next usable GPU
    decoder (nvjpeg, when it works) or of native threads alone, in both epochs (the loader is not persistent and
    still keeps the decoder it made: DALI tried once). Only
    ImportError was caught: the RuntimeError reached the training loop at its first next()."""
    from fastload import decoders
    from fastload.decoders import hybrid

    sim = request.getfixturevalue("dali_on_sim")
    if nvjpeg_works:
        request.getfixturevalue("nvjpeg_on_sim")  # the same simulated GPU
        monkeypatch.setattr(nvjpeg, "_import_torchvision", lambda: (None, None))  # its probe passes
        monkeypatch.setattr(hybrid.HybridSplit, "_update", lambda self, *a: None)  # both runs cut batches alike
    else:
        def no_torchvision():
            raise ModuleNotFoundError("No module named 'torchvision'")

        monkeypatch.setattr(nvjpeg, "_import_torchvision", no_torchvision)
    ds = fastload.open(one_truncated, transforms={"image": [T.RandomResizedCrop(16)]})
    kw = dict(batch_size=4, shuffle=True, seed=2, on_error="skip")
    if nvjpeg_works:  # what 'auto' gives when it pairs nvjpeg from the start
        monkeypatch.setattr(hybrid, "_installed_gpu_decoder", lambda: (decoders.kind("nvjpeg"), []))
        plain = fastload.DataLoader(ds, decoder="auto", device="cuda", **kw)
        ref = [run(sim, plain, sim.default, lag=False) for _ in range(2)]
    else:
        plain = fastload.DataLoader(ds, **kw)
        ref = [[(x.clone(), y.clone()) for x, y in plain] for _ in range(2)]
    built: list = []
    dali_cannot_build(monkeypatch, built)
    monkeypatch.setattr(hybrid, "_installed_gpu_decoder", lambda: (decoders.kind("dali"), []))
    paired = []  # the GPU decoder of each hybrid made
    real_init = hybrid.HybridDecoder.__init__
    monkeypatch.setattr(hybrid.HybridDecoder, "__init__", lambda self, cpu, gpu, *a: (
        paired.append(gpu and type(gpu.decoder).__name__), real_init(self, cpu, gpu, *a))[1])
    loader = fastload.DataLoader(ds, decoder="auto", device="cuda", **kw)
    instead = "CPU threads share each batch with 'nvjpeg' instead" if nvjpeg_works else "CPU threads only"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = [run(sim, loader, sim.default, lag=True) for _ in range(2)]  # two epochs
    said = [str(w.message) for w in caught if "decoder='auto'" in str(w.message)]
    assert len(said) == 1, said
    assert re.search(r"cannot use 'dali' \(DaliBuildError: DALI could not build its decoding pipeline on cuda:0: "
                     r"RuntimeError: .*no CUDA device DALI can use", said[0]) and instead in said[0], said[0]
    assert "C++ context" not in said[0]
    assert built == ["fastload-batcher"]  # in the producer thread, once
    assert not sim.races and not sim.waits_in()
    for epoch, expected in zip(seen, ref):
        assert len(epoch) == len(expected) == 5
        for (x, y), (sx, sy) in zip(expected, epoch):
            assert torch.equal(x, sx) and torch.equal(y, sy)
    assert paired == ["NvjpegDecoder" if nvjpeg_works else None]  # made once, kept for both epochs
    assert (loader.stats()["hybrid"] is not None) == nvjpeg_works  # a GPU decoder shares the batches, or none does


def test_dali_asked_for_by_name_that_cannot_build_its_pipeline_says_so(dali_on_sim, monkeypatch, one_truncated):
    """decoder='dali' is the user's choice: a pipeline that cannot be built is an error naming DALI and its
    reason at the first next(), never a silent switch to another decoder, nor each sample reported as corrupt."""
    built: list = []
    dali_cannot_build(monkeypatch, built)
    ds = fastload.open(one_truncated, transforms={"image": [T.RandomResizedCrop(16)]})
    loader = fastload.DataLoader(ds, batch_size=4, decoder="dali", device="cuda", on_error="skip")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match=r"decoder='dali': DALI could not build its decoding pipeline on "
                                               r"cuda:0: RuntimeError: .*no CUDA device DALI can use.*"
                                               r"use decoder='native'") as err:
            next(iter(loader))
    assert "C++ context" not in str(err.value)
    assert not [w for w in caught if "fastload" in str(w.message)], [str(w.message) for w in caught]
    assert built == ["fastload-batcher"]


def _blacken(img):
    """A transform fastload does not know: run per sample on the decoded host rows (``_augment/fallback.py``)."""
    return img * 0


def test_a_transform_run_per_sample_is_never_skipped_by_a_gpu_decoder(nvjpeg_on_sim, one_truncated):
    """A GPU decoder writes its rows on the device, where the per-sample transforms (run on host rows after the
    decoder) never ran: was, decoder='nvjpeg' handed out the un-blackened pixels (max 253) without a word. Now
    asked for by name it is refused when the loader is made; 'auto' decodes with native threads, saying why."""
    sim = nvjpeg_on_sim
    ds = fastload.open(one_truncated, transforms={"image": [T.Resize((16, 16)), _blacken]})
    with pytest.raises(ValueError, match=r"decoder='nvjpeg' cannot run \S*_blacken \(a transform run per sample\).*"
                                         r"on the device: use decoder='native'"):
        fastload.DataLoader(ds, batch_size=4, decoder="nvjpeg", on_error="skip", device="cuda")
    with pytest.warns(RuntimeWarning, match=r"decoder='auto' decodes with native threads only.*_blacken"):
        loader = fastload.DataLoader(ds, batch_size=4, decoder="auto", on_error="skip", device="cuda")
        with sim.stream(sim.new_stream("user")):
            x, _ = next(iter(loader))
    sim.run_all()
    assert x.shape == (4, 3, 16, 16) and int(x.max()) == 0
