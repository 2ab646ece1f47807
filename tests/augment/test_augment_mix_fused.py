"""MixUp/CutMix on the CPU fast path, fused into the images' native ToDtype/Normalize pass
(``Collator.collate_mixed``, ``_C.mix_affine_u8_f32``): the loader's batches equal torchvision v2's formulas
in float64 on the same uint8 pixels within float32 rounding (``mix_common.bound``), for MixUp, CutMix and a
RandomChoice of them, full and partial batches and batches of one; no pass of its own over the float
batch; and where the kernel cannot run (float16) the mix still runs after the pipeline. The soft labels are
made in numpy on the CPU, the same bits as torch's formula."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
import fastload.transforms as T
from conftest import packed_image_folder
from fastload._augment.mix import MixPlan, apply_mix, mix_labels
from fastload.fast.collate import Collator
from mix_common import bound, max_error, normalized64, plans, soft_labels64, torchvision_mix  # noqa: F401 (plans: a fixture)

K = 4
OUT = (40, 48)
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    # 24 images: batches of 5 end with one of 4
    return packed_image_folder(tmp_path_factory.mktemp("mix_fused"), classes=K, per_class=6)


def tf(tail=()):
    return {"image": [T.RandomResizedCrop(OUT), T.RandomHorizontalFlip()] + list(tail)}


NORMALIZED = (T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD))


def epoch(packed, transforms, batch=None, batch_size=5, **kw):
    ds = fastload.open(packed, transforms=transforms, batch_transforms=batch)
    dl = fastload.DataLoader(ds, batch_size=batch_size, shuffle=True, seed=7, **kw)
    return [(x.clone(), y.clone()) for x, y in dl]


MIXES = {
    "mixup": lambda: T.MixUp(alpha=0.2, num_classes=K),
    "cutmix": lambda: T.CutMix(alpha=1.0, num_classes=K),
    "choice": lambda: T.RandomChoice([T.CutMix(alpha=1.0, num_classes=K), T.MixUp(alpha=0.2, num_classes=K)]),
}


@pytest.mark.parametrize("batch_size", [5, 1])
@pytest.mark.parametrize("which", sorted(MIXES))
@pytest.mark.parametrize("normalize", [True, False], ids=["normalize", "todtype"])
def test_fused_batches_are_torchvisions_formula_on_the_same_uint8(packed, plans, monkeypatch, which, batch_size,
                                                                    normalize):
    """Fails with the neighbour taken from the wrong side (i + 1), with sample 0 paired with itself, with lam and
    1 - lam swapped, with CutMix's box one pixel off."""
    tail = NORMALIZED if normalize else NORMALIZED[:1]
    mean, std = (MEAN, STD) if normalize else (None, None)
    raw = epoch(packed, tf(), batch_size=batch_size)  # the same per-sample draws, uint8, unmixed
    mixed = epoch(packed, tf(tail), MIXES[which](), batch_size)
    assert [len(y) for _, y in mixed][-1] == (4 if batch_size == 5 else 1)  # a partial last batch
    assert len(plans) == len(mixed) == len(raw) and len(mixed) in (5, 24)
    if which == "choice":
        assert {p.kind for p in plans} == {"mixup", "cutmix"}
    for (u8, y), (mx, soft), plan in zip(raw, mixed, plans):
        assert mx.dtype == torch.float32 and mx.is_contiguous(memory_format=torch.channels_last)
        assert max_error(mx, torchvision_mix(u8, plan, mean, std)) <= bound(mean, std), plan
        assert max_error(soft, soft_labels64(y, plan, K)) <= 1e-6
    if batch_size > 1:  # each image with another one: the mix did something
        assert max(max_error(mx, normalized64(u8, mean, std)) for (u8, _), (mx, _) in zip(raw, mixed)) > 0.1


def test_cutmix_fused_is_bit_for_bit_normalize_then_paste(packed, plans):
    plain = epoch(packed, tf(NORMALIZED))
    mixed = epoch(packed, tf(NORMALIZED), MIXES["cutmix"]())
    for (x, y), (mx, soft), plan in zip(plain, mixed, plans):
        ref_x, ref_soft = apply_mix(x, y, plan, K)
        assert torch.equal(mx, ref_x) and torch.equal(soft, ref_soft)


def test_the_mix_makes_no_pass_of_its_own_over_the_float_batch(packed, monkeypatch):
    """The fused path writes the collate's ToDtype/Normalize buffer only: no mix buffer, no torch blend. Fails
    with the mix run after Normalize (the code before the fusion)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a second pass over the float batch")

    monkeypatch.setattr(Collator, "mix_output", refuse)
    monkeypatch.setattr(torch, "lerp", refuse)
    assert len(epoch(packed, tf(NORMALIZED), MIXES["choice"]())) == 5


def test_float16_mixes_after_the_pipeline_as_before(packed, plans):
    """Where the native pass cannot run (float16 here), the mix runs on the pipeline's result (reused buffers):
    the same as mix.py's reference on the unmixed float16 batch."""
    half = (T.ToDtype(torch.float16, scale=True), T.Normalize(MEAN, STD))
    plain = epoch(packed, tf(half))
    mixed = epoch(packed, tf(half), MIXES["choice"]())
    assert {p.kind for p in plans} == {"mixup", "cutmix"}
    for (x, y), (mx, soft), plan in zip(plain, mixed, plans):
        assert mx.dtype == torch.float16
        ref_x, ref_soft = apply_mix(x, y, plan, K)
        assert torch.equal(mx, ref_x) and torch.equal(soft, ref_soft)


@pytest.mark.parametrize("tail", [NORMALIZED, ()], ids=["fused", "uint8-in-place"])
def test_batches_the_caller_holds_are_never_overwritten(packed, tail):
    """The fused blend writes the reused ToDtype/Normalize buffers, CutMix on uint8 pastes in the slot: both only
    once nothing views them (the slot protocol), so batches kept across the epoch equal what they were."""
    batch = MIXES["choice" if tail else "cutmix"]()
    ds = fastload.open(packed, transforms=tf(tail), batch_transforms=batch)
    kept, copies = [], []
    for x, y in fastload.DataLoader(ds, batch_size=5, shuffle=True, seed=7):
        kept.append((x, y))
        copies.append((x.clone(), y.clone()))
    assert len(kept) == 5
    assert all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(kept, copies))
    assert len({x.data_ptr() for x, _ in kept}) == len(kept)


def test_cpu_soft_labels_are_torchs_formula_bit_for_bit():
    """mix_labels builds CPU soft labels in numpy (torch's ops on (64, 1000) floats woke its spinning intra-op
    threads); the bits equal torchvision's ``one_hot.roll(1, 0).mul(1 - lam).add_(one_hot.mul(lam))``, the
    device path's, for any lam, neighbours with the same class, batches of one."""
    rng = np.random.default_rng(0)
    for k in range(500):
        n, classes = int(rng.integers(1, 40)), int(rng.integers(1, 12))
        labels = torch.from_numpy(rng.integers(0, classes, n))
        lam = float(rng.beta(0.2, 0.2)) if k % 2 else float(rng.random())
        plan = MixPlan("mixup" if k % 3 else "cutmix", lam, lam if k % 3 else 1 - lam, None)
        one_hot = torch.nn.functional.one_hot(labels, classes).to(torch.float32)
        ref = one_hot.roll(1, 0).mul(1.0 - plan.label_lam).add_(one_hot.mul(plan.label_lam))
        for dtype in (torch.int64, torch.int32):
            assert torch.equal(mix_labels(labels.to(dtype), plan, classes), ref), (n, classes, lam)
