"""decoder='auto' losing its GPU decoder, on the simulated GPU (tests/sim_streams.py; DALI's stand-in is
tests/test_gpu_decoders_sim.py's ``FakeDali``): per image field, and mid-run."""

from __future__ import annotations

import warnings

import pytest
import torch

import fastload
from fastload import Field, _ring, decoders
from fastload import transforms as T
from fastload.decoders import dali, hybrid, nvjpeg
from conftest import Samples, jpeg_bytes
from test_gpu_decoders_sim import FakeDali, dali_on_sim, one_truncated, others, run  # noqa: F401  (fixtures)
from test_ring import sim_cuda  # noqa: F401  (fixture)


def no_torchvision(monkeypatch) -> None:
    def missing():
        raise ModuleNotFoundError("No module named 'torchvision'")

    monkeypatch.setattr(nvjpeg, "_import_torchvision", missing)
    monkeypatch.setattr(_ring, "_warned", set())  # warn_once: these tests count the warnings


@pytest.fixture(scope="module")
def two_image_fields(tmp_path_factory):
    """Twelve samples with two JPEG fields, ``a`` and ``b``, and a label."""
    samples = Samples({"a": jpeg_bytes(40 + i, 48, seed=i), "b": jpeg_bytes(30, 36 + i, seed=100 + i), "label": i}
                      for i in range(12))
    dest = tmp_path_factory.mktemp("two-images") / "ds"
    fastload.pack(samples, dest, schema={"a": Field.image("a"), "b": Field.image("b")}, workers=0)
    return dest


def test_a_field_whose_gpu_decoder_cannot_be_set_up_leaves_the_others_gpu_half_on(dali_on_sim, monkeypatch,
                                                                                   two_image_fields):
    """Field ``a``'s DALI pipeline builds, field ``b``'s does not (its size): ``b`` is decoded by CPU threads only
    (one warning), ``a`` keeps sharing each batch with DALI. The split's CPU-only switch was shared by the fields:
    ``b``'s failure turned ``a``'s GPU half off too."""
    sim = dali_on_sim
    no_torchvision(monkeypatch)
    monkeypatch.setattr(hybrid, "_installed_gpu_decoder", lambda: (decoders.kind("dali"), []))
    runs = []

    def build(self):
        if self.out_hw == (8, 8):
            raise RuntimeError("out of memory building the pipeline for field b")
        self._pipe = FakeDali(sim, self.batch_size, self.out_hw)

    monkeypatch.setattr(dali.DaliDecoder, "_build", build)
    real_run = FakeDali.run
    monkeypatch.setattr(FakeDali, "run", lambda self, *a, **kw: (runs.append(self.out_hw), real_run(self, *a, **kw))[1])
    ds = fastload.open(two_image_fields, transforms={"a": [T.RandomResizedCrop(16)], "b": [T.RandomResizedCrop(8)]})
    loader = fastload.DataLoader(ds, batch_size=4, seed=1, decoder="auto", device="cuda", num_workers=2,
                                 persistent_workers=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = 0
        with sim.stream(sim.default):
            for batch in loader:
                a, b = batch[0], batch[1]  # the fields in schema order: a, b, label
                assert a.shape[-2:] == (16, 16) and b.shape[-2:] == (8, 8)
                sim.model_step([a, b], [])
                others(sim, sim.default)
                batches += 1
        sim.run_all()
    said = [str(w.message) for w in caught if "decoder='auto'" in str(w.message)]
    assert len(said) == 1 and "out of memory building the pipeline for field b" in said[0], said
    assert batches == 3
    assert runs == [(16, 16)] * 3  # field a's GPU half in every batch; field b's never
    split = loader._batcher.images.hybrid
    assert split.gpu_fields == {"a": True, "b": False} and not split.cpu_only
    assert loader.stats()["hybrid"] is not None
    assert not sim.races and not sim.waits_in()


def test_auto_whose_dali_cannot_rebuild_its_pipeline_mid_run_goes_on_with_cpu_threads(dali_on_sim, monkeypatch,
                                                                                      one_truncated):
    """DALI rebuilds its pipeline after a run that raised (its share of the second batch, here); the rebuild fails
    (DaliBuildError): decoder='auto' goes on with CPU threads for that batch and the rest, with one warning naming
    DALI and why, rather than raising it to the training loop. From that batch on, the batches are the CPU
    loader's."""
    sim = dali_on_sim
    no_torchvision(monkeypatch)
    monkeypatch.setattr(hybrid, "_installed_gpu_decoder", lambda: (decoders.kind("dali"), []))
    builds, runs = [], []

    def build(self):
        builds.append(1)
        if len(builds) > 1:
            raise RuntimeError("out of memory rebuilding the pipeline")
        self._pipe = FakeDali(sim, self.batch_size, self.out_hw)

    real_run = FakeDali.run

    def flaky(self, *a, **kw):
        runs.append(1)
        if len(runs) == 2:  # DALI invalidates a pipeline that raised: the decoder builds it again
            raise RuntimeError("Error in thread 0: Failed to decode sample #0")
        return real_run(self, *a, **kw)

    monkeypatch.setattr(dali.DaliDecoder, "_build", build)
    monkeypatch.setattr(FakeDali, "run", flaky)
    ds = fastload.open(one_truncated, transforms={"image": [T.RandomResizedCrop(16)]})
    kw = dict(batch_size=4, seed=2, on_error="skip")
    ref = [(x.clone(), y.clone()) for x, y in fastload.DataLoader(ds, **kw)]
    loader = fastload.DataLoader(ds, decoder="auto", device="cuda", **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = run(sim, loader, sim.default, lag=True)
    said = [str(w.message) for w in caught if "decoder='auto'" in str(w.message)]
    assert len(said) == 1, said
    assert "DaliDecoder: DALI could not build its decoding pipeline" in said[0] and "rebuilding" in said[0], said
    assert len(builds) == 2
    assert len(seen) == len(ref) == 5
    for j, ((x, y), (sx, sy)) in enumerate(zip(ref, seen)):
        assert torch.equal(y, sy)
        if j >= 1:  # the batch whose rebuild failed, decoded again by the CPU threads, and every later one
            assert torch.equal(x, sx), j
    assert loader._batcher.images.hybrid.cpu_only and loader.stats()["hybrid"] is None
    assert loader.stats()["skipped"] == 1
    assert not sim.races and not sim.waits_in()
