"""A row buffer refilled after a batch that was filled and never read (issue 19, review of the GPU path).

A batch the prefetcher never copied (an epoch left with batches decoded ahead, ``reset``/``load_state_dict``, a
DecodeError) frees its slot at once, while its writes on streams other than the decoder's own (the hybrid's copy
of its CPU half, the ``on_error='skip'`` fix-up on the rows stream) may still be queued: the same decoder's next
fill of that buffer must be ordered after them (``ImageDecoding.fill``: ``after`` the buffer's latest hand-over),
on the simulated GPU (tests/sim_streams.py)."""

from __future__ import annotations

import numpy as np
import pytest

import fastload
from fastload import decoders
from fastload import transforms as T
from fastload.decoders import hybrid
from test_gpu_decoders_sim import dali_on_sim, nvjpeg_on_sim, one_truncated, run  # noqa: F401  (fixtures)
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
