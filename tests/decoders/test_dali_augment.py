"""decoder='dali' with augmentations, in DALI's CPU-only mode (the GPU path's wiring, rows on the CPU): the batched
torch engine on DALI's decoded rows against the native engine on the same rows, and the loader against the
native decoder.

Bounds, TrivialAugmentWide + RandomErasing on tests/decoders/conftest.py's samples (24x32 tiles), 20 plan seeds:
the torch engine on DALI's rows equals the native engine on the same rows byte for byte where no sample has an
affine map; TrivialAugmentWide's shears, translations and rotations are nearest-neighbour, where a coordinate
on a pixel edge rounds either way (float64 grid_sample vs PIL's fixed point, tests/augment/test_augment_engines.py):
measured at most 0.16% of the values differing (max 15 levels, mean 0.012) in one seed of 20; bounded at 0.5%
and mean 0.05. Against the native decoder the pixels differ as DALI's resampling does (dali.py: mean <= 4.0
per sample), and a pixel operation may stretch that (equalize, autocontrast), so the loader tests compare shapes,
labels, determinism, num_workers independence and resume exactly and pixels loosely: mean absolute difference
per batch measured <= 0.52 (5 seeds x 8 batches of 5 at 32x32, tests/conftest.py's pictures), bounded at 2.0.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
from fastload import transforms as T
from fastload._augment.engine_native import run_native
from fastload._augment.plan import PlanBuilder
from fastload.decoders._base import ImageSources
from conftest import resumed_and_reference
from decoders.conftest import HAVE_DALI, OUT_HW, SAMPLES, plan, plan_of, sizes

pytestmark = pytest.mark.skipif(not HAVE_DALI, reason="needs NVIDIA DALI (pip install 'torch-fastload[dali]')")

RECIPE = [T.TrivialAugmentWide(), T.RandomErasing(0.5)]
DIFFERING, MEAN = 0.005, 0.05  # engine vs engine on the same rows (module docstring)
LOADER_MEAN = 2.0  # dali + torch engine vs native decoder + native engine, mean per batch


def augmented_plan(seed: int):
    p = plan(SAMPLES, seed)
    b = PlanBuilder.from_crop_plan(p)
    rng = np.random.default_rng(seed)
    for t in RECIPE:
        t.plan(b, np.arange(p.n), rng)
    return p.with_augment(b.finish())


@pytest.mark.parametrize("seed", range(20))
def test_the_torch_engine_on_dalis_rows_agrees_with_the_native_engine_on_them(seed):
    """DaliDecoder.decode with the augmented plan vs DALI's rows for the plan's geometry run through the native
    engine: exact without affine maps, within the nearest-neighbour edge ties with them."""
    from fastload.decoders.dali import DaliDecoder

    q = augmented_plan(seed)
    dec = DaliDecoder(len(SAMPLES), OUT_HW)
    src = ImageSources.from_bytes(SAMPLES, sizes(SAMPLES))
    tiles = torch.zeros((len(SAMPLES), *OUT_HW, 3), dtype=torch.uint8)
    assert dec.decode(src, plan_of(q.crops, q.flips), tiles) == []
    expect = run_native(tiles.numpy().copy(), q.augment)
    out = torch.zeros_like(tiles)
    assert dec.decode(src, q, out) == []
    d = np.abs(out.numpy().astype(np.int64) - expect.astype(np.int64))
    plain = ~q.augment.geometry.has_affine
    assert d[plain].max() == 0
    assert (d > 0).mean() <= DIFFERING and d.mean() <= MEAN, ((d > 0).mean(), d.mean())
    dec.close()


@pytest.fixture
def augmented_ds(small_images):
    return fastload.open(small_images, transforms={"image": [T.RandomResizedCrop(32), T.RandomHorizontalFlip(),
                                                             *RECIPE]})


def batches(loader):
    return [(x.clone(), y.clone()) for x, y in loader]


def test_loader_with_dali_runs_the_recipe_and_agrees_with_native(augmented_ds):
    """No longer refused (c22f0dc refused decoder='dali' with augmentations at construction): the same plans as the
    native decoder, so the same labels and shapes, pixels within the loose bound."""
    kw = dict(batch_size=5, seed=3, shuffle=True)
    native = batches(fastload.DataLoader(augmented_ds, **kw))
    dali = batches(fastload.DataLoader(augmented_ds, decoder="dali", **kw))
    assert len(native) == len(dali) == 3
    for (a, la), (b, lb) in zip(native, dali):
        assert a.shape == b.shape and a.dtype == b.dtype == torch.uint8 and torch.equal(la, lb)
        assert (a.float() - b.float()).abs().mean() < LOADER_MEAN
    # the augmentation ran: without it DALI's batches are far closer to the plain crop's
    plain = fastload.open(augmented_ds.path, transforms={"image": [T.RandomResizedCrop(32), T.RandomHorizontalFlip()]})
    crop_only = batches(fastload.DataLoader(plain, decoder="dali", **kw))
    assert any(not torch.equal(a, b) for (a, _), (b, _) in zip(crop_only, dali))


def test_loader_with_dali_is_deterministic_and_independent_of_num_workers(augmented_ds):
    kw = dict(batch_size=5, seed=4, shuffle=True, decoder="dali")
    ref = batches(fastload.DataLoader(augmented_ds, num_workers=0, **kw))
    for workers in (0, 2):
        got = batches(fastload.DataLoader(augmented_ds, num_workers=workers, **kw))
        assert len(got) == len(ref)
        for (a, la), (b, lb) in zip(ref, got):
            assert torch.equal(a, b) and torch.equal(la, lb)


def test_loader_with_dali_resumes_mid_epoch(augmented_ds):
    resumed, ref = resumed_and_reference(
        lambda workers: fastload.DataLoader(augmented_ds, batch_size=2, seed=5, shuffle=True, decoder="dali",
                                            num_workers=workers), workers_after=2, done=2)
    assert len(resumed) == len(ref) == 4
    assert all(torch.equal(a, b) for a, b in zip(resumed, ref))


def test_a_padded_random_crop_is_no_longer_refused(small_images):
    """decoder='dali' runs a padded RandomCrop with the other augmentations (it was refused by name when the loader
    was made; tests/decoders/test_gpu_padding.py compares its pixels with the native decoder's)."""
    padded = fastload.open(small_images, transforms={"image": [T.RandomCrop(32, padding=4), *RECIPE]})
    x, _ = next(iter(fastload.DataLoader(padded, batch_size=4, decoder="dali")))
    assert x.shape == (4, 3, 32, 32)
