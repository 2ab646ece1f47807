"""RandAugment's timm magnitude noise (``magnitude_std`` / ``magnitude_max``: timm's ``mstd`` / ``mmax``, issue 21's
timm/DeiT recipe ``rand-m9-mstd0.5``): per sample and operation a magnitude from normal(magnitude, std) (inf: uniform
in [0, magnitude]) clipped to [0, magnitude_max], read on the tables' line; without them torchvision's draws exactly.
Statistical tests at a 1e-3 level over many draws with fixed seeds, as test_augment_draws.py's."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch

from augment_common import H, W, chi2_uniform, differences, ks_critical, ks_uniform, photo_tiles
from fastload._augment import policies
from fastload._augment.plan import plan_batch

N = 6000
HW = (224, 160)


@pytest.fixture
def calls(monkeypatch):
    """Every policy operation planned: (name, sample indices, signed magnitudes), in planning order."""
    seen: list[tuple[str, np.ndarray, np.ndarray]] = []
    real = policies.apply_op

    def spy(b, name, index, m, interpolation, fill):
        seen.append((name, index.copy(), np.asarray(m, dtype=np.float64).copy()))
        real(b, name, index, m, interpolation, fill)

    monkeypatch.setattr(policies, "apply_op", spy)
    return seen


def _plan(t, n=N, hw=HW, seed=1):
    # seed 1: numpy's own normal draws from seed 0's stream sit at p ~ 1e-3 against normal(5, 1) here (checked
    # on the raw generator: the plan's magnitudes equal them to 2e-15); seeds 1-9 give KS distances of 0.3-0.8
    # of the critical value.
    return plan_batch([t], np.tile(hw, (n, 1)), np.random.default_rng(seed))


def _positions(calls, num_bins, hw=HW):
    """The magnitude of every operation with a linear table, as a (fractional) bin: |m| / table end * (num - 1).
    Returns {(slot, sample): bin} (the spy's calls come slot by slot, each slot's operations in space order)."""
    h, w = hw
    ends = {"ShearX": 0.3, "ShearY": 0.3, "TranslateX": 150 / 331 * w, "TranslateY": 150 / 331 * h, "Rotate": 30.0,
            "Brightness": 0.9, "Color": 0.9, "Contrast": 0.9, "Sharpness": 0.9}
    out, slot, last = {}, 0, -1
    order = list(policies._RAND_SPACE)
    for name, index, m in calls:
        j = order.index(name)
        if j <= last:  # the space starts again: the next slot
            slot += 1
        last = j
        if name in ends:
            pos = np.abs(m) / ends[name] * (num_bins - 1)
        elif name == "Solarize":  # linspace(1, 0): threshold fraction 1 - bin / (num - 1)
            pos = (1 - m) * (num_bins - 1)
        else:
            continue
        out.update({(slot, int(i)): float(p) for i, p in zip(index, pos)})
    return out


def _phi(x):
    return 0.5 * (1 + np.vectorize(math.erf)(np.asarray(x) / math.sqrt(2)))


def _ks_cdf(values, cdf) -> float:
    v = np.sort(np.asarray(values))
    f = cdf(v)
    i = np.arange(1, v.size + 1)
    return float(max(np.max(i / v.size - f), np.max(f - (i - 1) / v.size)))


def _binomial_ok(count, n, p, z=4.0):
    return abs(count - n * p) <= z * math.sqrt(n * p * (1 - p)) + 1


# ------------------------------------------------------------------------------- defaults unchanged

def _digest(plan) -> str:
    h = hashlib.sha256()
    g = plan.geometry
    for a in (g.out_hw, g.hflip, g.vflip, g.affine, g.has_affine, g.interpolation, g.fill):
        h.update(np.ascontiguousarray(a).tobytes())
    for s in plan.steps:
        h.update(s.op.encode())
        h.update(np.ascontiguousarray(s.index).tobytes())
        for k in sorted(s.params):
            h.update(k.encode())
            h.update(np.ascontiguousarray(s.params[k]).tobytes())
    return h.hexdigest()[:16]


# Plans of 32 tiles of 48x64 made by RandAugment before magnitude_std existed (fastload at c011d27).
BEFORE = {((), 0): "4a362fbdcb1bbe94", ((), 1): "6866eec0a6313b91",
          ((("num_ops", 3), ("magnitude", 5), ("num_magnitude_bins", 11)), 0): "79349e1c7ac7e490",
          ((("num_ops", 3), ("magnitude", 5), ("num_magnitude_bins", 11)), 1): "71d2c757dedae63c"}


@pytest.mark.parametrize("explicit", [{}, {"magnitude_std": 0.0, "magnitude_max": None}, {"magnitude_max": 30}])
@pytest.mark.parametrize("key", sorted(BEFORE))
def test_default_draws_are_the_ones_before(key, explicit):
    kwargs, seed = dict(key[0]), key[1]
    if "magnitude_max" in explicit and explicit["magnitude_max"] is not None:
        explicit = {"magnitude_max": kwargs.get("num_magnitude_bins", 31) - 1}  # the table's end: no clipping
    plan = plan_batch([policies.RandAugment(**kwargs, **explicit)], np.tile([[48, 64]], (32, 1)),
                      np.random.default_rng(seed))
    assert _digest(plan) == BEFORE[key]


def test_default_draws_follow_torchvisions_order(calls):
    """A per-slot port of torchvision's draws (operation, then sign) on the same generator: the same operations,
    samples and signs, every magnitude at the fixed bin."""
    n, num_ops = 500, 3
    _plan(policies.RandAugment(num_ops=num_ops, magnitude=9), n=n, seed=3)
    rng = np.random.default_rng(3)
    names = list(policies._RAND_SPACE)
    expect = []
    for _ in range(num_ops):
        choice = rng.integers(0, len(names), n)
        negate = rng.random(n) <= 0.5
        for j, name in enumerate(names):
            sel = np.flatnonzero(choice == j)
            if sel.size:
                expect.append((name, sel, negate[sel]))
    assert [(c[0], c[1].tolist()) for c in calls] == [(e[0], e[1].tolist()) for e in expect]
    for (name, _, m), (_, _, neg) in zip(calls, expect):
        if policies._RAND_SPACE[name][1]:
            assert np.array_equal(m < 0, neg & (m != 0)), name
    rotate = torch.linspace(0.0, 30.0, 31)[9].item()
    assert all(np.array_equal(np.abs(m), np.full(m.size, rotate)) for name, _, m in calls if name == "Rotate")


# ------------------------------------------------------------------------------- the noise

def test_normal_noise_per_sample_and_operation(calls):
    t = policies.RandAugment(num_ops=2, magnitude=5, num_magnitude_bins=11, magnitude_std=1.0)
    _plan(t)
    pos = _positions(calls, 11)
    values = np.array(list(pos.values()))
    assert values.size > 0.6 * 2 * N  # 10 of the 14 operations have a linear table
    # normal(5, 1): clipping at 0 and 10 is 5 sigma away. Every table read on its line at fractional bins.
    assert _ks_cdf(values, lambda x: _phi(x - 5.0)) < ks_critical(values.size)
    # One draw per sample and operation: no two alike (continuous), the two slots of a sample independent.
    assert np.unique(values).size == values.size
    both = [(pos[0, i], pos[1, i]) for i in range(N) if (0, i) in pos and (1, i) in pos]
    r = np.corrcoef(np.array(both).T)[0, 1]
    assert abs(r) < 4 / math.sqrt(len(both)), r
    # Signs: half negative, as without noise.
    signed = np.concatenate([m for name, _, m in calls if policies._RAND_SPACE[name][1]])
    assert _binomial_ok(int((signed < 0).sum()), signed.size, 0.5)


def test_posterize_bits_round_the_noisy_magnitude(calls):
    """bits = round(8 - bin / ((num - 1) / 4)) at the drawn bin: with bin ~ normal(5, 1) over 11 bins that is
    round(normal(6, 0.4))."""
    _plan(policies.RandAugment(num_ops=2, magnitude=5, num_magnitude_bins=11, magnitude_std=1.0))
    bits = np.concatenate([m for name, _, m in calls if name == "Posterize"]).astype(int)
    counts = np.array([(bits == b).sum() for b in (4, 5, 6, 7, 8)])
    edges = (np.array([4.5, 5.5, 6.5, 7.5]) - 6.0) / 0.4
    cdf = np.concatenate([[0.0], _phi(edges), [1.0]])
    stat, crit = chi2_uniform(counts, np.diff(cdf))
    assert stat < crit, dict(zip((4, 5, 6, 7, 8), counts))


@pytest.mark.parametrize("magnitude,std,top,lower_mass,upper_mass", [
    (9, 0.5, None, 0.0, 1 - 0.9772499),   # timm's rand-m9-mstd0.5 on its 0-10 scale: P(z > 2) at the end
    (9, 0.5, 9.5, 0.0, 1 - 0.8413447),    # mmax below the table's end: P(z > 1) there
    (1, 1.0, None, 0.1586553, 0.0),       # clipped at 0 below: P(z < -1)
])
def test_clipped_to_zero_and_magnitude_max(calls, magnitude, std, top, lower_mass, upper_mass):
    t = policies.RandAugment(num_ops=2, magnitude=magnitude, num_magnitude_bins=11, magnitude_std=std,
                             magnitude_max=top)
    _plan(t)
    values = np.array(list(_positions(calls, 11).values()))
    hi = 10.0 if top is None else top
    assert values.min() >= -1e-9 and values.max() <= hi + 1e-9
    at_lo, at_hi = np.isclose(values, 0.0, atol=1e-9), np.isclose(values, hi, atol=1e-9)
    assert _binomial_ok(int(at_lo.sum()), values.size, lower_mass), at_lo.mean()
    assert _binomial_ok(int(at_hi.sum()), values.size, upper_mass), at_hi.mean()
    inner = values[~at_lo & ~at_hi]  # the normal, truncated to (0, hi)
    a, b = _phi((0.0 - magnitude) / std), _phi((hi - magnitude) / std)
    assert _ks_cdf(inner, lambda x: (_phi((x - magnitude) / std) - a) / (b - a)) < ks_critical(inner.size)


def test_infinite_std_is_uniform_up_to_the_magnitude(calls):
    _plan(policies.RandAugment(num_ops=2, magnitude=9, num_magnitude_bins=11, magnitude_std=math.inf))
    values = np.array(list(_positions(calls, 11).values()))
    assert values.max() <= 9.0
    assert ks_uniform(values, 0.0, 9.0) < ks_critical(values.size)


def test_same_seed_same_plan_and_the_engines_agree():
    t = policies.RandAugment(num_ops=2, magnitude=9, num_magnitude_bins=11, magnitude_std=0.5)
    hw = np.tile([H, W], (24, 1))
    plan = plan_batch([t], hw, np.random.default_rng(4))
    assert _digest(plan) == _digest(plan_batch([t], hw, np.random.default_rng(4)))
    assert _digest(plan) != _digest(plan_batch([policies.RandAugment(2, 9, 11)], hw,
                                               np.random.default_rng(4)))
    max_d, mean_d, _ = differences(photo_tiles(24), plan)
    # as the fixed-magnitude RandAugment: a level of rounding can cross a later solarize threshold
    assert mean_d < 0.5, (max_d, mean_d)


# ------------------------------------------------------------------------------- arguments

@pytest.mark.parametrize("kwargs,words", [
    ({"magnitude_std": -0.5}, "magnitude_std=-0.5 should be a number >= 0"),
    ({"magnitude_std": float("nan")}, "magnitude_std=nan should be a number >= 0"),
    ({"magnitude_std": "0.5"}, "magnitude_std='0.5' should be a number >= 0"),
    ({"magnitude_std": True}, "magnitude_std=True should be a number >= 0"),
    ({"magnitude_max": 31}, "magnitude_max=31 should be None or a number in [0, num_magnitude_bins - 1 = 30]"),
    ({"magnitude_max": -1}, "magnitude_max=-1 should be None or a number in [0, num_magnitude_bins - 1 = 30]"),
    ({"magnitude_max": 12, "num_magnitude_bins": 11}, "magnitude_max=12 should be None or a number in [0, "
                                                      "num_magnitude_bins - 1 = 10]"),
])
def test_bad_noise_arguments_are_refused(kwargs, words):
    with pytest.raises(ValueError, match="RandAugment: " + words.replace("[", r"\[").replace("(", r"\(")):
        policies.RandAugment(**kwargs)


def test_noise_arguments_are_keyword_only_and_described():
    with pytest.raises(TypeError):
        policies.RandAugment(2, 9, 31, "nearest", None, 0.5)
    assert "magnitude_std" not in policies.RandAugment().describe()  # torchvision's RandAugment, as before
    t = policies.RandAugment(magnitude=9, num_magnitude_bins=11, magnitude_std=0.5, magnitude_max=10)
    assert t.describe() == {"name": "RandAugment", "num_ops": 2, "magnitude": 9, "num_magnitude_bins": 11,
                            "interpolation": "nearest", "fill": None, "magnitude_std": 0.5, "magnitude_max": 10.0}
    assert "magnitude_std=0.5" in repr(t)
