"""A padded RandomCrop on the GPU decoders on the simulated GPU (tests/sim_streams.py; nvjpeg with PIL decoding,
DALI with a fake pipeline that also takes the per-sample ``size`` and pads as ``fn.pad`` does): the windows'
assembly is queued on the decoder's own stream, after its writes and before the event the rows are handed on
with, its columns go up from pinned staging (no thread waits for the device: no pageable copy), a lagging
consumer sees what a keeping-up one does, and the fill lands where the native decoder puts it."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload import _ring
from fastload import transforms as T
from fastload.decoders import dali
from sim_streams import _describe, _raw
from test_gpu_decoders_sim import FakeDali, FakeOutputs, nvjpeg_on_sim, one_truncated, run  # noqa: F401
from test_ring import sim_cuda  # noqa: F401  (the fixture)
from decoders.test_augment_sim import watch

FILL = (10, 200, 30)
RECIPE = [T.RandomCrop(64, padding=(6, 3, 5, 9), pad_if_needed=True, fill=FILL), T.RandomHorizontalFlip()]


class FakePaddedDali(FakeDali):
    """FakeDali with the padded graph's ``size`` input: each sample resized to its own size and placed at the top
    left of a zero row (``fn.pad`` to ``out_hw``)."""

    def run(self, stream, data, anchor, shape, flip, size=None):
        if size is None:
            return super().run(stream, data, anchor, shape, flip)
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
            (top, left), (ch, cw), (sh, sw) = anchor[k].tolist(), shape[k].tolist(), size[k].astype(int).tolist()
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
def padded_dali_on_sim(sim_cuda, monkeypatch):  # noqa: F811
    monkeypatch.setattr(_ring, "streams_for", lambda device: sim_cuda)
    monkeypatch.setattr(dali, "_import_dali", lambda strict=False: (None, None, None))
    monkeypatch.setattr(dali.DaliDecoder, "_build",
                        lambda self: setattr(self, "_pipe", FakePaddedDali(sim_cuda, self.batch_size, self.out_hw)))
    monkeypatch.setattr(dali.DaliDecoder, "_check_out", lambda self, out, n: out)
    return sim_cuda


@pytest.mark.parametrize("decoder", ["nvjpeg", "dali"])
def test_the_padded_windows_are_assembled_on_the_decoders_stream_before_its_ready_event(request, monkeypatch,
                                                                                       one_truncated, decoder):
    """Each batch's assembly is one launch on the stream the decoder decoded on, queued before the event the batch
    carries; under lag no thread waits for the device (a copy from pageable memory would), no access races, the
    batches equal a keeping-up run's, and the fill is where the native decoder has it. Fails with the assembly
    launched on another stream or after the event, with its columns copied from pageable memory, or not run."""
    sim = request.getfixturevalue("nvjpeg_on_sim" if decoder == "nvjpeg" else "padded_dali_on_sim")
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
        assert stream is ready.stream and stream.name == decoder, (stream, ready.stream)
        assert position < ready.position, (position, ready.position)
    native = [(x.clone(), y.clone()) for x, y in fastload.DataLoader(ds, **kw)]
    fill = torch.tensor(FILL, dtype=torch.uint8).view(1, 3, 1, 1)
    for (x, y), (nx, ny) in zip(seen, native):
        assert torch.equal(y, ny)
        where = (nx == fill).all(dim=1, keepdim=True).expand_as(nx)
        assert where.any() and torch.equal(x[where], nx[where])
