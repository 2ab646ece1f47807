"""Drawn parameters follow torchvision's distributions: statistical tests over many draws with fixed seeds
(chi-square and Kolmogorov-Smirnov at a 1e-3 level), against the distribution torchvision's ``get_params``
defines or against a literal per-sample port of it."""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest
import torch

from augment_common import chi2_uniform, ks_critical, ks_two, ks_uniform
from fastload._augment import policies
from fastload._augment.color import ColorJitter, RandomGrayscale
from fastload._augment.combinators import RandomApply, RandomChoice, RandomOrder
from fastload._augment.filters import GaussianBlur, RandomErasing
from fastload._augment.plan import plan_batch
from fastload._augment.tone import RandomAutocontrast, RandomEqualize, RandomInvert

N = 6000
HW = (224, 224)


def _plan(transforms, n=N, hw=HW, seed=0):
    return plan_batch(transforms, np.tile(hw, (n, 1)), np.random.default_rng(seed))


def _column(plan, op, name):
    steps = [s for s in plan.steps if s.op == op]
    return np.concatenate([s.index for s in steps]), np.concatenate([s.params[name] for s in steps])


def _binomial_ok(count, n, p, z=4.0):
    return abs(count - n * p) <= z * math.sqrt(n * p * (1 - p)) + 1


def test_color_jitter_factors_are_uniform_on_torchvisions_ranges():
    plan = _plan([ColorJitter(brightness=0.4, contrast=(0.5, 1.5), saturation=1.3, hue=0.1)])
    for op, lo, hi in [("brightness", 0.6, 1.4), ("contrast", 0.5, 1.5), ("saturation", 0.0, 2.3), ("hue", -0.1, 0.1)]:
        index, factor = _column(plan, op, "factor")
        assert np.array_equal(np.sort(index), np.arange(N)), f"{op}: every sample exactly once"
        assert ks_uniform(factor, lo, hi) < ks_critical(N), op


def test_color_jitter_order_is_a_uniform_permutation_per_sample():
    plan = _plan([ColorJitter(0.4, 0.4, 0.4, 0.1)])
    orders = Counter(tuple(name for name, _ in plan.ops_of(i)) for i in range(N))
    assert len(orders) == 24
    stat, crit = chi2_uniform(np.array(list(orders.values())))
    assert stat < crit


def test_color_jitter_skips_what_torchvision_skips():
    plan = _plan([ColorJitter(brightness=0, contrast=(1, 1), saturation=None, hue=(0.0, 0.0))], n=10)
    assert plan.steps == []
    plan = _plan([ColorJitter(hue=0.5)], n=2000)
    _, factor = _column(plan, "hue", "factor")
    assert factor.min() >= -0.5 and factor.max() <= 0.5 and ks_uniform(factor, -0.5, 0.5) < ks_critical(2000)


@pytest.mark.parametrize("transform,op,p", [(RandomGrayscale(), "grayscale", 0.1), (RandomInvert(0.3), "invert", 0.3),
                                            (RandomEqualize(), "equalize", 0.5)])
def test_random_apply_probabilities(transform, op, p):
    plan = _plan([transform])
    count = sum(s.index.size for s in plan.steps if s.op == op)
    assert _binomial_ok(count, N, p), f"{op}: {count} of {N}"


def test_gaussian_blur_sigma_is_uniform_and_shared_by_both_axes():
    plan = _plan([GaussianBlur(9, sigma=(0.5, 3.0))])
    _, sigma = _column(plan, "gaussian_blur", "sigma")
    assert np.array_equal(sigma[:, 0], sigma[:, 1])
    assert ks_uniform(sigma[:, 0], 0.5, 3.0) < ks_critical(N)
    _, ksize = _column(plan, "gaussian_blur", "ksize")
    assert (ksize == [9, 9]).all()


def _erasing_port(rnd: random.Random, img_h, img_w, p, scale, ratio):
    """torchvision v2 ``RandomErasing`` for one image, literally (Python's random instead of torch's)."""
    if rnd.random() >= p:
        return None
    area = img_h * img_w
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        erase_area = area * rnd.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rnd.uniform(log_ratio[0], log_ratio[1]))
        h = int(round(math.sqrt(erase_area * aspect_ratio)))
        w = int(round(math.sqrt(erase_area / aspect_ratio)))
        if not (h < img_h and w < img_w):
            continue
        return rnd.randint(0, img_h - h), rnd.randint(0, img_w - w), h, w
    return "failed"


@pytest.mark.parametrize("scale,ratio", [((0.02, 0.33), (0.3, 3.3)), ((0.5, 0.95), (0.3, 3.3))])
def test_random_erasing_boxes_follow_torchvisions_algorithm(scale, ratio):
    hw = (40, 60)
    plan = _plan([RandomErasing(p=0.7, scale=scale, ratio=ratio)], hw=hw)
    index, box = _column(plan, "erase", "box")
    rnd = random.Random(1)
    port = [_erasing_port(rnd, hw[0], hw[1], 0.7, scale, ratio) for _ in range(N)]
    boxes = np.array([b for b in port if isinstance(b, tuple)])
    assert _binomial_ok(index.size, N, boxes.shape[0] / N, z=5.0), (index.size, boxes.shape[0])
    for col, what in enumerate(("top", "left", "h", "w")):
        assert ks_two(box[:, col], boxes[:, col]) < ks_critical(box.shape[0], boxes.shape[0]), what
    assert (box[:, 2] < hw[0]).all() and (box[:, 3] < hw[1]).all()
    assert (box[:, 0] + box[:, 2] <= hw[0]).all() and (box[:, 1] + box[:, 3] <= hw[1]).all()


# ---- policies: spy on the operations they plan ----

@pytest.fixture
def calls(monkeypatch):
    seen: list[tuple[str, np.ndarray, np.ndarray]] = []
    real = policies.apply_op

    def spy(b, name, index, m, interpolation, fill):
        seen.append((name, index.copy(), np.asarray(m, dtype=np.float64).copy()))
        real(b, name, index, m, interpolation, fill)

    monkeypatch.setattr(policies, "apply_op", spy)
    return seen


def _counts(calls, names):
    c = Counter()
    for name, index, _ in calls:
        c[name] += index.size
    return np.array([c[n] for n in names])


def test_trivial_augment_op_bins_and_signs(calls):
    _plan([policies.TrivialAugmentWide()])
    names = list(policies._TRIVIAL_SPACE)
    assert len(names) == 14
    counts = _counts(calls, names)
    assert counts.sum() == N
    stat, crit = chi2_uniform(counts)
    assert stat < crit, dict(zip(names, counts))
    # Bins: Rotate's |m| = 135 * bin / 30, bins uniform over 31; signs negative half of the time.
    m = np.concatenate([mm for name, _, mm in calls if name == "Rotate"])
    bins = np.rint(np.abs(m) / 4.5).astype(int)
    assert np.allclose(np.abs(m), bins * 4.5, atol=1e-4)
    stat, crit = chi2_uniform(np.bincount(bins, minlength=31))
    assert stat < crit
    signed = np.concatenate([mm for name, _, mm in calls if policies._TRIVIAL_SPACE[name][1]])
    nonzero = signed[signed != 0]
    assert _binomial_ok(int((nonzero < 0).sum()), nonzero.size, 0.5)
    unsigned = np.concatenate([mm for name, _, mm in calls if name in ("Posterize", "Solarize")])
    assert (unsigned >= 0).all()


def test_rand_augment_ops_per_slot_and_fixed_magnitude(calls):
    t = policies.RandAugment(num_ops=2, magnitude=9)
    _plan([t], hw=(224, 160))
    names = list(policies._RAND_SPACE)
    counts = _counts(calls, names)
    assert counts.sum() == 2 * N
    stat, crit = chi2_uniform(counts)
    assert stat < crit
    expect = {"Rotate": 9.0, "Brightness": 0.27, "ShearX": 0.09, "Posterize": 7.0, "Solarize": 0.7,
              "TranslateX": 150.0 / 331.0 * 160 * 9 / 30, "TranslateY": 150.0 / 331.0 * 224 * 9 / 30}
    for name, value in expect.items():
        m = np.concatenate([mm for n_, _, mm in calls if n_ == name])
        assert np.allclose(np.abs(m), value, rtol=1e-6), name


def test_auto_augment_imagenet_frequencies(calls):
    _plan([policies.AutoAugment()])
    names = list(policies._AUTO_SPACE)
    expected = Counter()
    for pair in policies._IMAGENET_POLICY:
        for name, prob, _ in pair:
            expected[name] += prob / len(policies._IMAGENET_POLICY)
    counts = _counts(calls, names)
    probs = np.array([expected[n] for n in names])
    total_p = probs.sum()
    stat, crit = chi2_uniform(counts, probs / total_p)
    assert stat < crit, dict(zip(names, counts))
    assert _binomial_ok(int(counts.sum()), N * 2, total_p / 2)
    # Each operation's magnitude is one of its sub-policies' fixed bins of 10 (torchvision's tables).
    bits = (8 - (torch.arange(10) / ((10 - 1) / 4))).round().int().tolist()
    rotate = torch.linspace(0.0, 30.0, 10).tolist()
    for name, _, m in calls:
        if name == "Posterize":
            assert set(np.unique(m)) <= {bits[b] for b in (8, 7, 6, 5)}
        if name == "Rotate":
            assert set(np.unique(np.abs(m))) <= {rotate[b] for b in (9, 8, 3)}
        if name == "Color":
            assert set(np.unique(np.abs(m))).issubset(set(torch.linspace(0.0, 0.9, 10).double().numpy()[[0, 2, 4, 8]]))


def test_policy_magnitude_tables_are_torchvisions():
    """The tables torchvision builds with torch (float32 linspace and its posterize formula)."""
    hw = np.array([[224, 160]])
    b = np.arange(31)
    ta = policies._TRIVIAL_SPACE
    assert np.array_equal(ta["Rotate"][0](b, 31, hw), torch.linspace(0.0, 135.0, 31).double().numpy())
    assert np.array_equal(ta["ShearX"][0](b, 31, hw), torch.linspace(0.0, 0.99, 31).double().numpy())
    assert np.array_equal(ta["TranslateY"][0](b, 31, hw), torch.linspace(0.0, 32.0, 31).double().numpy())
    assert np.array_equal(ta["Brightness"][0](b, 31, hw), torch.linspace(0.0, 0.99, 31).double().numpy())
    assert np.array_equal(ta["Solarize"][0](b, 31, hw), torch.linspace(1.0, 0.0, 31).double().numpy())
    assert np.array_equal(ta["Posterize"][0](b, 31, hw),
                          (8 - (torch.arange(31) / ((31 - 1) / 6))).round().int().double().numpy())
    ra = policies._RAND_SPACE
    assert np.array_equal(ra["Posterize"][0](b, 31, hw),
                          (8 - (torch.arange(31) / ((31 - 1) / 4))).round().int().double().numpy())
    tx = ra["TranslateX"][0](b, 31, np.tile(hw, (31, 1)))
    assert np.array_equal(tx, torch.linspace(0.0, 150.0 / 331.0 * 160, 31).double().numpy())
    assert set(ra) == {"Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
                       "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize"}
    assert set(policies._AUTO_SPACE) == set(ra) - {"Identity"} | {"Invert"}


# ---- combinators ----

def test_random_apply_is_all_or_nothing_per_sample():
    plan = _plan([RandomApply([RandomInvert(1.0), RandomEqualize(1.0)], p=0.3)])
    inv = [s for s in plan.steps if s.op == "invert"][0].index
    eq = [s for s in plan.steps if s.op == "equalize"][0].index
    assert np.array_equal(inv, eq) and _binomial_ok(inv.size, N, 0.3)


def test_random_choice_frequencies():
    plan = _plan([RandomChoice([RandomInvert(1.0), RandomEqualize(1.0), RandomAutocontrast(1.0)], p=[1, 2, 1])])
    counts = np.array([sum(s.index.size for s in plan.steps if s.op == op)
                       for op in ("invert", "equalize", "autocontrast")])
    assert counts.sum() == N
    stat, crit = chi2_uniform(counts, np.array([0.25, 0.5, 0.25]))
    assert stat < crit


def test_random_order_is_a_uniform_permutation_per_sample():
    plan = _plan([RandomOrder([RandomInvert(1.0), RandomEqualize(1.0), RandomAutocontrast(1.0)])])
    orders = Counter(tuple(name for name, _ in plan.ops_of(i)) for i in range(N))
    assert len(orders) == 6
    stat, crit = chi2_uniform(np.array(list(orders.values())))
    assert stat < crit
