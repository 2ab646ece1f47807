"""Issue 28's stream defects, on the simulated GPU (tests/sim_streams.py), each shown the way hardware would show it:

- D1: torchvision's ``decode_jpeg(device='cuda')`` allocates on the caller's current stream and writes on a stream of
  its own (``PrivateStreamLibrary``): called on the decoder's stream, it overwrote memory that stream's queued
  kernels still read (the last batch's images);
- D2: a non-persistent loader built DALI's pipeline again at every epoch, in the wait of the epoch's first next();
- D4: ``torch.cuda.current_stream()`` is a new object per call, so ``is`` told the same stream apart: a second fence
  per batch;
- D5: ``torch.cuda.Stream()`` hands out one of a pool of 32 streams, round robin: streams alias.
tests/cuda/test_gpu_decode_lag.py is D1 on a GPU."""

from __future__ import annotations

import threading
import time
import warnings

import pytest
import torch

import fastload
from fastload import _ring
from fastload import transforms as T
from fastload.decoders import dali, nvjpeg
from fastload.decoders.nvjpeg import NvjpegDecoder
from conftest import jpeg_bytes
from decoders.conftest import OUT_HW, pil_decode, plan
from sim_streams import PrivateStreamLibrary, SimGpu, StreamRef, _real
from test_gpu_decoders_sim import FakeDali, dali_on_sim, nvjpeg_on_sim, one_truncated, run  # noqa: F401
from test_ring import install_sim, photos, sim_cuda  # noqa: F401  (fixtures)

BLOBS = [jpeg_bytes(48, 64, seed=k) for k in range(8)]  # one size: a batch's images fit the last batch's blocks


def decode_two_batches(sim: SimGpu, lag: bool, host_sync: bool = True) -> list[torch.Tensor]:
    """Two batches of four through one NvjpegDecoder whose library is torchvision's stand-in, into row buffers made
    on a rows stream (as _fill/images.py does). ``lag``: the decoder's stream runs nothing between the two decodes (the
    second batch is decoded while the first one's resampling is still queued), as a busy GPU does."""
    dec = NvjpegDecoder(4, OUT_HW, device="cpu", decode_fn=PrivateStreamLibrary(sim, pil_decode, host_sync),
                        streams=sim.fork("nvjpeg"))
    rows = sim.fork("rows")
    outs = []
    for k, blobs in enumerate((BLOBS[:4], BLOBS[4:])):
        with rows.side_context():
            out = rows.empty((4, *OUT_HW, 3), torch.uint8, False)
            dec.fence(out)
        assert dec.decode(blobs, plan(blobs, seed=k), out) == []
        outs.append(out)
        if not lag:
            sim.run_all()
    sim.run_all()
    return [o.clone() for o in outs]


@pytest.mark.parametrize("host_sync", [True, False], ids=["torchvision", "no-host-sync"])
def test_nvjpeg_outputs_are_never_written_under_the_decoder_streams_queued_reads(host_sync):
    """D1. The library's writes run at once on its own stream (it synchronises it on the host), while the first
    batch's resampling is still queued on the decoder's stream: allocated there, the second batch's images took the
    first batch's freed images' memory, and the first batch came out with the second one's pixels (the checker: an
    unordered write by the library and read by the resampling). Allocated on the decoder's output stream and
    recorded for its own, the memory is reused only after the reads ran. A library version without the host
    synchronisation: the decoder's stream reads the images only after the output stream's event (which the
    library made wait for its own stream)."""
    ref = decode_two_batches(SimGpu(), lag=False, host_sync=host_sync)
    sim = SimGpu()
    got = decode_two_batches(sim, lag=True, host_sync=host_sync)
    assert not sim.races
    for r, g in zip(ref, got):
        assert torch.equal(r, g)


def test_the_library_runs_with_the_decoders_output_stream_current():
    """Every call of the library (the batch, the per-image retry of a refused batch, the probe when the decoder is
    made) runs with the decoder's output stream current, never its working stream or the caller's."""
    sim = SimGpu()
    current = []

    def decode(datas):
        current.append(_real(sim.current_stream()))
        return pil_decode(datas)

    nvjpeg._check_decodes(decode, "cuda:0")  # what the decoder calls when it makes torchvision's
    dec = NvjpegDecoder(4, OUT_HW, device="cpu", decode_fn=decode, streams=sim.fork("nvjpeg"))
    out = sim.alloc((4, *OUT_HW, 3), torch.uint8)
    blobs = list(BLOBS[:4])
    blobs[2] = blobs[2][:30]  # refused: the batch, then each image alone
    assert [k for k, _ in dec.decode(blobs, plan(BLOBS[:4]), out)] == [2]
    assert current[0] is sim.default and len(current) == 1 + 1 + 4
    assert all(st is dec.outputs.side for st in current[1:]), current
    assert dec.outputs.side is not dec.streams.side
    sim.run_all()


def test_one_fence_per_batch_while_the_loop_keeps_its_stream(sim_cuda, photos):
    """D4. The prefetcher's side stream waits on one event per batch recorded on the loop's stream; a second one on
    the stream the slot was last handed to only when the loop changed streams. current_stream() (consumer()) is a
    new object per call, so comparing by identity recorded that second fence for every reused slot."""
    sim = sim_cuda
    recorded = []
    real = sim.record
    sim.record = lambda stream, timing=False: (recorded.append(_real(stream)), real(stream, timing))[1]
    loader = fastload.DataLoader(fastload.open(photos, transforms={"image": [T.RandomResizedCrop(16)]}),
                                 batch_size=4, num_workers=0, device="cuda")
    user = sim.new_stream("user")
    n = 0
    seen: list = []
    for stream in (sim.default, sim.default, user):  # two epochs on the default stream, one on another
        with sim.stream(stream):
            for x, y in loader:
                sim.model_step([x, y], seen)
                sim.run(sim.side)
                n += 1
        sim.run_all()
    assert not sim.races and n == 27
    # 18 fences on the default stream; on the user stream 9, plus one on the default stream for each slot the
    # third epoch reuses (the first batch it hands each slot to the user stream)
    slots = len(loader._device_ring)
    assert recorded.count(user) == 9
    assert recorded.count(sim.default) == 18 + slots, (recorded.count(sim.default), slots)


def test_current_stream_is_a_new_object_per_call():
    """The simulator does what torch.cuda.current_stream() does (D4 showed only then)."""
    sim = SimGpu()
    a, b = sim.current_stream(), sim.current_stream()
    assert a is not b and a == b and hash(a) == hash(b) and a == sim.default and isinstance(a, StreamRef)
    assert {a} == {sim.default}


def test_streams_fastload_draws_skip_the_ones_it_holds_and_the_loops(monkeypatch):
    """D5. torch.cuda.Stream() hands out the pool's next stream: a stream fastload draws (a decoder's, made
    later) is drawn again past the streams fastload's live backends hold and the training loops' streams seen, and a
    stream let go of (its backend collected) is drawn again."""
    sim = SimGpu(pool=6)  # side: 0
    user = sim.new_stream("user")  # 1
    _ring.seen_consumer(StreamRef(user))  # as a prefetcher notes the loop's stream
    views = [sim.fork(f"s{k}") for k in range(3)]  # 2, 3, 4
    late = sim.fork("late")  # 5
    assert len({id(v.side) for v in views + [late]} | {id(sim.side), id(user)}) == 6
    first = views[0].side
    del views[0]
    again = sim.fork("again")  # the pool's next is 0 (the side stream, held), then 1 (the loop's), then 2: free
    assert again.side is first
    monkeypatch.setattr(_ring, "_warned", set())  # the warning is once per process: forget an earlier one
    with pytest.warns(RuntimeWarning, match="every one of the 32 CUDA streams"):
        crowded = sim.fork("crowded")  # all six held or seen: the last drawn, with the warning
    assert crowded.side in [sim.side, user, *[v.side for v in views], late.side, again.side]


def test_streams_of_a_non_persistent_loader_stay_distinct_across_epochs(monkeypatch, photos):
    """D5 in a loader. A pool of 9 streams: the prefetcher's, the loop's, torchvision's, the rows', nvjpeg's and
    its outputs' are drawn once and kept (a non-persistent loader keeps its decoders, D2), so six epochs draw no more
    and nothing aliases: the loop's activations (freed with its kernels queued) never reach the library's outputs.
    Made every epoch (2 streams each), the pool wrapped onto the loop's stream and the side stream within them."""
    sim = install_sim(monkeypatch, SimGpu(pool=9))
    monkeypatch.setattr(_ring, "streams_for", lambda device: sim)
    monkeypatch.setattr(nvjpeg.NvjpegDecoder, "_check_out", lambda self, out, n: None)
    library = PrivateStreamLibrary(sim, pil_decode)
    monkeypatch.setattr(nvjpeg, "_torchvision_decoder", lambda device: library)
    user = sim.new_stream("user")
    ds = fastload.open(photos, transforms={"image": [T.RandomResizedCrop(16), T.RandomHorizontalFlip()]})
    kw = dict(batch_size=4, shuffle=True, seed=3, num_workers=2)
    cpu = fastload.DataLoader(ds, **kw)
    loader = fastload.DataLoader(ds, decoder="nvjpeg", device="cuda", **kw)
    for epoch in range(6):
        ref = [(x.clone(), y.clone()) for x, y in cpu]
        seen = run(sim, loader, user, lag=True)
        assert len(seen) == len(ref) == 9
        for (x, y), (sx, sy) in zip(ref, seen):
            assert torch.equal(y, sy) and (x.float() - sx.float()).abs().mean() < 4.0  # nvjpeg's stand-in: PIL
        if epoch == 0:
            drawn = sim._drawn
    assert not sim.races
    assert sim._drawn == drawn == 6, sim._drawn
    dec = loader._batcher.images._decoders["image"].decoder
    mine = [sim.side, user, library.stream, loader._batcher.images.streams.side, dec.streams.side, dec.outputs.side]
    assert len({id(st) for st in mine}) == 6


def test_a_non_persistent_dali_loader_builds_its_pipeline_once(dali_on_sim, monkeypatch, one_truncated):
    """D2. DALI's pipeline takes a while to build (nvJPEG handles, the hardware decoder: 0.5 s here). A
    non-persistent loader built it again at every epoch's first batch, which that epoch's first next() waited for in
    the training thread; it keeps its decoder now, and only the first epoch waits for the build."""
    sim = dali_on_sim
    built = []
    build_s = 0.5

    def slow_build(self):
        built.append(threading.current_thread().name)
        time.sleep(build_s)
        self._pipe = FakeDali(sim, self.batch_size, self.out_hw)

    monkeypatch.setattr(dali.DaliDecoder, "_build", slow_build)
    ds = fastload.open(one_truncated, transforms={"image": [T.RandomResizedCrop(16)]})
    loader = fastload.DataLoader(ds, batch_size=4, seed=1, num_workers=2, decoder="dali", on_error="skip",
                                 device="cuda")
    firsts = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say about it
        for _ in range(3):
            seen: list = []
            t0 = time.perf_counter()
            it = iter(loader)
            batch = next(it)
            firsts.append(time.perf_counter() - t0)
            for x, y in [batch, *it]:
                sim.model_step([x, y], seen)
                sim.run_all()
            assert len(seen) == 5
    assert built == ["fastload-batcher"], built
    assert firsts[0] >= build_s and max(firsts[1:]) < build_s / 2, firsts
    assert not sim.races and not sim.waits_in()
