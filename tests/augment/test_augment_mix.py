"""MixUp and CutMix: torchvision v2's formulas on whole batches, soft labels, draws from the batch's generator."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from augment_common import chi2_uniform, ks_critical, ks_two
from fastload._augment.combinators import RandomChoice
from fastload._augment.mix import CutMix, MixUp, apply_mix

N, C, HH, WW, K = 8, 3, 20, 30, 5


def _batch(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(N, C, HH, WW, generator=g)
    if dtype == torch.uint8:
        x = (x * 255).to(torch.uint8)
    return x, torch.randint(0, K, (N,), generator=g)


def test_mixup_blends_each_sample_with_its_neighbour():
    x, y = _batch()
    t = MixUp(alpha=0.2, num_classes=K)
    plan = t.plan_batch(N, (HH, WW), np.random.default_rng(3))
    out, soft = apply_mix(x, y, plan, K)
    lam = plan.lam
    assert torch.allclose(out, lam * x + (1 - lam) * x.roll(1, 0), atol=1e-6)
    one_hot = torch.nn.functional.one_hot(y, K).float()
    assert torch.allclose(soft, lam * one_hot + (1 - lam) * one_hot.roll(1, 0))
    assert torch.allclose(soft.sum(1), torch.ones(N))
    assert torch.equal(x, _batch()[0])  # the input is left alone


def test_cutmix_pastes_the_neighbours_box_and_adjusts_lambda_to_its_area():
    x, y = _batch()
    t = CutMix(alpha=1.0, num_classes=K)
    for seed in range(20):
        plan = t.plan_batch(N, (HH, WW), np.random.default_rng(seed))
        out, soft = apply_mix(x, y, plan, K)
        x1, y1, x2, y2 = plan.box
        assert 0 <= x1 <= x2 <= WW and 0 <= y1 <= y2 <= HH
        inside = torch.zeros(HH, WW, dtype=torch.bool)
        inside[y1:y2, x1:x2] = True
        assert torch.equal(out[..., inside], x.roll(1, 0)[..., inside])
        assert torch.equal(out[..., ~inside], x[..., ~inside])
        assert plan.label_lam == pytest.approx(1.0 - inside.sum().item() / (HH * WW))
        one_hot = torch.nn.functional.one_hot(y, K).float()
        assert torch.allclose(soft, plan.label_lam * one_hot + (1 - plan.label_lam) * one_hot.roll(1, 0))


def _cutmix_port(rnd: random.Random, alpha: float, h: int, w: int) -> float:
    """torchvision v2 ``CutMix._get_params`` literally (Python's random instead of torch's): lam_adjusted."""
    lam = rnd.betavariate(alpha, alpha)
    r_x, r_y = rnd.randrange(w), rnd.randrange(h)
    r = 0.5 * math.sqrt(1.0 - lam)
    r_w_half, r_h_half = int(r * w), int(r * h)
    x1, y1 = max(r_x - r_w_half, 0), max(r_y - r_h_half, 0)
    x2, y2 = min(r_x + r_w_half, w), min(r_y + r_h_half, h)
    return 1.0 - (x2 - x1) * (y2 - y1) / (w * h)


@pytest.mark.parametrize("alpha", [0.2, 1.0])
def test_lambda_distributions_follow_torchvision(alpha):
    rng = np.random.default_rng(11)
    n = 4000
    mix = np.array([MixUp(alpha=alpha, num_classes=K).plan_batch(N, (HH, WW), rng).lam for _ in range(n)])
    ref = np.random.default_rng(12).beta(alpha, alpha, n)  # Beta(alpha, alpha), as torch.distributions.Beta
    assert ks_two(mix, ref) < ks_critical(n, n)
    cut = np.array([CutMix(alpha=alpha, num_classes=K).plan_batch(N, (HH, WW), rng).label_lam for _ in range(n)])
    rnd = random.Random(13)
    port = np.array([_cutmix_port(rnd, alpha, HH, WW) for _ in range(n)])
    assert ks_two(cut, port) < ks_critical(n, n)


def test_random_choice_picks_one_batch_transform_per_batch():
    choice = RandomChoice([MixUp(alpha=0.8, num_classes=K), CutMix(alpha=1.0, num_classes=K)], p=[1, 3])
    rng = np.random.default_rng(0)
    kinds = [choice.plan_batch(N, (HH, WW), rng)[1].kind for _ in range(2000)]
    counts = np.array([kinds.count("mixup"), kinds.count("cutmix")])
    stat, crit = chi2_uniform(counts, np.array([0.25, 0.75]))
    assert stat < crit
    x, y = _batch()
    out, soft = choice(x, y, np.random.default_rng(1))
    assert out.shape == x.shape and soft.shape == (N, K)
    with pytest.raises(TypeError, match="is not a batch transform"):
        RandomChoice([MixUp(num_classes=K), "cutmix"]).plan_batch(N, (HH, WW), rng)


def test_same_generator_state_same_mix():
    x, y = _batch()
    for t in (MixUp(alpha=0.2, num_classes=K), CutMix(num_classes=K)):
        a = t(x, y, np.random.default_rng(7))
        b = t(x, y, np.random.default_rng(7))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_cutmix_on_uint8_and_soft_labels_in():
    x, y = _batch(dtype=torch.uint8)
    soft_in = torch.nn.functional.one_hot(y, K).float() * 0.9 + 0.02
    out, soft = CutMix()(x, soft_in, np.random.default_rng(2))
    assert out.dtype == torch.uint8 and torch.allclose(soft.sum(1), soft_in.sum(1))


@pytest.mark.parametrize("call,exc,words", [
    (lambda x, y: MixUp(num_classes=K)(x.to(torch.uint8), y, np.random.default_rng(0)), TypeError,
     "MixUp blends images, so they should be float"),
    (lambda x, y: MixUp()(x, y, np.random.default_rng(0)), ValueError, "labels are class indices, so num_classes"),
    (lambda x, y: CutMix(num_classes=3)(x, y + 3, np.random.default_rng(0)), ValueError,
     "labels should be in [0, num_classes=3)"),
    (lambda x, y: MixUp(num_classes=K)(x, y[:3], np.random.default_rng(0)), ValueError, "8 != 3"),
    (lambda x, y: MixUp(num_classes=K)(x[0], y, np.random.default_rng(0)), ValueError, "batched (N, C, H, W)"),
    (lambda x, y: MixUp(alpha=0, num_classes=K), ValueError, "alpha=0 should be a positive number"),
    (lambda x, y: CutMix(num_classes=0), ValueError, "num_classes=0 should be a positive int"),
])
def test_mix_misuse_is_named(call, exc, words):
    x, y = _batch()
    with pytest.raises(exc) as info:
        call(x, y)
    assert words in str(info.value)
