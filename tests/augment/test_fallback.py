"""Transforms fastload does not know, run per sample after the native part (issue 21 item 4).

What the loader and ``ds[i]`` do with a callable in an image field's list: where in the pipeline it runs,
how it is called and what it must return, its randomness (per sample from the batch's generator: the same
for any ``num_workers``), the one warning with its cost, errors naming the sample, and its worker processes
going away with the loader (as tests/test_shutdown.py checks for the rest).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import random
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
import fastload.transforms as T
from fastload._fill.batcher import beyond_geometry
from test_batcher import one_corrupt  # noqa: F401  (a fixture: a pack with a corrupt JPEG)
from test_shutdown import CTRL_C_NOISE, _run_until_interrupted, left_behind, resources

pytestmark = pytest.mark.timeout(120)

CROP = [T.RandomResizedCrop(24), T.RandomHorizontalFlip()]


def invert(img: torch.Tensor) -> torch.Tensor:
    return 255 - img


DRAWS = {"random": lambda: random.randint(1, 50), "numpy": lambda: int(np.random.randint(1, 50)),
         "torch": lambda: int(torch.randint(1, 50, ()))}


class Noisy:
    """Writes a number drawn from one of Python's, numpy's or torch's global generators (as a user's transform
    draws) into the image's first pixel, where the test reads it back."""

    def __init__(self, library: str = "torch") -> None:
        self.library = library

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        img[0, 0, 0] = DRAWS[self.library]()
        return img


noisy = Noisy("torch")


def images(ds, num_workers=0, epochs=1, seed=3, **kw) -> list[torch.Tensor]:
    loader = fastload.DataLoader(ds, batch_size=8, shuffle=True, seed=seed, num_workers=num_workers, **kw)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            out += [b[0].clone() for b in loader]
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_callable_runs_after_the_native_part_on_each_sample(image_shards, num_workers):
    """The plans are the same with and without the callable (its seeds are drawn last), so its output is the
    native output transformed. Fails when the callable is refused, or runs before the crop."""
    plain = images(fastload.open(image_shards, transforms={"image": CROP}), num_workers)
    ours = images(fastload.open(image_shards, transforms={"image": [*CROP, invert]}), num_workers)
    assert len(ours) == len(plain) == 6
    for a, b in zip(plain, ours):
        assert torch.equal(b, 255 - a)


def test_it_runs_after_native_augmentations_and_before_todtype_normalize(image_shards):
    seen = []

    def record(img):
        seen.append((img.dtype, tuple(img.shape), img.is_contiguous()))
        return img

    native = [*CROP, T.RandomInvert(p=1.0)]
    tail = [T.ToDtype(torch.float32, scale=True), T.Normalize([0.5] * 3, [0.25] * 3)]
    plain = images(fastload.open(image_shards, transforms={"image": native + tail}))
    ours = images(fastload.open(image_shards, transforms={"image": [*native, record, invert, *tail]}))
    assert seen and set(seen) == {(torch.uint8, (3, 24, 24), True)}
    for a, b in zip(plain, ours):  # inverted twice (native, then ours) before normalizing: (0.5 - x) / 0.25
        assert torch.allclose(b, -a, atol=1e-5)


def test_a_callable_before_a_native_transform_is_refused_naming_both(image_shards):
    with pytest.raises(ValueError, match=r"RandomHorizontalFlip.*comes after .*invert.*move .*invert after"):
        fastload.open(image_shards, transforms={"image": [T.RandomResizedCrop(24), invert, T.RandomHorizontalFlip()]})
    with pytest.raises(ValueError, match=r"ColorJitter.*comes after .*invert"):
        fastload.open(image_shards, transforms={"image": [T.RandomResizedCrop(24), invert, T.ColorJitter(0.4)]})
    with pytest.raises(ValueError, match="ToDtype/Normalize must come after.*RandomHorizontalFlip.*comes after them"):  # a callable may now
        fastload.open(image_shards, transforms={"image": [T.RandomResizedCrop(24), T.ToDtype(torch.float32),
                                                          T.RandomHorizontalFlip()]})  # (test_fallback_after_normalize)


@pytest.mark.parametrize("library", sorted(DRAWS))
@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_randomness_is_per_sample_from_the_batch_generator(image_shards, num_workers, library):
    """Deterministic for (seed, epoch), different across epochs and seeds, the same for any num_workers."""
    ds = fastload.open(image_shards, transforms={"image": [*CROP, Noisy(library)]})
    reference = images(ds, 0, epochs=2)
    got = images(ds, num_workers, epochs=2)
    assert all(torch.equal(a, b) for a, b in zip(reference, got))
    draws = [b[:, 0, 0, 0].tolist() for b in got]
    assert all(len(set(d)) > 1 for d in draws)  # each sample its own draw
    assert draws[:6] != draws[6:]  # epoch 1 draws other values than epoch 0
    assert draws[:6] != [b[:, 0, 0, 0].tolist() for b in images(ds, num_workers, seed=4)]  # and another seed


def test_the_callers_global_generators_are_left_as_they_were(image_shards):
    """At num_workers=0 the transforms run in the training thread: seeding them must not reseed the loop."""
    ds = fastload.open(image_shards, transforms={"image": [*CROP, noisy]})
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    images(ds, 0)
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1]) and got[2] == expected[2]


def test_one_warning_per_loader_naming_the_transform_and_its_cost(image_shards):
    ds = fastload.open(image_shards, transforms={"image": [*CROP, invert]})
    loader = fastload.DataLoader(ds, batch_size=8, shuffle=True, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            for _ in loader:
                pass
    ours = [w for w in caught if issubclass(w.category, fastload.FastPathWarning)]
    assert len(ours) == 1
    msg = str(ours[0].message)
    assert "transforms['image']" in msg and "invert" in msg and "ms per image" in msg and "first batch" in msg


class Albumentations:
    """Stands in for an albumentations pipeline: matched by its module, called as ``t(image=hwc)["image"]``."""

    __module__ = "albumentations.core.composition"

    def __call__(self, *, image):
        assert isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.shape[2] == 3
        return {"image": image[::-1].copy(), "mask": None}


def to_pil_and_back(img: torch.Tensor):
    return Image.fromarray(img.permute(1, 2, 0).numpy()).transpose(Image.Transpose.FLIP_TOP_BOTTOM)


@pytest.mark.parametrize("flip", [Albumentations(), to_pil_and_back], ids=["albumentations", "PIL result"])
def test_albumentations_objects_and_pil_results(image_shards, flip):
    plain = images(fastload.open(image_shards, transforms={"image": CROP}))
    ours = images(fastload.open(image_shards, transforms={"image": [*CROP, flip]}))
    for a, b in zip(plain, ours):
        assert torch.equal(b, a.flip(2))  # upside down


def bad_dtype(img):
    return img.float()


def bad_shape(img):
    return img[:, :10]


def explode(img):
    raise KeyError("no such colour")


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("fn, exc, words", [
    (bad_dtype, ValueError, ["bad_dtype returned a float32 tensor of shape (3, 24, 24)", "expected a uint8 CHW",
                             "(3, 24, 24)"]),
    (bad_shape, ValueError, ["bad_shape returned a uint8 tensor of shape (3, 10, 24)", "expected"]),
    (explode, KeyError, ["no such colour"]),
])
def test_a_bad_result_or_an_exception_names_the_transform_and_the_sample(image_shards, num_workers, fn, exc, words):
    ds = fastload.open(image_shards, transforms={"image": [*CROP, fn]})
    loader = fastload.DataLoader(ds, batch_size=8, shuffle=False, num_workers=num_workers)
    with pytest.raises(exc) as info:
        next(iter(loader))
    text = str(info.value) + "".join(getattr(info.value, "__notes__", []))
    for w in words:
        assert w in text
    assert f"dataset '{image_shards}'" in text and "sample 0, field 'image'" in text  # the batch's first sample


def test_ds_getitem_runs_the_same_transforms(image_shards):
    plain = fastload.open(image_shards, transforms={"image": CROP})
    ours = fastload.open(image_shards, transforms={"image": [*CROP, invert]})
    for i in (0, 5):
        torch.manual_seed(i)
        a = plain[i][0]
        torch.manual_seed(i)
        assert torch.equal(ours[i][0], 255 - a)
    bad = fastload.open(image_shards, transforms={"image": [*CROP, bad_dtype]})
    with pytest.raises(ValueError, match=r"sample 5, field 'image'.*bad_dtype returned a float32"):
        bad[5]


def test_a_gpu_decoder_is_told_the_rows_must_stay_on_the_host(image_shards):
    ds = fastload.open(image_shards, transforms={"image": [*CROP, invert]})
    (name,) = beyond_geometry(ds.pipelines)  # what ImageDecoding refuses a GPU decoder for, by name
    assert name.endswith("invert (a transform run per sample)")


def test_non_callables_are_still_refused(image_shards):
    with pytest.raises(TypeError, match=r"unsupported image transform 3 .*not callable"):
        fastload.open(image_shards, transforms={"image": [*CROP, 3]})


# -- worker processes ---------------------------------------------------------------------------------------

def test_workers_go_at_the_end_of_a_non_persistent_epoch_and_with_the_loader(image_shards):
    gc.collect()
    before = resources(image_shards)
    ds = fastload.open(image_shards, transforms={"image": [*CROP, invert]})
    loader = fastload.DataLoader(ds, batch_size=8, shuffle=True, seed=0, num_workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        it = iter(loader)
        next(it)
        assert len(multiprocessing.active_children()) == 2  # the transform workers, while the epoch runs
        kept = list(it)
        assert multiprocessing.active_children() == []  # gone at the epoch's end, batches still held
        del kept, it
        persistent = fastload.DataLoader(ds, batch_size=8, shuffle=True, seed=0, num_workers=2,
                                         persistent_workers=True)
        for _ in range(2):
            for k, _ in enumerate(persistent):
                if k == 1:
                    break
        assert len(multiprocessing.active_children()) == 2
    del persistent, loader, ds
    assert not left_behind(before, image_shards)


@CTRL_C_NOISE
def test_ctrl_c_at_random_moments_leaves_no_worker_behind(image_shards):
    gc.collect()
    before = resources(image_shards)
    ds = fastload.open(image_shards, transforms={"image": [*CROP, invert]})
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=0, num_workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        reference = fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=0, num_workers=2)
        reference.set_epoch(7)
        expected = [b[0].clone() for b in reference]
        for delay in (0.0, 0.02, 0.05, 0.1, 0.2):
            _run_until_interrupted(loader, delay)
        loader.set_epoch(7)  # the workers' answers to interrupted batches must not land in later ones
        got = [b[0].clone() for b in loader]
        assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))
    del loader, ds, reference
    assert not left_behind(before, image_shards)


def crash_in_a_worker(img):
    if multiprocessing.current_process().name.startswith("fastload-transform"):
        os._exit(3)
    return img


def test_a_worker_that_dies_is_reported_and_the_workers_stopped(image_shards):
    ds = fastload.open(image_shards, transforms={"image": [*CROP, crash_in_a_worker]})
    loader = fastload.DataLoader(ds, batch_size=8, shuffle=True, seed=0, num_workers=2, persistent_workers=True)
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid \d+\) exited unexpectedly with exit code 3.*"
                                           r"per-sample image transform"):
        next(iter(loader))
    assert multiprocessing.active_children() == []
    ok = fastload.open(image_shards, transforms={"image": [*CROP, invert]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        assert len(list(fastload.DataLoader(ok, batch_size=8, num_workers=2))) == 6


@pytest.mark.parametrize("num_workers", [0, 2])
def test_torchs_dataloader_over_getitems_runs_them_in_its_own_processes(image_shards, num_workers):
    """torch's DataLoader calls ds.__getitems__: the transforms run in the process that calls it (torch's
    workers are daemonic and may not have children; at num_workers=0 the user asked for no processes)."""
    ds = fastload.open(image_shards, transforms={"image": [T.CenterCrop(24), invert]})
    plain = fastload.open(image_shards, transforms={"image": [T.CenterCrop(24)]})
    torch_loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=num_workers)
    for (got, _), (ref, _) in zip(torch_loader, torch.utils.data.DataLoader(plain, batch_size=8)):
        assert torch.equal(got, 255 - ref)
        assert multiprocessing.active_children() == [] or num_workers
    assert multiprocessing.active_children() == []


def _report_can_fork(conn):
    from fastload._augment.fallback_workers import can_fork

    conn.send(can_fork())


def test_a_daemonic_process_runs_them_in_its_own_thread():
    """multiprocessing forbids a daemonic process (a DataLoader worker) children: no pool is tried there."""
    from fastload._augment.fallback_workers import can_fork

    ours, theirs = multiprocessing.get_context("fork").Pipe()
    p = multiprocessing.get_context("fork").Process(target=_report_can_fork, args=(theirs,), daemon=True)
    p.start()
    assert ours.recv() is False and can_fork() is True
    p.join()


def test_an_interrupted_batch_closes_the_pool(monkeypatch):
    """Ctrl-C while the caller waits for the workers: their answers to that batch would be read as the next
    batch's, so the pool is closed (the runner makes a new one) and its workers reaped."""
    from fastload._augment import fallback_workers
    from fastload._augment.fallback import SampleTimes, UserTransform

    pool = fallback_workers.FallbackPool([UserTransform(invert)], 2, 8, (4, 4, 3))
    rows = np.arange(8 * 48, dtype=np.uint8).reshape(8, 4, 4, 3)

    real_wait = fallback_workers.connection.wait

    def interrupted(*args, **kwargs):  # the first wait (for the batch) is interrupted
        monkeypatch.setattr(fallback_workers.connection, "wait", real_wait)
        raise KeyboardInterrupt

    monkeypatch.setattr(fallback_workers.connection, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pool.run(rows, range(8), np.arange(8, dtype=np.uint64), str, SampleTimes(1))
    assert pool.closed and multiprocessing.active_children() == []
    assert np.array_equal(rows, np.arange(8 * 48, dtype=np.uint8).reshape(8, 4, 4, 3))  # rows untouched


def test_apply_pil_runs_the_augmentations_and_the_per_sample_transforms():
    """The PIL reference engine of a whole pipeline (it handed the augmentation engine an array where a decode
    function was due, so any augmentation raised TypeError)."""
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8))
    plain = np.asarray(T.apply_pil([T.RandomResizedCrop(16)], img, np.random.default_rng(1)))
    augmented = T.apply_pil([T.RandomResizedCrop(16), T.RandomInvert(1.0)], img, np.random.default_rng(1))
    both = T.apply_pil([T.RandomResizedCrop(16), T.RandomInvert(1.0), invert], img, np.random.default_rng(1))
    assert np.array_equal(np.asarray(augmented), 255 - plain) and np.array_equal(np.asarray(both), plain)


def test_samples_that_failed_to_decode_are_not_transformed_and_are_replaced_after(one_corrupt):
    """on_error='skip': a sample the decoder failed on is not handed to the transform; the good sample that
    replaces it is the transformed one."""
    from fastload._fill.batcher import Batcher
    from test_batcher import batch_of

    seen = []

    def count(img):
        seen.append(img.clone())
        return 255 - img

    ds = fastload.open(one_corrupt, transforms={"image": [T.Resize((16, 16)), count]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        images, _ = batch_of(Batcher(ds, batch_size=4, num_threads=0, on_error="skip"), [1, 2, 3, 0])
    assert len(seen) == 3
    assert torch.equal(images[1], images[0]) and torch.equal(images[0], 255 - seen[0])
