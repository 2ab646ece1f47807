"""MixUp/CutMix in the loader: fastload.open(..., batch_transforms=...), drawn from each batch's generator,
run on the CPU fused into ToDtype/Normalize's native pass (test_augment_mix_fused.py holds it to torchvision's
float64 formula) or on the device after the copy (here the device stage's code on HostStreams)."""

from __future__ import annotations

import pytest
import torch

import fastload
import fastload.transforms as T
from conftest import packed_image_folder
from fastload._augment.mix import apply_mix
from misuse.conftest import user_error
from mix_common import bound, close_batches, max_error, plans, torchvision_mix  # noqa: F401 (plans: a fixture)

K = 4
OUT = (40, 48)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return packed_image_folder(tmp_path_factory.mktemp("mix_loader"), classes=K, per_class=6)


def image_tf(float_=True):
    tail = [T.ToDtype(torch.float32, scale=True)] if float_ else []
    return {"image": [T.RandomResizedCrop(OUT), T.RandomHorizontalFlip()] + tail}


def mixing(alpha=1.0):
    return [T.RandomChoice([T.CutMix(alpha=alpha, num_classes=K), T.MixUp(alpha=alpha, num_classes=K)])]


def loader(packed, workers=0, batch=None, **kw):
    ds = fastload.open(packed, transforms=image_tf(), batch_transforms=batch)
    return fastload.DataLoader(ds, batch_size=5, shuffle=True, seed=7, num_workers=workers, **kw)


def epoch(dl):
    return [(x.clone(), y.clone()) for x, y in dl]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b))


def test_loader_mixes_as_the_reference_with_the_drawn_plans(packed, plans):
    plain = epoch(loader(packed))
    raw = epoch(fastload.DataLoader(fastload.open(packed, transforms=image_tf(float_=False)), batch_size=5,
                                    shuffle=True, seed=7))  # the same draws, uint8
    mixed = epoch(loader(packed, batch=mixing()))
    assert len(plans) == len(mixed) == len(plain)
    kinds = {p.kind for p in plans}
    assert kinds == {"mixup", "cutmix"}  # RandomChoice picked both over the epoch
    for (x, y), (mx, soft), plan, (u8, _) in zip(plain, mixed, plans, raw):
        assert soft.shape == (x.shape[0], K) and soft.dtype == torch.float32
        assert torch.allclose(soft.sum(1), torch.ones(x.shape[0]))
        one_hot = torch.nn.functional.one_hot(y, K).float()
        assert torch.allclose(soft, plan.label_lam * one_hot + (1 - plan.label_lam) * one_hot.roll(1, 0))
        if plan.kind == "cutmix":
            x1, y1, x2, y2 = plan.box
            assert plan.label_lam == pytest.approx(1 - (x2 - x1) * (y2 - y1) / (OUT[0] * OUT[1]))
        ref_x, ref_soft = apply_mix(x, y, plan, K)  # mix.py's reference on the unmixed batch
        assert torch.equal(soft, ref_soft)
        if plan.kind == "cutmix":
            assert torch.equal(mx, ref_x)
        else:  # the blend fused into ToDtype's pass: torchvision's formula on the uint8 within float32 rounding
            assert max_error(mx, torchvision_mix(u8, plan)) <= bound()
            assert max_error(mx, ref_x) <= 2 * bound()
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(plain, mixed))


def test_mixing_is_deterministic_and_independent_of_num_workers(packed):
    ref = epoch(loader(packed, batch=mixing()))
    assert same(ref, epoch(loader(packed, batch=mixing())))
    assert same(ref, epoch(loader(packed, 2, batch=mixing())))
    other = epoch(fastload.DataLoader(fastload.open(packed, transforms=image_tf(), batch_transforms=mixing()),
                                      batch_size=5, shuffle=True, seed=8))
    assert not same(ref, other)  # the seed decides the draws


@pytest.mark.parametrize("workers_after", [0, 2])
def test_mixing_resumes_mid_epoch_bit_for_bit(packed, workers_after):
    ref = epoch(loader(packed, 1, batch=mixing()))
    dl = loader(packed, 1, batch=mixing())
    it = iter(dl)
    for _ in range(2):
        next(it)
    state = dl.state_dict()
    del it
    restored = loader(packed, workers_after, batch=mixing())
    restored.load_state_dict(state)
    assert same(epoch(restored), ref[2:])


def test_device_stage_mixes_after_the_copy_as_the_cpu_path(packed, plans, monkeypatch):
    """The loader's device chain on CPU tensors: device='cpu' with the loader told it is on a device runs the
    device prefetcher's code on HostStreams: the batch reaches it uint8 with its plan (AfterCopy), ToDtype runs
    there, then the mix; the result equals the CPU path's (which fuses MixUp's blend into ToDtype's pass:
    there within float32 rounding, CutMix and the labels bit for bit)."""
    cpu = epoch(loader(packed, batch=mixing()))
    monkeypatch.setattr(fastload.DataLoader, "_on_device", lambda self: self.device is not None)
    n = len(plans)
    dev = epoch(loader(packed, batch=mixing(), device="cpu"))
    assert plans[:n] == plans[n:]
    assert close_batches(cpu, dev, plans[:n])


def test_cutmix_alone_mixes_uint8_images_exactly(packed, plans):
    ds = fastload.open(packed, transforms=image_tf(float_=False), batch_transforms=T.CutMix(num_classes=K))
    plain = epoch(fastload.DataLoader(fastload.open(packed, transforms=image_tf(float_=False)), batch_size=5,
                                      shuffle=True, seed=7))
    mixed = epoch(fastload.DataLoader(ds, batch_size=5, shuffle=True, seed=7))
    for (x, y), (mx, soft), plan in zip(plain, mixed, plans):
        assert mx.dtype == torch.uint8
        assert torch.equal(mx, apply_mix(x, y, plan, K)[0])


def test_misuse_is_refused_naming_the_field(packed, every_kind):
    with user_error(ValueError, "needs num_classes", "'label'"):
        fastload.open(packed, transforms=image_tf(), batch_transforms=[T.MixUp(alpha=1.0)])
    with user_error(ValueError, "MixUp", "'image'", "float", "ToDtype"):
        fastload.open(packed, transforms=image_tf(float_=False), batch_transforms=mixing())
    with user_error(TypeError, "not a batch transform"):
        fastload.open(packed, transforms=image_tf(), batch_transforms=[T.RandomHorizontalFlip()])
    with user_error(ValueError, "one batch transform"):
        fastload.open(packed, transforms=image_tf(), batch_transforms=[T.MixUp(num_classes=K), T.CutMix(num_classes=K)])
    with user_error(ValueError, "different widths"):
        fastload.open(packed, transforms=image_tf(), batch_transforms=T.RandomChoice(
            [T.MixUp(num_classes=K), T.CutMix(num_classes=K + 1)]))
    schema = fastload.open(every_kind).schema
    images = [f.name for f in schema if f.kind == "image"]
    not_int = next(f for f in schema if f.kind not in ("int", "image"))
    with user_error(ValueError, f"'{not_int.name}'", "int field"):
        fastload.open(every_kind, batch_transforms={(images[0], not_int.name): T.CutMix(num_classes=K)})
    with user_error(ValueError, "does not have"):
        fastload.open(packed, batch_transforms={("image", "lable"): T.CutMix(num_classes=K)})
    with user_error(ValueError, "decode=False"):
        fastload.open(packed, decode=False, batch_transforms=T.CutMix(num_classes=K))
    mixed = fastload.open(packed, transforms=image_tf(), batch_transforms=T.CutMix(num_classes=K))
    with user_error(ValueError, "batch_transforms", "CutMix", "fast path"):
        fastload.DataLoader(mixed, batch_size=4, collate_fn=lambda samples: samples)  # the generic path: no mix
    dl = fastload.DataLoader(fastload.open(packed, transforms=image_tf(), batch_transforms=T.CutMix(num_classes=K - 1)),
                             batch_size=24)
    with user_error(ValueError, "label field 'label'", f"num_classes={K - 1}", f"to {K - 1}"):
        next(iter(dl))


def test_ambiguous_fields_are_refused_with_their_names(numbered):
    path = numbered(10)  # an image and two int fields: label and id
    with user_error(ValueError, "ambiguous", "'label'", "'id'", "('<image field>', '<label field>')"):
        fastload.open(path, batch_transforms=T.CutMix(num_classes=K))
    ds = fastload.open(path, transforms={"image": [T.Resize((24, 24))]},
                       batch_transforms={("image", "label"): T.CutMix(num_classes=K)}, as_dict=True)
    batch = next(iter(fastload.DataLoader(ds, batch_size=5)))
    assert batch["label"].shape == (5, K) and batch["id"].dtype == torch.int64  # the id is left alone


def test_mixed_batches_the_caller_still_holds_are_never_overwritten(packed):
    """The CPU mix writes into reused buffers (fresh 38 MB batches cost page faults): a batch is reused only once
    nothing views it, so batches kept across the epoch equal what they were when handed out."""
    dl = loader(packed, batch=mixing())
    kept, copies = [], []
    for x, y in dl:
        kept.append((x, y))
        copies.append((x.clone(), y.clone()))
    assert len(kept) == 5 and same(kept, copies)
    assert len({x.data_ptr() for x, _ in kept}) == len(kept)  # each held batch has its own buffer
