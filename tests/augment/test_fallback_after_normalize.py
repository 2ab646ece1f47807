"""Callables after ToDtype/Normalize run per sample on the float image (issue 30 item 2).

timm's training recipe ends ``MaybeToTensor(), Normalize(...), RandomErasing(...)``: its erasing runs on the
normalized float tensor. Such a callable is no longer refused: the fill stage normalizes the batch on the CPU
into float rows of the slot and runs it per sample there (in the same worker processes as the uint8 ones), and
the batch leaves as those floats. These tests check where it runs, what it is handed, its randomness, the one
warning, the errors, ``ds[i]`` and what is still refused.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import fastload
import fastload.transforms as T
from fastload._fill.batcher import beyond_geometry
from test_batcher import one_corrupt  # noqa: F401  (a fixture: a pack with a corrupt JPEG)
from test_fallback import DRAWS, images
from test_ring import lagging_loop, photos, sim_cuda  # noqa: F401  (fixtures: a simulated GPU, a pack)

pytestmark = pytest.mark.timeout(120)

CROP = [T.RandomResizedCrop(24), T.RandomHorizontalFlip()]
NORM = [T.ToDtype(torch.float32, scale=True), T.Normalize([0.5] * 3, [0.25] * 3)]


def negate(img: torch.Tensor) -> torch.Tensor:
    return -img


def erase_corner(img: torch.Tensor) -> torch.Tensor:  # in place, as timm's RandomErasing works
    img[:, :4, :5] = 7.0
    return img


class Noisy:
    """Writes a draw from Python's, numpy's or torch's global generator into the first pixel (a float)."""

    def __init__(self, library: str) -> None:
        self.library = library

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        img[0, 0, 0] = DRAWS[self.library]()
        return img


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("fn, expect", [(negate, lambda a: -a), (erase_corner, None)], ids=["new tensor", "in place"])
def test_a_callable_after_normalize_runs_on_each_normalized_sample(image_shards, num_workers, fn, expect):
    """The plans are the same with and without it (its seeds are drawn last), so the batch is the normalized
    batch transformed. Fails when it is refused at open (the old rule), or runs on the uint8 image."""
    plain = images(fastload.open(image_shards, transforms={"image": CROP + NORM}), num_workers)
    ours = images(fastload.open(image_shards, transforms={"image": [*CROP, *NORM, fn]}), num_workers)
    assert len(ours) == len(plain) == 6
    for a, b in zip(plain, ours):
        assert b.dtype == torch.float32 and b.shape == a.shape
        if expect is not None:
            assert torch.equal(b, expect(a))
        else:
            assert torch.all(b[:, :, :4, :5] == 7.0)
            rest = torch.ones_like(a, dtype=torch.bool)
            rest[:, :, :4, :5] = False
            assert torch.equal(b[rest], a[rest])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_it_is_handed_a_contiguous_chw_tensor_of_the_pipelines_dtype(image_shards, dtype):
    seen = []

    def record(img):
        seen.append((img.dtype, tuple(img.shape), img.is_contiguous()))
        return img

    tail = [T.ToDtype(dtype, scale=True), T.Normalize([0.5] * 3, [0.25] * 3)]
    plain = images(fastload.open(image_shards, transforms={"image": CROP + tail}))
    ours = images(fastload.open(image_shards, transforms={"image": [*CROP, *tail, record]}))
    assert seen and set(seen) == {(dtype, (3, 24, 24), True)}
    assert all(torch.equal(a, b) for a, b in zip(plain, ours))


@pytest.mark.parametrize("library", sorted(DRAWS))
@pytest.mark.parametrize("num_workers", [1, 2])
def test_randomness_is_per_sample_and_the_same_for_any_num_workers(image_shards, num_workers, library):
    ds = fastload.open(image_shards, transforms={"image": [*CROP, *NORM, Noisy(library)]})
    reference = images(ds, 0, epochs=2)
    got = images(ds, num_workers, epochs=2)
    assert all(torch.equal(a, b) for a, b in zip(reference, got))
    draws = [b[:, 0, 0, 0].tolist() for b in got]
    assert all(len(set(d)) > 1 for d in draws)
    assert draws[:6] != draws[6:]


def test_uint8_callables_and_float_callables_draw_their_own_seeds(image_shards):
    """One before ToDtype and one after it, both drawing from torch: their draws differ (separate seeds)."""
    def before(img):
        img[0, 0, 0] = int(torch.randint(0, 256, ()))
        return img

    def after(img):
        img[0, 0, 1] = float(torch.randint(0, 256, ()))
        return img

    ds = fastload.open(image_shards, transforms={"image": [*CROP, before, T.ToDtype(torch.float32), after]})
    b = images(ds, 0)[0]
    assert b[:, 0, 0, 0].tolist() != b[:, 0, 0, 1].tolist()


def test_one_warning_naming_the_transform_where_it_runs_and_its_cost(image_shards):
    ds = fastload.open(image_shards, transforms={"image": [*CROP, *NORM, negate]})
    loader = fastload.DataLoader(ds, batch_size=8, shuffle=True, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            for _ in loader:
                pass
    ours = [w for w in caught if issubclass(w.category, fastload.FastPathWarning)]
    assert len(ours) == 1
    msg = str(ours[0].message)
    assert "negate" in msg and "after ToDtype/Normalize, on the float image" in msg and "ms per image" in msg


def bad_dtype(img):
    return img.to(torch.uint8)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_bad_result_names_the_transform_the_dtype_expected_and_the_sample(image_shards, num_workers):
    ds = fastload.open(image_shards, transforms={"image": [*CROP, *NORM, bad_dtype]})
    with pytest.raises(ValueError) as info:
        next(iter(fastload.DataLoader(ds, batch_size=8, num_workers=num_workers)))
    text = str(info.value)
    assert "bad_dtype returned a uint8 tensor of shape (3, 24, 24)" in text and "expected a float32 CHW" in text
    assert "sample 0, field 'image'" in text


def test_ds_getitem_runs_it_too(image_shards):
    plain = fastload.open(image_shards, transforms={"image": CROP + NORM})
    ours = fastload.open(image_shards, transforms={"image": [*CROP, *NORM, negate]})
    for i in (0, 5):
        torch.manual_seed(i)
        a = plain[i][0]
        torch.manual_seed(i)
        b = ours[i][0]
        assert b.dtype == torch.float32 and torch.equal(b, -a)


def test_with_mixup_the_mixed_batch_is_made_from_the_transformed_floats(image_shards):
    """MixUp (drawn after the per-sample plan) mixes the transformed float images, each with the one before it:
    ``lam * x + (1 - lam) * x.roll(1, 0)`` with the ``lam`` its soft labels show."""
    ds = fastload.open(image_shards, transforms={"image": [*CROP, *NORM, negate]})
    mixed = fastload.open(image_shards, transforms={"image": [*CROP, *NORM, negate]},
                          batch_transforms=T.MixUp(alpha=1.0, num_classes=4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        x, y = next(iter(fastload.DataLoader(ds, batch_size=8, shuffle=True, seed=1)))
        mx, my = next(iter(fastload.DataLoader(mixed, batch_size=8, shuffle=True, seed=1)))
    k = next(i for i in range(8) if y[i] != y[i - 1])
    lam = float(my[k, y[k]])
    assert 0 < lam < 1 and my.shape == (8, 4)
    assert mx.dtype == torch.float32 and torch.allclose(mx, lam * x + (1 - lam) * x.roll(1, 0), atol=1e-4)


def test_the_batch_leaves_normalized_so_the_device_runs_no_normalize(image_shards):
    ds = fastload.open(image_shards, transforms={"image": [*CROP, *NORM, negate]})
    pipe = ds.pipelines["image"]
    assert pipe.tensor and not pipe.batch_tensor  # the device prefetcher's (fast/device.py) is empty
    (name,) = beyond_geometry(ds.pipelines)  # a GPU decoder is refused: the rows stay on the host
    assert name.endswith("negate (a transform run per sample after ToDtype/Normalize)")


def test_what_is_still_refused_says_why(image_shards):
    def open_(*ts):
        return fastload.open(image_shards, transforms={"image": list(ts)})

    with pytest.raises(ValueError, match=r"ToDtype/Normalize must come after.*RandomHorizontalFlip.*comes after them.*must come before"):
        open_(T.RandomResizedCrop(24), *NORM, T.RandomHorizontalFlip())
    with pytest.raises(ValueError, match=r"Normalize.*comes after .*negate.*move .*before ToDtype/Normalize"):
        open_(T.RandomResizedCrop(24), T.ToDtype(torch.float32, scale=True), negate, T.Normalize([0.5] * 3, [0.2] * 3))
    with pytest.raises(ValueError, match=r"RandomErasing.*comes after .*negate"):  # not lifted past it
        open_(T.RandomResizedCrop(24), *NORM, negate, T.RandomErasing())
    with pytest.raises(ValueError, match=r"negate follows ToDtype\(dtype=torch.uint8.*leaves uint8"):
        open_(T.RandomResizedCrop(24), T.ToDtype(torch.uint8), negate)


def test_failed_samples_are_not_transformed_and_their_float_rows_are_replaced_too(one_corrupt):
    """on_error='skip': the sample the decoder failed on is not handed to the transform, and the good sample that
    replaces it is replaced in the float rows as well (else its row would hold another batch's floats)."""
    from fastload._fill.batcher import Batcher
    from test_batcher import batch_of

    seen = []

    def count(img):
        seen.append(img.clone())
        return -img

    ds = fastload.open(one_corrupt, transforms={"image": [T.Resize((16, 16)), *NORM, count]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        images, _ = batch_of(Batcher(ds, batch_size=4, num_threads=0, on_error="skip"), [1, 2, 3, 0])
    assert len(seen) == 3 and images.dtype == torch.float32
    assert torch.equal(images[1], images[0]) and torch.equal(images[0], -seen[0])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_torchs_dataloader_over_getitems_gets_the_transformed_floats(image_shards, num_workers):
    ds = fastload.open(image_shards, transforms={"image": [T.CenterCrop(24), *NORM, negate]})
    plain = fastload.open(image_shards, transforms={"image": [T.CenterCrop(24), *NORM]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        pairs = zip(torch.utils.data.DataLoader(ds, batch_size=8, num_workers=num_workers),
                    torch.utils.data.DataLoader(plain, batch_size=8))
        for (got, _), (ref, _) in pairs:
            assert got.dtype == torch.float32 and torch.equal(got, -ref)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_on_a_simulated_gpu_the_float_batches_are_copied_without_a_second_normalize(sim_cuda, photos, num_workers):
    """device='cuda' (tests/sim_streams.py): the device runs no ToDtype/Normalize for this field (the fill stage
    did), so the batches the lagging GPU's kernels see are the CPU loader's transformed floats, race-free."""
    ds = fastload.open(photos, transforms={"image": [T.RandomResizedCrop(16), *NORM, negate]})
    kw = dict(batch_size=4, shuffle=True, drop_last=True, seed=7, num_workers=num_workers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        ref = [(x.clone(), y.clone()) for x, y in fastload.DataLoader(ds, **kw)]
        seen = lagging_loop(sim_cuda, fastload.DataLoader(ds, device="cuda", **kw))
    assert len(seen) == len(ref) == 9
    for (x, y), (sx, sy) in zip(ref, seen):
        assert sx.dtype == torch.float32 and torch.equal(x, sx) and torch.equal(y, sy)
    assert not sim_cuda.races and not sim_cuda.waits_in()
