"""Which thread runs a GPU decoder's work, on the simulated GPU (tests/sim_streams.py; the decoders' stand-ins are
tests/test_gpu_decoders_sim.py's: PIL for nvJPEG, ``FakeDali`` for DALI's pipeline).

A GPU decoder's call per batch is long host work (nvJPEG's and DALI's host phases, the plan's uploads): it runs
in a producer thread whatever ``num_workers`` and the fill policy say (``fast/chain.py``), never in the training
thread, and so does what an epoch's end asks of it (a non-persistent loader's decoders give back their unused
memory in a thread of its own: that may synchronise the device)."""

from __future__ import annotations

import gc
import threading
import time

import pytest

import fastload
from fastload._fill import images as _images
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
    next()) the training thread never waits for the device. Every loader makes its GPU decoders once, in the
    producer thread, and keeps them (a new DALI pipeline each epoch made the first next() wait for its build: issue
    28's D2, tests/test_gpu_streams_sim.py); a non-persistent one, whose epoch's end lets go of what torch's workers
    would, has them give back the memory they cache and do not use (``release_unused``: DALI's pools, which may
    synchronise the device, simulated here) in a thread of its own, never the training thread. Nothing is closed
    while the loader lives; dropping it leaves no thread."""
    sim = request.getfixturevalue("dali_on_sim" if decoder == "dali" else "nvjpeg_on_sim")
    if decoder == "auto":
        monkeypatch.setattr(hybrid, "_installed_gpu_decoder", lambda: (decoders.kind("nvjpeg"), []))
    before = set(threading.enumerate())
    closed, made, released = [], [], []
    for cls in (dali.DaliDecoder, nvjpeg.NvjpegDecoder, hybrid.HybridDecoder, hybrid.HybridSplit):
        monkeypatch.setattr(cls, "close", lambda self, real=cls.close, what=cls.__name__: (
            closed.append((what, threading.current_thread().name)), real(self))[1])

    def release_unused(self):
        released.append(threading.current_thread().name)
        sim.synchronize()  # DALI's pools give memory back to the device: cudaFree waits for it

    monkeypatch.setattr(dali.DaliDecoder, "release_unused", release_unused)
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
    assert made == ["fastload-batcher"], made
    assert not closed, closed
    deadline = time.monotonic() + 5
    expected = 2 if decoder == "dali" and not persistent else 0
    while time.monotonic() < deadline and len(released) < expected:
        time.sleep(0.01)
    assert released == ["fastload-decoder-trim"] * expected, released
    del loader, epochs
    gc.collect()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and set(threading.enumerate()) - before:
        time.sleep(0.01)
    assert not [t.name for t in set(threading.enumerate()) - before]  # the producers, the hybrid's CPU thread


def test_decoders_still_releasing_memory_at_interpreter_exit_are_waited_for(dali_on_sim, monkeypatch, one_truncated):
    """The thread an epoch's end releases the decoders' unused memory in is a daemon: at exit, the atexit hook waits
    for it, so that it is never ended inside a native call (DALI's) as Python finalizes."""
    release = threading.Event()
    monkeypatch.setattr(dali.DaliDecoder, "release_unused", lambda self: release.wait(5))
    ds = fastload.open(one_truncated, transforms={"image": [T.RandomResizedCrop(16)]})
    loader = fastload.DataLoader(ds, batch_size=4, decoder="dali", on_error="skip", device="cuda")
    run(dali_on_sim, loader, dali_on_sim.default, lag=False)  # the epoch's end hands the release to a thread
    closing = [t for t in _images._REAPERS if t.is_alive()]
    assert len(closing) == 1 and closing[0].daemon
    threading.Timer(0.2, release.set).start()
    _images._join_reapers()  # what atexit runs
    assert not closing[0].is_alive()
