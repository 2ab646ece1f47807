"""Which thread runs a GPU decoder's work, on the simulated GPU (tests/sim_streams.py; the decoders' stand-ins are
tests/test_gpu_decoders_sim.py's: PIL for nvJPEG, ``FakeDali`` for DALI's pipeline).

A GPU decoder's call per batch is long host work (nvJPEG's and DALI's host phases, the plan's uploads): it runs
in a producer thread whatever ``num_workers`` and the fill policy say (``fast/chain.py``), never in the training
thread, and so does the end of its life (a non-persistent loader's epoch end closes it in a thread of its own:
destroying DALI's pipeline may synchronise the device)."""

from __future__ import annotations

import gc
import threading
import time

import pytest

import fastload
from fastload import _images
from fastload import decoders
from fastload import transforms as T
from fastload.decoders import dali, hybrid, nvjpeg
from fastload.fast import producer as producer_stage
from test_gpu_decoders_sim import FakeDali, dali_on_sim, nvjpeg_on_sim, one_truncated, run  # noqa: F401
from test_ring import sim_cuda  # noqa: F401  (fixture)


def decoding_threads(monkeypatch, decoder: str) -> list:
    """The threads the GPU decoder's work runs in, appended as it runs: NvjpegDecoder.decode (also the hybrid's
    GPU half, decoder='auto' with nvjpeg) or the (fake) DALI pipeline's run."""
    threads: list = []
    if decoder == "dali":
        real_run = FakeDali.run
        monkeypatch.setattr(FakeDali, "run", lambda self, *a, **kw: (threads.append(threading.current_thread()),
                                                                      real_run(self, *a, **kw))[1])
    else:
        real_decode = nvjpeg.NvjpegDecoder.decode
        monkeypatch.setattr(nvjpeg.NvjpegDecoder, "decode",
                            lambda self, *a, **kw: (threads.append(threading.current_thread()),
                                                    real_decode(self, *a, **kw))[1])
    if decoder == "auto":
        monkeypatch.setattr(hybrid, "_installed_gpu_decoder", lambda: (decoders.kind("nvjpeg"), []))
    return threads


@pytest.mark.parametrize("decoder", ["nvjpeg", "dali", "auto"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_gpu_decoders_never_decode_in_the_training_thread(request, monkeypatch, one_truncated, decoder, num_workers):
    """num_workers=0 and the fill policy going inline (cheap batches, a caller with nothing to hide them behind:
    forced here) both fill in the calling thread on the CPU path; a GPU decoder's batches are still filled in a
    producer thread."""
    sim = request.getfixturevalue("dali_on_sim" if decoder == "dali" else "nvjpeg_on_sim")
    monkeypatch.setattr(producer_stage.FillPolicy, "threaded", lambda self, now: False)  # inline, if it may
    threads = decoding_threads(monkeypatch, decoder)
    ds = fastload.open(one_truncated, transforms={"image": [T.RandomResizedCrop(16)]})
    loader = fastload.DataLoader(ds, batch_size=4, seed=1, num_workers=num_workers, decoder=decoder,
                                 on_error="skip", device="cuda")
    seen = run(sim, loader, sim.default, lag=True)
    assert len(seen) == 5 and len(threads) >= 5  # every batch decoded (nvjpeg decodes a failed batch again)
    main = threading.main_thread()
    assert threading.current_thread() is main
    assert main not in threads, [t.name for t in threads]
    assert {t.name for t in threads} == {"fastload-batcher"}
    assert not sim.races and not sim.waits_in()


@pytest.mark.parametrize("decoder", ["nvjpeg", "dali", "auto"])
@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)], ids=["nw0", "nw2", "nw2-pers"])
def test_the_epoch_boundary_leaves_the_gpu_decoders_to_other_threads(request, monkeypatch, one_truncated, decoder,
                                                                     num_workers, persistent):
    """Two epochs under lag: across the epoch boundary (the end of one, at StopIteration, and the next one's first
    next()) the training thread never waits for the device. A non-persistent loader releases its GPU decoders at
    each epoch's end, as torch's workers go (DALI's pipeline and device memory are not held between epochs), but
    closes them in a thread of its own, never the training thread (destroying DALI's pipeline synchronises the
    device: simulated here), and the next epoch's producer makes new ones; a persistent one makes them once and
    keeps them. Dropping the loader leaves no thread."""
    sim = request.getfixturevalue("dali_on_sim" if decoder == "dali" else "nvjpeg_on_sim")
    if decoder == "auto":
        monkeypatch.setattr(hybrid, "_installed_gpu_decoder", lambda: (decoders.kind("nvjpeg"), []))
    before = set(threading.enumerate())
    closed, made = [], []
    for cls in (dali.DaliDecoder, nvjpeg.NvjpegDecoder, hybrid.HybridDecoder, hybrid.HybridSplit):
        def close(self, real=cls.close, what=cls.__name__):
            closed.append((what, threading.current_thread().name))
            if what == "DaliDecoder":
                sim.synchronize()  # DALI's pipeline, destroyed, waits for the device (and frees its memory)
            return real(self)

        monkeypatch.setattr(cls, "close", close)
    real_make = _images.ImageDecoding._decoder
    monkeypatch.setattr(_images.ImageDecoding, "_decoder", lambda self, *a: (
        made.append(threading.current_thread().name), real_make(self, *a))[1])
    ds = fastload.open(one_truncated, transforms={"image": [T.RandomResizedCrop(16)]})
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=1, num_workers=num_workers, decoder=decoder,
                                 on_error="skip", device="cuda", persistent_workers=persistent)
    epochs = [run(sim, loader, sim.default, lag=True) for _ in range(2)]
    assert [len(e) for e in epochs] == [5, 5]
    assert not sim.races
    assert not sim.waits_in(busy=False), sim.waits_in(busy=False)  # no host wait at all in the training thread
    main = threading.current_thread().name
    assert not [c for c in closed if c[1] == main], closed
    assert made == ["fastload-batcher"] * (1 if persistent else 2), made
    deadline = time.monotonic() + 5
    gpu = {"dali": "DaliDecoder", "nvjpeg": "NvjpegDecoder", "auto": "NvjpegDecoder"}[decoder]
    while time.monotonic() < deadline and sum(what == gpu for what, _ in closed) < (0 if persistent else 2):
        time.sleep(0.01)
    # each epoch's GPU decoder closed (the hybrid's with it), in the closing thread; the hybrid's split (its CPU
    # thread, shared by the epochs' hybrids) stays with the loader
    expected = [] if persistent else [gpu] * 2 + (["HybridDecoder"] * 2 if decoder == "auto" else [])
    assert sorted(what for what, _ in closed) == sorted(expected), closed
    assert {t for _, t in closed} <= {"fastload-decoder-close"}, closed
    del loader, epochs
    gc.collect()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and set(threading.enumerate()) - before:
        time.sleep(0.01)
    assert not [t.name for t in set(threading.enumerate()) - before]  # the producers, the hybrid's CPU thread


def test_decoders_still_closing_at_interpreter_exit_are_waited_for(nvjpeg_on_sim, monkeypatch, one_truncated):
    """The thread an epoch's end closes the decoders in is a daemon: at exit, the atexit hook waits for it, so that
    it is never ended inside a native teardown (DALI's) as Python finalizes."""
    release = threading.Event()
    real_close = nvjpeg.NvjpegDecoder.close
    monkeypatch.setattr(nvjpeg.NvjpegDecoder, "close", lambda self: (release.wait(5), real_close(self))[1])
    ds = fastload.open(one_truncated, transforms={"image": [T.RandomResizedCrop(16)]})
    loader = fastload.DataLoader(ds, batch_size=4, decoder="nvjpeg", on_error="skip", device="cuda")
    run(nvjpeg_on_sim, loader, nvjpeg_on_sim.default, lag=False)  # the epoch's end hands the decoder to a thread
    closing = [t for t in _images._REAPERS if t.is_alive()]
    assert len(closing) == 1 and closing[0].daemon
    threading.Timer(0.2, release.set).start()
    _images._join_reapers()  # what atexit runs
    assert not closing[0].is_alive()
