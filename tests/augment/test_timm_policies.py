"""timm's RandAugment / AutoAugment as native plans (``fastload/_augment/timm_policies.py``), without timm: stand-ins
with the attributes timm 1.0's ``AugmentOp``, ``RandAugment``, ``AutoAugment`` and ``AugMixAugment`` have
(``timm/data/auto_augment.py``), and the arguments of timm's ``LEVEL_TO_ARG`` written out for a few magnitudes.
test_timm_policies_real.py holds each op against timm's own objects on the same draws, where timm imports."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fastload.transforms as T
from fastload._augment.plan import BICUBIC, BILINEAR, PlanBuilder
from fastload._augment.timm_convert import convert
from fastload._augment.timm_policies import RANDOM, TimmAutoAugment, TimmOp, TimmRandAugment
from fastload._draws import SampleDraws
from fastload._augment.fallback import UserTransform
from test_torchvision_convert import tv

AUTO = "timm.data.auto_augment"
FILL = (124, 116, 104)


def op(name, prob=0.5, magnitude=9, std=0.5, resample=(2, 3), mmax=None):
    """timm's AugmentOp's attributes (``name`` set after: ``tv`` takes the class name as its own)."""
    o = tv(AUTO, "AugmentOp", prob=prob, magnitude=magnitude, magnitude_std=std, magnitude_max=mmax,
           hparams={"translate_const": 100, "img_mean": FILL, "magnitude_std": std},
           kwargs={"fillcolor": FILL, "resample": resample})
    o.name = name
    return o


def test_timms_rand_augment_converts_with_each_ops_settings():
    ra = tv(AUTO, "RandAugment", ops=[op("SolarizeAdd"), op("TranslateXRel", resample=3), op("Rotate", resample=2)],
            num_layers=2, choice_weights=None)
    (got,) = convert(ra, T)
    assert type(got) is TimmRandAugment and got.num_layers == 2 and got.choice_weights is None
    assert [(o.name, o.prob, o.magnitude, o.magnitude_std, o.fill) for o in got.ops] == [
        (n, 0.5, 9.0, 0.5, FILL) for n in ("SolarizeAdd", "TranslateXRel", "Rotate")]
    assert [o.interpolation for o in got.ops] == [RANDOM, BICUBIC, BILINEAR]
    aa = tv(AUTO, "AutoAugment", policy=[[op("Equalize", 0.8, 1), op("ShearY", 0.8, 4)], [op("Invert", 0.4, 9)]])
    (got,) = convert(aa, T)
    assert type(got) is TimmAutoAugment and [[o.name for o in sp] for sp in got.policy] == [["Equalize", "ShearY"],
                                                                                          ["Invert"]]


def test_a_policy_whose_ops_the_plan_reorders_says_so_once(monkeypatch):
    import fastload._ring as ring

    monkeypatch.setattr(ring, "_warned", set())
    one_layer = tv(AUTO, "RandAugment", ops=[op("Invert"), op("Rotate")], num_layers=1, choice_weights=None)
    colour_only = tv(AUTO, "RandAugment", ops=[op("Invert"), op("Posterize")], num_layers=2, choice_weights=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        convert(one_layer, T)  # one op per sample: nothing to reorder
        convert(colour_only, T)
        convert(tv(AUTO, "AutoAugment", policy=[[op("Rotate", 0.8, 1)], [op("Invert"), op("Equalize")]]), T)
    two = tv(AUTO, "RandAugment", ops=[op("Invert"), op("Rotate")], num_layers=2, choice_weights=None)
    with pytest.warns(UserWarning, match=r"RandAugment\(num_layers=2\) runs natively .* lambda image"):
        convert(two, T)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        convert(two, T)  # once
    monkeypatch.setattr(ring, "_warned", set())
    with pytest.warns(UserWarning, match="timm's AutoAugment runs natively"):
        convert(tv(AUTO, "AutoAugment", policy=[[op("Equalize", 0.8, 1), op("ShearY", 0.8, 4)]]), T)


def test_the_reorder_warning_comes_exactly_when_a_sample_can_differ(monkeypatch):
    """A geometric op first in an AutoAugment sub-policy runs where timm runs it (warned before: any sub-policy of
    several ops with a geometric one); RandAugment drawing one geometric op twice composes two resamplings (not
    warned before: a single-op list), a geometric op of weight 0 is never drawn."""
    import fastload._ring as ring

    quiet = [
        tv(AUTO, "AutoAugment", policy=[[op("Rotate", 0.8, 1), op("Invert")], [op("ShearX"), op("Equalize")]]),
        tv(AUTO, "RandAugment", ops=[op("Invert"), op("Rotate"), op("Equalize")], num_layers=2,
           choice_weights=np.array([0.5, 0.0, 0.5])),
    ]
    for given in quiet:
        monkeypatch.setattr(ring, "_warned", set())
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            convert(given, T)
    loud = [
        tv(AUTO, "AutoAugment", policy=[[op("Rotate", 0.8, 1), op("Invert")], [op("Equalize"), op("ShearX")]]),
        tv(AUTO, "RandAugment", ops=[op("Rotate")], num_layers=2, choice_weights=None),
        tv(AUTO, "RandAugment", ops=[op("Invert"), op("Rotate"), op("Equalize")], num_layers=2,
           choice_weights=np.array([0.5, 0.1, 0.4])),
    ]
    for given in loud:
        monkeypatch.setattr(ring, "_warned", set())
        with pytest.warns(UserWarning, match="runs natively with a sample's geometric ops"):
            convert(given, T)


@pytest.mark.parametrize("given, why", [
    (tv(AUTO, "AugMixAugment", ops=[], alpha=1.0, width=3, depth=-1, blended=False), "blends several augmented"),
    (tv(AUTO, "RandAugment", ops=[op("GaussianBlurRand")], num_layers=2, choice_weights=None), "GaussianBlurRand"),
    (tv(AUTO, "RandAugment", ops=[op("Rotate", resample=1)], num_layers=2, choice_weights=None), "resamples with 1"),
], ids=["AugMix", "3a's blur", "lanczos"])
def test_what_has_no_native_plan_runs_timms_object_saying_why(given, why):
    (got,) = convert(given, T)
    assert isinstance(got, UserTransform) and got.fn is given and why in got.reason, got.reason


def plan_one(name, m, negate=False, bicubic=False, hw=(40, 60), **kw):
    b = PlanBuilder(np.array([hw]))
    TimmOp(name, 1.0, 10, fill=FILL, **kw).apply(b, np.array([0]), np.array([m]), np.array([negate]),
                                                  np.array([bicubic]))
    return b.finish()


@pytest.mark.parametrize("name, m, negate, step, column, value", [
    # timm: min(128, int((m / 10) * 110)), threshold 128
    ("SolarizeAdd", 9.0, False, "solarize_add", "add", 99),
    ("SolarizeAdd", 10.0, False, "solarize_add", "add", 110),
    # 256 - min(256, int((m / 10) * 256)): 256 - 230
    ("SolarizeIncreasing", 9.0, False, "solarize", "threshold", 26.0),
    ("Solarize", 9.0, False, "solarize", "threshold", 230.0),
    # 4 - int((m / 10) * 4); int(...) + 4
    ("PosterizeIncreasing", 9.0, False, "posterize", "bits", 1),
    ("PosterizeOriginal", 5.0, False, "posterize", "bits", 6),
    # max(0.1, 1.0 -/+ (m / 10) * 0.9); (m / 10) * 1.8 + 0.1
    ("ColorIncreasing", 9.0, True, "pil_color", "factor", 1.0 - 0.9 * 0.9),
    ("BrightnessIncreasing", 9.0, False, "brightness", "factor", 1.0 + 0.9 * 0.9),
    ("Contrast", 5.0, False, "pil_contrast", "factor", 0.5 * 1.8 + 0.1),
])
def test_each_ops_argument_is_timms_level_to_arg(name, m, negate, step, column, value):
    plan = plan_one(name, m, negate)
    (s,) = plan.steps
    assert s.op == step and s.params[column][0] == pytest.approx(value, abs=0)
    if name == "SolarizeAdd":
        assert s.params["threshold"][0] == 128


def test_posterize_at_8_bits_and_the_geometric_ops_matrices():
    assert not plan_one("PosterizeOriginal", 10.0).steps  # int(4) + 4 = 8 bits: timm leaves the image
    g = plan_one("TranslateXRel", 5.0, negate=True, bicubic=True, hw=(40, 60)).geometry
    assert np.allclose(g.affine[0], [[1, 0, -0.225 * 60], [0, 1, 0]]) and g.interpolation[0] == BICUBIC
    assert tuple(g.fill[0]) == FILL
    g = plan_one("ShearY", 10.0, interpolation=BILINEAR).geometry
    assert np.allclose(g.affine[0], [[1, 0, 0], [0.3, 1, 0]]) and g.interpolation[0] == BILINEAR
    g = plan_one("TranslateY", 5.0, translate_const=100).geometry
    assert np.allclose(g.affine[0], [[1, 0, 0], [0, 1, 50]])
    g = plan_one("Rotate", 10.0, hw=(40, 60), interpolation=RANDOM).geometry  # PIL's rotate by 30 degrees
    t = np.radians(-30)
    assert np.allclose(g.affine[0][:, :2], [[np.cos(t), np.sin(t)], [-np.sin(t), np.cos(t)]])
    assert g.interpolation[0] == BILINEAR  # random: bicubic only where drawn


def test_draws_are_per_sample_and_follow_timms_probabilities():
    n = 8000
    ra = TimmRandAugment([TimmOp("SolarizeAdd", 0.5, 9, magnitude_std=0.5), TimmOp("Invert", 0.5, 9)], 2)
    b = PlanBuilder(np.tile([8, 8], (n, 1)))
    ra.plan(b, np.arange(n), SampleDraws(3, 0, np.arange(n)))
    plan = b.finish()
    calls = {s.op: 0 for s in plan.steps}
    for s in plan.steps:
        calls[s.op] += s.index.size
    # 2 layers x n samples, each op chosen with probability 1/2 and applied with probability 1/2
    for op_name in ("solarize_add", "invert"):
        assert abs(calls[op_name] - n / 2) < 4.5 * np.sqrt(n / 2 * 0.75), calls
    adds = np.concatenate([s.params["add"] for s in plan.steps if s.op == "solarize_add"])
    # int(clip(N(9, 0.5), 0, 10) / 10 * 110): mostly 93..104, never above 110
    assert adds.max() <= 110 and 96 <= adds.mean() <= 98.5 and len(np.unique(adds)) > 5
    sub = np.random.default_rng(0).permutation(n)[:50]  # the same samples in another batch draw the same
    b2 = PlanBuilder(np.tile([8, 8], (50, 1)))
    ra.plan(b2, np.arange(50), SampleDraws(3, 0, sub))
    mine = {(s.op, int(sub[i])) for s in b2.finish().steps for i in s.index}
    full = {(s.op, int(i)) for s in plan.steps for i in s.index if i in set(sub.tolist())}
    assert mine == full


def _one_call_per_op(ops, which, index, draws, b):
    """What timm's ``AugmentOp.__call__`` draws, one op's samples at a time, as the policies planned before they
    drew for the whole batch at once: ``random() <= prob``, the magnitude noise (``normal``, or ``uniform`` for
    ``std = inf``), the sign, the resampling, on ``draws.at(rows)``."""
    for j, o in enumerate(ops):
        rows = np.flatnonzero(which == j)
        if rows.size == 0 or o is None:
            continue
        rng, k = draws.at(rows), rows.size
        applied = rng.random(k) <= o.prob
        if o.magnitude_std == float("inf"):  # timm: `if std > 0: if std == inf: uniform ... else: gauss`
            m = rng.uniform(0.0, 1.0, k) * o.magnitude
        else:
            z = rng.normal(0.0, 1.0, k)
            m = o.magnitude + z * o.magnitude_std if o.magnitude_std > 0 else np.full(k, o.magnitude)
        m = np.maximum(0.0, np.minimum(m, o.magnitude_max or 10.0))
        negate = rng.random(k) > 0.5
        bicubic = rng.integers(0, 2, k) == 1
        o.apply(b, index[rows][applied], m[applied], negate[applied], bicubic[applied])


@pytest.mark.parametrize("std", [0.5, float("inf"), 0.0, float("-inf"), -0.5])
def test_the_batchs_draws_at_once_are_each_ops_own(std):
    """A layer's draws for the whole batch (four calls) give each sample the values a call per op gave it: the same
    plan, bit for bit (per-sample draws count their calls per sample)."""
    n, hw = 300, (50, 70)
    names = ("SolarizeAdd", "Rotate", "TranslateXRel", "ShearY", "ColorIncreasing", "Posterize", "Invert")
    ops = [TimmOp(name, 0.6, 8, magnitude_std=std, interpolation=RANDOM, fill=FILL) for name in names]
    ra = TimmRandAugment(ops, 2)
    got = PlanBuilder(np.tile(hw, (n, 1)))
    ra.plan(got, np.arange(n), SampleDraws(5, 2, np.arange(n)))
    want = PlanBuilder(np.tile(hw, (n, 1)))
    draws = SampleDraws(5, 2, np.arange(n))
    chosen = ra._choose(n, draws)
    for layer in range(2):
        _one_call_per_op(ops, chosen[:, layer], np.arange(n), draws, want)
    got, want = got.finish(), want.finish()
    assert len(got.steps) == len(want.steps) == 8  # 4 pixel ops x 2 layers
    for a, b in zip(got.steps, want.steps):
        assert a.op == b.op and np.array_equal(a.index, b.index)
        assert all(np.array_equal(a.params[c], b.params[c]) for c in a.params)
    for field in ("affine", "has_affine", "interpolation", "fill"):
        assert np.array_equal(getattr(got.geometry, field), getattr(want.geometry, field)), field
    # AutoAugment: sub-policies of two ops and of one, each sample's ops in order
    policy = [[ops[0], ops[1]], [ops[2]], [ops[3], ops[4]]]
    got = PlanBuilder(np.tile(hw, (n, 1)))
    TimmAutoAugment(policy).plan(got, np.arange(n), SampleDraws(6, 0, np.arange(n)))
    want = PlanBuilder(np.tile(hw, (n, 1)))
    draws = SampleDraws(6, 0, np.arange(n))
    chosen = draws.integers(0, 3, n)
    for j, sub in enumerate(policy):
        for o in sub:
            _one_call_per_op([o], np.where(chosen == j, 0, -1), np.arange(n), draws, want)
    got, want = got.finish(), want.finish()
    for s in range(n):
        assert [(op, {c: v.tolist() for c, v in row.items()}) for op, row in got.ops_of(s)] == \
            [(op, {c: v.tolist() for c, v in row.items()}) for op, row in want.ops_of(s)]
    assert np.array_equal(got.geometry.affine, want.geometry.affine) and got.geometry.has_affine.sum() > 50


@pytest.mark.parametrize("std", [0.0, -0.5, float("-inf"), float("nan")])
def test_a_std_that_is_not_above_zero_adds_no_noise(std):
    """timm's ``AugmentOp`` draws magnitude noise only when ``magnitude_std > 0`` (then uniform for ``inf``): 0, a
    negative std, ``-inf`` and nan keep the magnitude itself (``-inf`` once drew uniformly, as ``inf`` does)."""
    noise = np.random.default_rng(0).random((500, 2))
    assert np.array_equal(TimmOp("SolarizeAdd", 1.0, 7, magnitude_std=std).magnitudes(noise), np.full(500, 7.0))
    uniform = TimmOp("SolarizeAdd", 1.0, 7, magnitude_std=float("inf")).magnitudes(noise)
    assert np.array_equal(uniform, noise[:, 0] * 7.0)  # random.uniform(0, m) from the call's first column


def test_weighted_choice_is_without_replacement():
    ra = TimmRandAugment([TimmOp("Invert", 1.0), TimmOp("Equalize", 1.0), TimmOp("AutoContrast", 1.0)], 2,
                         choice_weights=[0.7, 0.2, 0.1])
    chosen = ra._choose(5000, np.random.default_rng(0))
    assert (chosen[:, 0] != chosen[:, 1]).all()
    first = np.bincount(chosen[:, 0], minlength=3) / 5000
    assert np.allclose(first, [0.7, 0.2, 0.1], atol=0.03)
    with pytest.raises(ValueError, match="choice_weights"):
        TimmRandAugment([TimmOp("Invert")], 2, choice_weights=[1.0])


def test_a_pipeline_with_timms_policy_plans_and_runs_in_the_loader_engines():
    """The policy is an augmentation of the pipeline: planned per batch, executed by the native and PIL engines
    alike (the same pixels; test_augment_warp.py holds the bicubic warp to PIL)."""
    from fastload._augment.engine_native import run_native
    from fastload._augment.engine_pil import run_pil

    ra = TimmRandAugment([TimmOp(n, 0.5, 9, magnitude_std=0.5, fill=FILL) for n in
                          ("SolarizeAdd", "Rotate", "PosterizeIncreasing", "SharpnessIncreasing", "TranslateYRel")], 2)
    p = T.ImagePipeline([T.RandomResizedCrop(24), ra])
    assert p.augment == (ra,) or list(p.augment) == [ra]
    rng = np.random.default_rng(0)
    tiles = rng.integers(0, 256, (16, 24, 24, 3), dtype=np.uint8)
    b = PlanBuilder(np.tile([24, 24], (16, 1)))
    ra.plan(b, np.arange(16), SampleDraws(1, 0, np.arange(16)))
    plan = b.finish()
    out = run_native(tiles.copy(), plan)
    for k in range(16):
        assert np.array_equal(out[k], run_pil(tiles[k], plan, k)), k


def test_the_torch_engine_runs_the_bicubic_affine_and_solarize_add_as_pil():
    """The GPU decoders run the plan with the batched torch engine: PIL's bicubic transform (float64 gathers) and
    the solarize_add table give PIL's bytes there too."""
    import torch

    from fastload._augment.engine_pil import run_pil
    from fastload._augment.engine_torch import run_torch

    ra = TimmRandAugment([TimmOp(n, 1.0, 9, magnitude_std=1.0, interpolation=BICUBIC, fill=FILL)
                          for n in ("Rotate", "ShearX", "TranslateYRel", "SolarizeAdd")], 2)
    rng = np.random.default_rng(2)
    tiles = rng.integers(0, 256, (24, 20, 28, 3), dtype=np.uint8)
    b = PlanBuilder(np.tile([20, 28], (24, 1)))
    ra.plan(b, np.arange(24), SampleDraws(4, 0, np.arange(24)))
    plan = b.finish()
    assert (plan.geometry.interpolation[plan.geometry.has_affine] == BICUBIC).all() and plan.geometry.has_affine.sum() > 10
    out = run_torch(torch.from_numpy(tiles).permute(0, 3, 1, 2).contiguous(), plan, flips=False)
    for k in range(24):
        assert np.array_equal(out[k].permute(1, 2, 0).numpy(), run_pil(tiles[k], plan, k)), k


def test_a_policys_repr_names_its_ops_without_every_setting():
    """The folder fast-path warning quotes the pipeline: a policy says its ops by name, not 15 settings dicts."""
    names = ["AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd", "Color",
             "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"]
    ra = TimmRandAugment([TimmOp(n, magnitude=9, magnitude_std=0.5) for n in names], 2)
    text = repr(ra)
    assert all(f"'{n}'" in text for n in names) and "num_layers=2" in text and len(text) < 1000, text
    aa = repr(TimmAutoAugment([[TimmOp("Rotate"), TimmOp("Invert")], [TimmOp("Equalize")]]))
    assert aa == "TimmAutoAugment(2 sub-policies: [['Rotate', 'Invert'], ['Equalize']])"


@pytest.mark.parametrize("policy", [
    TimmRandAugment([TimmOp(n, 0.5, 9, magnitude_std=0.5) for n in ("SolarizeAdd", "Invert", "Posterize")], 2),
    TimmAutoAugment([[TimmOp("SolarizeAdd", 0.6, 5, magnitude_std=1.0), TimmOp("Posterize", 0.7, 4, magnitude_std=1.0)],
                     [TimmOp("Invert", 0.5)]]),
], ids=["RandAugment", "AutoAugment"])
def test_a_policy_planned_for_part_of_the_batch_draws_each_samples_own_values(policy):
    """Inside RandomApply (or any transform that plans it for a subset) a sample draws what it draws in any other
    batch: the policy drew its ops' values from the positions within the subset instead of the batch's, so sample
    ``index[r]`` took sample ``r``'s draws."""
    def plan(indices):
        b = PlanBuilder(np.tile([8, 8], (len(indices), 1)))
        T.RandomApply([policy], p=0.5).plan(b, np.arange(len(indices)), SampleDraws(3, 0, indices))
        return {(s.op, int(indices[i]), tuple((k, float(v[j])) for k, v in sorted(s.params.items())))
                for s in b.finish().steps for j, i in enumerate(s.index)}

    sub = np.array([150, 3, 77, 12, 199, 40, 41, 42, 120, 121, 7])
    alone = plan(sub)
    in_a_batch = {x for x in plan(np.arange(200)) if x[1] in set(sub.tolist())}
    assert alone and alone == in_a_batch


def test_posterize_increasing_past_magnitude_10_keeps_no_bit_as_pil():
    """timm's 4 - int(m / 10 * 4) goes below 0 with mmax > 10 ('rand-m15-mmax20-inc1'): PIL's posterize mask then
    clears every bit, as at 0 bits; the plan passed the negative count to the kernel, which refused the batch."""
    from fastload._augment.engine_native import run_native

    for m in (12.5, 15.0, 20.0):
        plan = plan_one("PosterizeIncreasing", m, magnitude_max=20.0)
        (s,) = plan.steps
        assert s.params["bits"][0] == 0
        tile = np.random.default_rng(0).integers(0, 256, (1, 40, 60, 3), dtype=np.uint8)
        assert not run_native(tile, plan).any()


def test_rotate_rounds_its_matrix_as_pil():
    """PIL's rotate rounds cos/sin with Python's round(x, 15); numpy's round can end on the other 15th decimal
    (sin of -45 degrees: -0.707106781186548 for PIL's -0.707106781186547), which moved pixels by a level."""
    import math

    for m, negate in ((15.0, False), (15.0, True), (9.1, False), (4.457, False), (9.997, True)):
        g = plan_one("Rotate", m, negate=negate, hw=(40, 60), magnitude_max=20.0, interpolation=BILINEAR).geometry
        degrees = (m / 10.0) * 30.0 * (-1 if negate else 1)  # timm's _rotate_level_to_arg
        angle = -math.radians(degrees % 360.0)
        cos, sin = round(math.cos(angle), 15), round(math.sin(angle), 15)
        assert g.affine[0][0, 0] == cos and g.affine[0][0, 1] == sin and g.affine[0][1, 0] == -sin, m
