"""Per-sample transforms (``_augment/fallback*.py``) where their worker processes meet trouble: a worker that
died between batches, a transform that never returns under the loader's ``timeout=``, and the caller's
generators (CUDA's too) after the transforms ran in the caller's process. Each ends in a clear error naming
the worker, in bounded time, with nothing left behind (tests/test_shutdown.py's checks)."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import time
import warnings

import pytest
import torch

import fastload
import fastload.transforms as T
from test_shutdown import left_behind, resources

pytestmark = pytest.mark.timeout(120)

CROP = [T.RandomResizedCrop(24), T.RandomHorizontalFlip()]


def invert(img: torch.Tensor) -> torch.Tensor:
    return 255 - img


def hang_in_a_worker(img: torch.Tensor) -> torch.Tensor:
    if multiprocessing.current_process().name.startswith("fastload-transform"):
        time.sleep(600)
    return img


def _workers() -> list:
    return [p for p in multiprocessing.active_children() if p.name.startswith("fastload-transform")]


def test_a_worker_killed_between_batches_is_named_at_the_next_batch(image_shards):
    """The out-of-memory killer may take an idle worker of a persistent loader: the next batch says which worker
    died and how (it raised a bare ``BrokenPipeError: [Errno 32] Broken pipe`` when the batch was sent to it),
    and the epoch after that runs on a new pool."""
    gc.collect()
    before = resources(image_shards)
    ds = fastload.open(image_shards, transforms={"image": [*CROP, invert]})
    loader = fastload.DataLoader(ds, batch_size=8, shuffle=True, seed=0, num_workers=2, persistent_workers=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        loader.set_epoch(0)
        expected = [b[0].clone() for b in loader]
        victim = _workers()[0]
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(5)
        with pytest.raises(RuntimeError, match=rf"DataLoader worker \(pid {victim.pid}\) is killed by signal: Killed.*"
                                               r"fastload worker \d.*per-sample image transform"):
            list(loader)
        assert _workers() == []
        loader.set_epoch(0)  # the failed epoch counted as one
        again = [b[0].clone() for b in loader]
    assert len(again) == len(expected) and all(torch.equal(a, b) for a, b in zip(again, expected))
    del loader, ds, victim
    assert not left_behind(before, image_shards)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("persistent", [False, True])
def test_a_transform_that_never_returns_ends_in_the_loaders_timeout(image_shards, persistent):
    """``timeout=2``: the loader gave up waiting, then joined its producer thread, which waited for the workers
    without a limit: the loop hung for good. Now the workers' wait is bounded by the same timeout, the stuck
    workers are ended, and the loop gets torch's timeout error."""
    gc.collect()
    before = resources(image_shards)
    ds = fastload.open(image_shards, transforms={"image": [*CROP, hang_in_a_worker]})
    loader = fastload.DataLoader(ds, batch_size=8, num_workers=2, timeout=2, persistent_workers=persistent)
    start = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        with pytest.raises(RuntimeError, match=r"timed out after 2 seconds"):
            list(loader)
    assert time.monotonic() - start < 20
    assert _workers() == []
    del loader, ds
    assert not left_behind(before, image_shards)


def test_the_pools_own_wait_names_the_worker_that_did_not_answer():
    """The pool's error when nobody else times out first (the calling thread filled the batch itself)."""
    import numpy as np

    from fastload._augment.fallback import SampleTimes, UserTransform
    from fastload._augment.fallback_workers import FallbackPool

    pool = FallbackPool([UserTransform(hang_in_a_worker)], 2, 4, (2, 2, 3))
    rows = np.zeros((4, 2, 2, 3), np.uint8)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"timed out after 1(\.0)? seconds.*per-sample image transform worker 0 "
                                           r"\(pid \d+\).*sample <0>"):
        pool.run(rows, range(4), np.arange(4, dtype=np.uint64), lambda k: f"sample <{k}>", SampleTimes(1), timeout=1)
    assert time.monotonic() - start < 10 and pool.closed and _workers() == []


@pytest.mark.parametrize("where", ["loader", "ds[i]"])
def test_the_callers_cuda_generators_are_not_reseeded(image_shards, monkeypatch, where):
    """In the caller's process (num_workers=0, ds[i]) each sample was seeded with ``torch.manual_seed``, which
    also seeds every CUDA generator (queued until CUDA starts when it has not): only the CPU generator is
    restored afterwards, so the training loop's CUDA randomness became the last sample's. And it cost ~0.2 ms a
    sample (the queued seeding records a stack trace)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: calls.append(seed))
    ds = fastload.open(image_shards, transforms={"image": [*CROP, invert]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        if where == "loader":
            assert len(list(fastload.DataLoader(ds, batch_size=8, num_workers=0))) == 6
        else:
            ds[3]
    assert calls == []


def _raises_a_local_exception():
    class Local(Exception):  # defined in a function: its class does not pickle
        pass

    def fail(img):
        raise Local("no such colour")

    return fail


def test_an_exception_whose_class_does_not_pickle_still_names_the_sample(image_shards):
    """The worker could not send it back and died ('exited unexpectedly with exit code 1. Details are lost'):
    now its traceback comes back as torch's RuntimeError, with the sample's note."""
    ds = fastload.open(image_shards, transforms={"image": [*CROP, _raises_a_local_exception()]})
    loader = fastload.DataLoader(ds, batch_size=8, shuffle=False, num_workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        with pytest.raises(RuntimeError) as info:
            next(iter(loader))
    text = str(info.value)
    assert "Local: no such colour" in text and "sample 0, field 'image'" in text and "exited" not in text
    assert _workers() == []


def test_a_pool_is_not_kept_once_the_transforms_run_in_the_calling_thread():
    """num_workers='auto' fills batches with 1, 2, ... threads to measure them, which made a pool of that many
    workers; when it chose 0 threads, those processes stayed idle for the loader's life (persistent_workers)."""
    import numpy as np

    from fastload._augment.fallback import UserTransform
    from fastload._augment.fallback_workers import FallbackRunner

    runner = FallbackRunner("image", [UserTransform(invert)], 4)
    rows = np.zeros((4, 2, 2, 3), np.uint8)
    seeds = np.arange(4, dtype=np.uint64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        runner.run(rows, range(4), seeds, str, type("Pool", (), {"size": 2})())
        assert len(_workers()) == 2 and (rows == 255).all()
        runner.run(rows, range(4), seeds, str, None)
    assert _workers() == [] and (rows == 0).all() and runner.pool is None


def draw_from_every_generator(img: torch.Tensor) -> torch.Tensor:
    """Draws from Python's, numpy's and torch's global generators, as user transforms do."""
    import random

    import numpy as np

    img[0, 0, 0] = random.randint(0, 255)
    img[1, 0, 0] = int(np.random.randint(0, 256))
    img[:, 1, :] = torch.randint(0, 256, (3, img.shape[2]), dtype=torch.uint8)
    return img


@pytest.mark.filterwarnings("ignore::UserWarning")  # 3 threads on a 2-CPU machine
def test_resume_mid_epoch_and_three_workers_give_the_same_images(image_shards):
    """A checked property (it held): the per-sample seeds are keyed by (seed, epoch, sample index), so neither the number
    of worker processes (0 to 3) nor a resume with another number changes a sample."""
    from conftest import resumed_and_reference

    ds = fastload.open(image_shards, transforms={"image": [*CROP, draw_from_every_generator]})

    def make(num_workers):
        return fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=11, num_workers=num_workers)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        reference = [b[0].clone() for b in make(0)]
        assert all(torch.equal(a, b) for a, b in zip(reference, [b[0].clone() for b in make(3)]))
        for workers_after in (0, 3):
            got, expected = resumed_and_reference(make, workers_after, done=5)
            assert len(got) == len(expected) == 7 and all(torch.equal(a, b) for a, b in zip(got, expected))


def test_a_mask_that_does_not_follow_the_per_sample_transforms_is_said(tmp_path):
    """A mask follows its image's native plan; a per-sample transform changes the image alone, so a geometric
    one (an ElasticTransform, a user's warp) left the mask misaligned without a word."""
    said_mask_misses(tmp_path, [T.RandomResizedCrop(16), invert], "invert")


def said_mask_misses(tmp_path, transforms, name):
    """4 (image, mask) samples, packed, opened with ``transforms`` on the image: the loader says the mask does not
    follow ``name`` (run per sample on the image alone), and still yields (image, mask) batches."""
    import numpy as np

    rng = np.random.default_rng(0)
    samples = [{"image": rng.integers(0, 256, (20, 24, 3), dtype=np.uint8),
                "mask": rng.integers(0, 4, (20, 24), dtype=np.uint8)} for _ in range(4)]
    schema = {"image": fastload.Field.image("image"), "mask": fastload.Field.mask("mask")}
    fastload.pack(samples, tmp_path / "seg", workers=0, schema=schema, image_mode="raw")
    ds = fastload.open(tmp_path / "seg", transforms={"image": transforms})
    with pytest.warns(UserWarning, match=r"mask field 'mask' follows the native transforms of image 'image' only; "
                                         rf".*{name} run per sample on the image alone"):
        loader = fastload.DataLoader(ds, batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        assert next(iter(loader))[1].shape == (4, 16, 16)  # (image, mask)


def test_numpys_and_torchs_streams_are_not_the_same_numbers():
    """Both were seeded with the sample's seed's low 32 bits, which both expand the same way (MT19937's
    init_genrand): torch's draws were numpy's raw numbers again (torch.randint(0, 2**32) gave numpy's 2nd, 4th,
    ...), so a transform mixing numpy (albumentations) and torch (torchvision) decisions got correlated ones.
    torch's DataLoader seeds numpy with a hash of the seed for this reason."""
    import numpy as np

    from fastload._augment.fallback import UserTransform, run_sample

    drawn = {}

    def draw(img):
        drawn["numpy"] = set(np.random.randint(0, 2**32, size=16, dtype=np.uint64).tolist())
        drawn["torch"] = set(torch.randint(0, 2**32, (8,)).tolist())
        return img

    for seed in (1, 2**40 + 7, 123456789):
        run_sample([UserTransform(draw)], np.zeros((2, 2, 3), np.uint8), seed)
        assert not drawn["numpy"] & drawn["torch"], seed


def flip_floats(img: torch.Tensor) -> torch.Tensor:
    """A user's geometric transform on the float image (after ToDtype/Normalize)."""
    return img.flip(-1)


def test_a_mask_that_does_not_follow_the_callables_after_normalize_is_said(tmp_path):
    """The callables after ToDtype/Normalize (``ImagePipeline.after``) run per sample on the image alone, as the
    ones before: a geometric one leaves the mask misaligned. Was: said for those before ToDtype only."""
    norm = [T.ToDtype(torch.float32, scale=True), T.Normalize([0.5] * 3, [0.25] * 3)]
    said_mask_misses(tmp_path, [T.RandomResizedCrop(16), *norm, flip_floats], "flip_floats")
