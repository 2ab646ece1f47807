"""A row buffer refilled after a batch that was filled and never read (issue 19, review of the GPU path).

A batch the prefetcher never copied (an epoch left with batches decoded ahead, ``reset``/``load_state_dict``, a
DecodeError) frees its slot at once, while its writes on streams other than the decoder's own (the hybrid's copy
of its CPU half, the ``on_error='skip'`` fix-up on the rows stream) may still be queued: the same decoder's next
fill of that buffer must be ordered after them (``ImageDecoding.fill``: ``after`` the buffer's latest hand-over),
on the simulated GPU (tests/sim_streams.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import fastload
from fastload import decoders
from fastload._fill import images as _images
from fastload import transforms as T
from fastload.decoders import hybrid
from test_gpu_decoders_sim import dali_on_sim, nvjpeg_on_sim, one_truncated, others, run  # noqa: F401  (fixtures)
from test_ring import sim_cuda  # noqa: F401  (fixture)


@pytest.mark.parametrize("decoder", ["auto", "nvjpeg", "dali"])
def test_a_refill_after_a_batch_never_read_is_ordered_after_its_writes_on_other_streams(request, monkeypatch,
                                                                                       one_truncated, decoder):
    """Slot 0 filled with samples 4-7 (the truncated sixth: a fix-up on the rows stream; 'auto': three samples
    copied from the CPU half on the hybrid's stream) and dropped, then filled again by the same decoder with
    8-11 (one sample from the CPU). Without the wait the refill's decode raced that copy and that fix-up."""
    sim = request.getfixturevalue("dali_on_sim" if decoder == "dali" else "nvjpeg_on_sim")
    sim.raise_on_race = False
    cut = [2]
    if decoder == "auto":
        monkeypatch.setattr(hybrid, "_installed_gpu_decoder", lambda: (decoders.kind("nvjpeg"), []))
        monkeypatch.setattr(hybrid.HybridSplit, "split", lambda self, n: min(n - 1, cut[0]))
    ds = fastload.open(one_truncated, transforms={"image": [T.RandomResizedCrop(16)]})
    loader = fastload.DataLoader(ds, batch_size=4, seed=1, num_workers=2, decoder=decoder, on_error="skip",
                                 device="cuda", persistent_workers=True)  # the decoder is kept
    run(sim, loader, sim.default, lag=False)  # the decoder made, every slot's buffer fenced
    sim.run_all()
    assert not sim.races
    b = loader._batcher
    slot = loader._ring.slots[0]
    rng = np.random.default_rng(0)
    cut[0] = 3
    b.fill(slot, np.array([4, 5, 6, 7]), rng)  # the dropped batch: nothing runs, its work stays queued
    cut[0] = 1
    b.fill(slot, np.array([8, 9, 10, 11]), rng)  # the refill, by the same decoder
    sim.run_all()
    assert not sim.races, sim.races[:2]


@pytest.mark.parametrize("decoder", ["auto", "nvjpeg", "dali"])
def test_an_abandoned_epochs_unread_batches_are_refilled_after_their_queued_work(request, monkeypatch, one_truncated,
                                                                               decoder):
    """A persistent loader (its decoder kept) whose epoch is left after one batch while the producer had decoded
    more, the truncated sixth sample among them (its fix-up queued on the rows stream; 'auto': copies queued on
    the hybrid's stream): the next epoch refills those slots, their work still queued, and must be ordered after
    it (with the wait taken out, nvjpeg and dali race here; 'auto' does not reach a race in this scenario: the first
    test covers it). The test checks that such a refill happened: the simulator used to keep every tensor a queued kernel
    captured alive until it ran, so the slots stayed held and the ring grew new ones instead (it reached no
    reused buffer); on a GPU the launch returns at once and the slot is free."""
    sim = request.getfixturevalue("dali_on_sim" if decoder == "dali" else "nvjpeg_on_sim")
    if decoder == "auto":
        monkeypatch.setattr(hybrid, "_installed_gpu_decoder", lambda: (decoders.kind("nvjpeg"), []))
        monkeypatch.setattr(hybrid.HybridSplit, "_update", lambda self, *a: None)  # both runs cut batches alike
    ds = fastload.open(one_truncated, transforms={"image": [T.RandomResizedCrop(16)]})
    kw = dict(batch_size=2, seed=1, num_workers=2, decoder=decoder, on_error="skip", device="cuda",
              persistent_workers=True)  # the truncated sixth sample in the third batch, which the prefetcher leaves
    plain = fastload.DataLoader(ds, **kw)
    ref = [run(sim, plain, sim.default, lag=False) for _ in range(3)][2]  # the third epoch
    refills = []  # per fill: whether the buffer's previous batch still had work queued
    real_fill = _images.ImageDecoding.fill

    def fill(self, pool, pipeline, f, slot, *a, **kw):
        latest = self._ready.get(slot.tensors[f.name].data_ptr())
        refills.append(latest is not None and not latest.complete)  # the attribute: no query (sim.done) here
        return real_fill(self, pool, pipeline, f, slot, *a, **kw)

    loader = fastload.DataLoader(ds, **kw)
    run(sim, loader, sim.default, lag=False)  # a whole epoch: the ring's slots made and fenced (a slot fenced
    # after the dropped batch's fix-up would order the decoder's stream after it)
    monkeypatch.setattr(_images.ImageDecoding, "fill", fill)
    it = iter(loader)
    next(it)  # nothing runs on the simulated GPU: the producer's next batches stay queued
    for _ in range(200):
        if len(refills) >= 5:  # batches decoded ahead, the third (the truncated sample's) among them
            break
        time.sleep(0.01)
    assert len(refills) >= 5
    del it
    kept = loader._batcher.images._decoders["image"]
    first = len(refills)
    seen: list = []
    with sim.stream(sim.default):
        it = iter(loader)
        sim.model_step(list(next(it)), seen)  # the producer starts; nothing runs on the simulated GPU yet
        for _ in range(200):  # the next epoch's producer refills the freed slots while their work is queued
            if len(refills) >= first + 3:
                break
            time.sleep(0.01)
        assert len(refills) >= first + 3
        for k, (x, y) in enumerate(it, 1):  # then the consumer lags, as run() does
            sim.model_step([x, y], seen)
            others(sim, sim.default)
            if k % 3 == 2:
                sim.run(sim.default)
    sim.run_all()
    assert loader._batcher.images._decoders["image"] is kept  # persistent: the same decoder refills
    assert any(refills), "no slot was refilled while its unread batch's work was queued"
    assert not sim.races
    assert len(seen) == len(ref)
    for (x, y), (sx, sy) in zip(ref, seen):
        assert torch.equal(x, sx) and torch.equal(y, sy)
