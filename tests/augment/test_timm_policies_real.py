"""timm's RandAugment / AutoAugment planned natively (``fastload/_augment/timm_policies.py``) against timm's own
objects (issue 30 item 1); skipped where timm does not import (CI: see test_timm_real.py for the test-only venv).

Two checks. On forced draws: each of timm's ops, called by timm (its ``AugmentOp`` with the magnitude, sign and
interpolation fixed by standing in for its ``random``), against fastload's plan of the same op with the same draws
run by the native engine and by the PIL reference engine: equal, or within the bound the project holds PIL's
``ImageEnhance``/``ImageOps`` to (tests/augment/test_augment_engines.py). Over many samples: the distribution of
the ops timm calls and of their arguments (timm's own ``random``, recorded) against fastload's plans (its
per-sample draws)."""

from __future__ import annotations

import collections
import random

import numpy as np
import pytest

import fastload.transforms as T
from fastload._augment.engine_native import run_native
from fastload._augment.engine_pil import run_pil
from fastload._augment.plan import PlanBuilder
from fastload._augment.timm_convert import convert
from fastload._augment.timm_policies import TimmAutoAugment, TimmRandAugment
from fastload._draws import SampleDraws

aa = pytest.importorskip("timm.data.auto_augment", reason="timm is not importable here (bash scripts/timm_test_venv.sh)")
from PIL import Image  # noqa: E402
from timm.data import create_transform  # noqa: E402

H, W = 40, 56
MEAN_FILL = (124, 116, 104)  # timm's img_mean for ImageNet's mean

#: the bound of each op against PIL, (max, mean) levels per tile: 0 where the arithmetic is PIL's (colour and
#: contrast too: pil_enhance.py); autocontrast's scale and offset round at integer boundaries now and then
#: (tests/augment/test_augment_engines.py's table)
BOUND = collections.defaultdict(lambda: (0, 0.0), {"AutoContrast": (1, 0.01)})


def tiles(n, seed=0):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:H, 0:W]
    base = np.stack([x * 255 / W, y * 255 / H, 128 + 90 * np.sin((x + y) / 4.0)], -1)
    return np.stack([np.clip(base + rng.normal(0, 30, base.shape), 0, 255) for _ in range(n)]).astype(np.uint8)


class Forced:
    """Stands for ``random`` in timm's auto_augment for one op call: the sign and the interpolation given."""

    def __init__(self, negate, bicubic):
        self.negate, self.bicubic = negate, bicubic

    def random(self):  # _randomly_negate: -v when random() > 0.5 (the op's prob is 1: no other random() call)
        return 0.9 if self.negate else 0.1

    def choice(self, seq):
        (mode,) = [m for m in seq if int(m) == (3 if self.bicubic else 2)]
        return mode


OPS = sorted(set(aa._RAND_TRANSFORMS) | set(aa._RAND_INCREASING_TRANSFORMS) | {"PosterizeOriginal", "TranslateX",
                                                                                   "TranslateY"})


@pytest.mark.parametrize("interpolation", ["random", "bicubic", "bilinear"])
@pytest.mark.parametrize("name", OPS)
def test_each_op_is_timms_on_the_same_draws(monkeypatch, name, interpolation):
    hparams = dict(translate_const=100, img_mean=MEAN_FILL, magnitude_max=20)  # rand-...-mmax20: up to m 20
    if interpolation != "random":
        hparams["interpolation"] = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR}[
            interpolation]
    cases = [(m, neg, bic) for m in (0.0, 3.3, 7.0, 9.0, 10.0, 15.0, 20.0) for neg in (False, True)
             for bic in (False, True)]
    imgs = tiles(len(cases))
    timm_op = aa.AugmentOp(name, prob=1.0, magnitude=10, hparams=hparams)
    (ours,) = convert(aa.RandAugment([timm_op], 1), T)
    assert type(ours) is TimmRandAugment
    (op,) = ours.ops
    b = PlanBuilder(np.tile([H, W], (len(cases), 1)))
    for k, (m, neg, bic) in enumerate(cases):
        op.apply(b, np.array([k]), np.array([m]), np.array([neg]), np.array([bic]))
    plan = b.finish()
    native = run_native(imgs.copy(), plan)
    for k, (m, neg, bic) in enumerate(cases):
        monkeypatch.setattr(aa, "random", Forced(neg, bic))
        timm_op.magnitude = m
        theirs = np.asarray(timm_op(Image.fromarray(imgs[k]))).astype(np.int32)
        bound_max, bound_mean = BOUND[name]
        for engine, got in (("native", native[k]), ("pil", run_pil(imgs[k], plan, k))):
            d = np.abs(np.asarray(got).astype(np.int32) - theirs)
            assert d.max() <= bound_max and d.mean() <= bound_mean, (engine, name, m, neg, bic, d.max(), d.mean())


def record(policy_ops):
    """Replace each timm op's pixel function by a recorder of (name, args); returns the list it appends to."""
    calls = []
    for op in policy_ops:
        op.aug_fn = lambda img, *args, _n=op.name, **kw: calls.append((_n, args, kw.get("resample"))) or img
    return calls


#: fastload's plan step of each timm op (the geometric ones become the sample's affine)
STEP = {"AutoContrast": "autocontrast", "Equalize": "equalize", "Invert": "invert", "PosterizeIncreasing": "posterize",
        "SolarizeIncreasing": "solarize", "SolarizeAdd": "solarize_add", "ColorIncreasing": "pil_color",
        "ContrastIncreasing": "pil_contrast", "BrightnessIncreasing": "brightness", "SharpnessIncreasing": "sharpness",
        "Posterize": "posterize", "Solarize": "solarize", "Color": "pil_color", "Contrast": "pil_contrast",
        "Brightness": "brightness", "Sharpness": "sharpness", "PosterizeOriginal": "posterize"}
PARAM = {"posterize": "bits", "solarize": "threshold", "solarize_add": "add", "pil_color": "factor",
         "pil_contrast": "factor", "brightness": "factor", "sharpness": "factor"}


def compare(policy, calls_of_timm, n):
    """Counts and mean arguments of each pixel op, and the number of samples with a geometric op, timm's vs
    fastload's plan of ``n`` samples: within 4.5 binomial standard deviations / 5 standard errors."""
    (ours,) = convert(policy, T)
    plan = T.ImagePipeline([ours]).augment[0]
    b = PlanBuilder(np.tile([H, W], (n, 1)))
    plan.plan(b, np.arange(n), SampleDraws(5, 0, np.arange(n)))
    built = b.finish()
    theirs = collections.defaultdict(list)
    geometric = 0  # samples with at least one geometric op
    in_sample = False
    for name, args, _ in calls_of_timm:
        if name == "|":
            geometric += in_sample
            in_sample = False
        elif name in STEP:
            theirs[STEP[name]].append(float(args[0]) if args else 0.0)
        else:
            in_sample = True
    mine = collections.defaultdict(list)
    for step in built.steps:
        col = PARAM.get(step.op)
        mine[step.op].extend(step.params[col].astype(float).tolist() if col else [0.0] * step.index.size)
    for op in set(theirs) | set(mine):
        a, c = len(theirs[op]), len(mine[op])
        sd = np.sqrt(max(a, 1) * (1 - a / (n * 2)))
        assert abs(a - c) <= 4.5 * sd + 3, (op, a, c)
        if a > 50 and np.std(theirs[op]) > 0:
            se = np.std(theirs[op]) * np.sqrt(1 / a + 1 / c)
            assert abs(np.mean(theirs[op]) - np.mean(mine[op])) <= 5 * se + 1e-9, (op, np.mean(theirs[op]),
                                                                                    np.mean(mine[op]))
    affine = int(built.geometry.has_affine.sum())  # samples with any geometric op (composed into one map)
    assert abs(affine - geometric) <= 4.5 * np.sqrt(max(geometric, 1)) + 3, (affine, geometric)


@pytest.mark.parametrize("config", ["rand-m9-mstd0.5-inc1", "rand-m7-n3-mstd101", "rand-m9-mstd0.5-mmax15"])
def test_rand_augments_distribution_of_ops_and_arguments_is_timms(config):
    n = 6000
    timm_ra = aa.rand_augment_transform(config, dict(translate_const=100, img_mean=MEAN_FILL))
    calls = record(timm_ra.ops)
    random.seed(0)
    np.random.seed(0)
    img = Image.new("RGB", (8, 8))
    for _ in range(n):
        timm_ra(img)
        calls.append(("|", (), None))  # the end of a sample's calls
    compare(timm_ra, calls, n)


@pytest.mark.parametrize("name", ["original", "originalr", "v0", "v0r"])
def test_auto_augments_distribution_of_ops_and_arguments_is_timms(name):
    n = 6000
    timm_aa = aa.auto_augment_transform(name, dict(translate_const=100, img_mean=MEAN_FILL))
    calls = record([op for sub in timm_aa.policy for op in sub])
    random.seed(1)
    img = Image.new("RGB", (8, 8))
    for _ in range(n):
        timm_aa(img)
        calls.append(("|", (), None))
    (ours,) = convert(timm_aa, T)
    assert type(ours) is TimmAutoAugment
    compare(timm_aa, calls, n)


def test_the_deit_recipe_is_native_end_to_end():
    """create_transform(224, is_training=True, auto_augment='rand-m9-mstd0.5-inc1', re_prob=0.25,
    interpolation='bicubic'): crop (bicubic), flip, timm's RandAugment, erasing: no transform runs per sample."""
    p = T.ImagePipeline(create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25,
                                         interpolation="bicubic"))
    assert not p.fallback and not p.after, (p.fallback, p.after)
    assert p.transforms[0].interpolation == "bicubic"
    assert [type(t) for t in p.augment] == [TimmRandAugment, T.RandomErasing]
    ops = p.augment[0].ops
    assert len(ops) == 15 and {op.name for op in ops} == set(aa._RAND_INCREASING_TRANSFORMS)
    assert all(op.magnitude == 9 and op.magnitude_std == 0.5 and op.prob == 0.5 for op in ops)
    assert all(op.fill == MEAN_FILL and op.interpolation == 2 for op in ops)  # bicubic


def test_augmix_and_3a_stay_per_sample_saying_why():
    (augmix,) = convert(aa.augment_and_mix_transform("augmix-m5-w3-d2", dict(translate_const=100)), T)
    assert "blends several augmented copies" in augmix.reason
    (three,) = convert(aa.auto_augment_transform("3a", dict(translate_const=100)), T)
    assert "no native plan" in three.reason and "GaussianBlur" in three.reason


class Replayed(random.Random):
    """Stands for ``random`` in timm's auto_augment: ``random()`` hands out the given uniforms in order (Python's
    ``uniform`` and ``gauss`` call it), and fails when timm asks for more than one op call's draws."""

    def __init__(self, values):
        super().__init__(0)
        self.values = list(values)

    def random(self):
        return self.values.pop(0)


@pytest.mark.parametrize("std", [0.0, 0.5, 3.0, float("inf"), float("-inf"), -0.5])
def test_magnitude_noise_is_timms_draw_for_draw(monkeypatch, std):
    """timm's ``AugmentOp.__call__`` on the uniforms fastload's plan drew for the same calls: the same magnitude,
    clipped to ``[0, magnitude_max]``. timm draws noise only for ``magnitude_std > 0`` (``inf``: ``uniform(0, m)``
    from one uniform; else ``gauss(m, std)`` from two, angle first); 0, negative and ``-inf`` add none."""
    timm_op = aa.AugmentOp("SolarizeAdd", prob=1.0, magnitude=9,
                           hparams=dict(img_mean=MEAN_FILL, magnitude_std=std, magnitude_max=15))
    (ours,) = convert(aa.RandAugment([timm_op], 1), T)
    (op,) = ours.ops
    noise = np.random.default_rng(0).random((400, 2))
    mine = op.magnitudes(noise)
    seen = []
    timm_op.level_fn = lambda magnitude, _hparams: seen.append(magnitude) or ()
    timm_op.aug_fn = lambda img, *args, **kw: img
    for u0, u1 in noise.tolist():
        # fastload's noise: uniform from the first column; normal sqrt(-2 log(1 - u0)) cos(2 pi u1)
        replay = Replayed([u0] if std == float("inf") else [u1, u0] if std > 0 else [])
        monkeypatch.setattr(aa, "random", replay)
        timm_op(None)
        assert not replay.values, "timm drew fewer uniforms than fastload's noise holds"
    theirs = np.array(seen)
    # log(1 - u) in Python, log1p(-u) in numpy: the same magnitude to a few ulps
    np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-12)
    assert (np.unique(theirs).size == 1) == (not std > 0)
    if std > 0:
        assert theirs.max() <= 15
        assert (theirs.max() == 15) == (std == 3.0)  # N(9, 3) clipped at magnitude_max 15, not at 10
