"""fastload.transforms: plans checked against scalar copies of torchvision's arithmetic."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from fastload._transforms.geometric import _rrc_params
from fastload.transforms import (
    CenterCrop,
    Compose,
    ImagePipeline,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    apply_pil,
)

# ---------------------------------------------------------------- torchvision references (scalar)


def tv_rrc_params(height, width, scale, ratio, rnd: random.Random):
    """torchvision.transforms.RandomResizedCrop.get_params, with Python's random; + fell_back flag."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rnd.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rnd.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = rnd.randrange(0, height - h + 1)
            j = rnd.randrange(0, width - w + 1)
            return i, j, h, w, False
    return (*tv_rrc_fallback(height, width, ratio), True)


def tv_rrc_fallback(height, width, ratio):
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w = width
        h = height
    return (height - h) // 2, (width - w) // 2, h, w


def tv_resized_size(h, w, size, max_size=None):
    """torchvision.transforms.functional._compute_resized_output_size -> [new_h, new_w]."""
    if isinstance(size, int):
        size = [size]
    if len(size) == 2:
        return list(size)
    short, long = (w, h) if w <= h else (h, w)
    requested_new_short = size[0]
    new_short, new_long = requested_new_short, int(requested_new_short * long / short)
    if max_size is not None and new_long > max_size:
        new_short, new_long = int(max_size * new_short / new_long), max_size
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    return [new_h, new_w]


def tv_center_crop_box(h, w, ch, cw):
    return int(round((h - ch) / 2.0)), int(round((w - cw) / 2.0)), ch, cw


def ks_stat(a, b) -> float:
    """Two-sample Kolmogorov-Smirnov statistic sup |F_a - F_b|."""
    a, b = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    grid = np.concatenate([a, b])
    fa = np.searchsorted(a, grid, side="right") / a.size
    fb = np.searchsorted(b, grid, side="right") / b.size
    return float(np.abs(fa - fb).max())


def smooth_image(h, w, seed=0) -> Image.Image:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(max(2, h // 24), max(2, w // 24), 3), dtype=np.uint8)
    return Image.fromarray(small).resize((w, h), Image.Resampling.BICUBIC)


def full(n, v):
    return np.full(n, v, dtype=np.int64)


# ---------------------------------------------------------------- RandomResizedCrop


@pytest.mark.parametrize(
    "hw,scale,ratio",
    [
        ((224, 224), (0.08, 1.0), (3 / 4, 4 / 3)),
        ((480, 640), (0.08, 1.0), (3 / 4, 4 / 3)),
        ((333, 500), (0.35, 1.0), (0.5, 2.0)),
        ((1000, 60), (0.08, 1.0), (3 / 4, 4 / 3)),  # very tall: the fallback fires often
        ((40, 1500), (0.08, 1.0), (3 / 4, 4 / 3)),  # very wide
        ((9, 7), (0.08, 1.0), (3 / 4, 4 / 3)),  # tiny: rounding matters
    ],
)
def test_rrc_distribution_matches_torchvision(hw, scale, ratio):
    n = 20_000
    H, W = hw
    rnd = random.Random(1234)
    ref = np.array([tv_rrc_params(H, W, scale, ratio, rnd) for _ in range(n)], dtype=np.int64)
    top, left, h, w, fb = _rrc_params(full(n, H), full(n, W), scale, ratio, np.random.default_rng(99))
    ours = np.stack([top, left, h, w, fb], axis=1).astype(np.int64)
    crit = 1.95 * math.sqrt(2 / n)  # alpha = 0.001
    stats = {
        "area": lambda a: a[:, 2] * a[:, 3] / (H * W),
        "aspect": lambda a: a[:, 3] / a[:, 2],
        "top": lambda a: a[:, 0],
        "left": lambda a: a[:, 1],
        "centre_y": lambda a: a[:, 0] + a[:, 2] / 2,
    }
    for name, f in stats.items():
        d = ks_stat(f(ref), f(ours))
        assert d < crit, f"{name}: KS {d:.4f} >= {crit:.4f} for {hw}"
    p_ref, p_ours = ref[:, 4].mean(), ours[:, 4].mean()
    pooled = (p_ref + p_ours) / 2
    assert abs(p_ref - p_ours) <= 4 * math.sqrt(pooled * (1 - pooled) * 2 / n) + 1e-9, (p_ref, p_ours)
    # Whatever the draws, fallback rows are exactly torchvision's centre crop.
    for row in ours[ours[:, 4] == 1][:50]:
        assert tuple(row[:4]) == tv_rrc_fallback(H, W, ratio)


def test_rrc_replays_torchvision_loop_on_the_same_draws():
    # The documented draw order: (n, 10) area uniforms, (n, 10) ratio uniforms, then tops, then lefts.
    rng = np.random.default_rng(11)
    H, W = rng.integers(1, 800, 3000), rng.integers(1, 800, 3000)
    H[:300] = 2000  # elongated rows: fallbacks and late first hits
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    top, left, h, w, fb = _rrc_params(H, W, scale, ratio, np.random.default_rng(5))
    replay = np.random.default_rng(5)
    ua, ur = replay.random((H.size, 10)), replay.random((H.size, 10))
    exp_h, exp_w, exp_fb = [], [], []
    for k in range(H.size):
        for a in range(10):
            area = H[k] * W[k] * (scale[0] + (scale[1] - scale[0]) * ua[k, a])
            lo, hi = math.log(ratio[0]), math.log(ratio[1])
            aspect = math.exp(lo + (hi - lo) * ur[k, a])
            cw, ch = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
            if 0 < cw <= W[k] and 0 < ch <= H[k]:
                exp_h.append(ch), exp_w.append(cw), exp_fb.append(False)
                break
        else:
            _, _, ch, cw = tv_rrc_fallback(int(H[k]), int(W[k]), ratio)
            exp_h.append(ch), exp_w.append(cw), exp_fb.append(True)
    np.testing.assert_array_equal(h, exp_h)
    np.testing.assert_array_equal(w, exp_w)
    np.testing.assert_array_equal(fb, exp_fb)
    assert 0.02 < fb.mean() < 0.2
    exp_top = np.where(fb, (H - h) // 2, replay.integers(0, H - h + 1))
    exp_left = np.where(fb, (W - w) // 2, replay.integers(0, W - w + 1))
    np.testing.assert_array_equal(top, exp_top)
    np.testing.assert_array_equal(left, exp_left)


def test_rrc_fallback_exact_on_crafted_sizes():
    # scale >= 2 never fits, so every sample takes the fallback.
    sizes = [(h, w) for h in (1, 2, 3, 7, 10, 99, 100, 101, 224, 375, 500, 1000, 4001)
             for w in (1, 2, 3, 5, 10, 75, 100, 133, 224, 333, 500, 999, 3000)]
    H = np.array([s[0] for s in sizes])
    W = np.array([s[1] for s in sizes])
    for ratio in [(3 / 4, 4 / 3), (0.5, 2.0), (1.0, 1.0), (0.3, 0.9), (1.5, 3.0)]:
        pipe = ImagePipeline([RandomResizedCrop((32, 48), scale=(2, 3), ratio=ratio)])
        plan = pipe.plan(H, W, np.random.default_rng(0))
        expected = np.array([tv_rrc_fallback(h, w, ratio) for h, w in sizes])
        np.testing.assert_array_equal(plan.crops, expected, err_msg=f"ratio={ratio}")
        assert (plan.out_hw == [32, 48]).all()


def test_rrc_after_resize_maps_back_to_source():
    # Fallback after Resize(100): the centre box in resized pixels, scaled back, within half a pixel.
    H = np.array([300, 1000, 57, 640, 1200])
    W = np.array([1000, 300, 230, 480, 64])
    ratio = (3 / 4, 4 / 3)
    plan = ImagePipeline([Resize(100), RandomResizedCrop(50, scale=(2, 3), ratio=ratio)]).plan(
        H, W, np.random.default_rng(0))
    for k, (h, w) in enumerate(zip(H, W)):
        rh, rw = tv_resized_size(h, w, 100)
        t, l, ch, cw = tv_rrc_fallback(rh, rw, ratio)
        sy, sx = h / rh, w / rw
        exp = np.array([t * sy, l * sx, (t + ch) * sy, (l + cw) * sx])
        top, left, bh, bw = plan.crops[k]
        got = np.array([top, left, top + bh, left + bw])
        assert np.abs(got - exp).max() <= 0.5 + 1e-9, (h, w, got, exp)


# ---------------------------------------------------------------- Resize / CenterCrop


def test_resize_sizes_match_torchvision():
    rng = np.random.default_rng(5)
    H = np.concatenate([rng.integers(1, 5000, 2000), [1, 1, 7, 256, 256, 4000, 3]])
    W = np.concatenate([rng.integers(1, 5000, 2000), [1, 9000, 7, 256, 255, 3, 4000]])
    cases = [(256, None), (224, None), ([160], None), ((100, 300), None), (256, 400), (32, 33), (600, 601)]
    for size, max_size in cases:
        pipe = ImagePipeline([Resize(size, max_size=max_size)])
        if max_size is not None:  # extreme aspect + max_size can make an empty side: torchvision too
            keep = [min(tv_resized_size(h, w, size, max_size)) > 0 for h, w in zip(H, W)]
            h_, w_ = H[keep], W[keep]
        else:
            h_, w_ = H, W
        plan = pipe.plan(h_, w_, np.random.default_rng(0))
        exp = np.array([tv_resized_size(int(h), int(w), size, max_size) for h, w in zip(h_, w_)])
        np.testing.assert_array_equal(plan.out_hw, exp, err_msg=f"size={size} max_size={max_size}")
        np.testing.assert_array_equal(plan.crops, np.stack([0 * h_, 0 * w_, h_, w_], 1))
        assert (plan.flips == 0).all()


def test_resize_validation():
    with pytest.raises(ValueError, match="max_size"):
        Resize(256, max_size=256)
    with pytest.raises(ValueError, match="max_size"):
        Resize((256, 300), max_size=1000)
    with pytest.raises(ValueError, match="bilinear"):
        Resize(256, interpolation="nearest")
    with pytest.raises(ValueError, match="antialias"):
        Resize(256, antialias=False)
    with pytest.raises(ValueError, match="positive"):
        Resize(0)
    with pytest.raises(TypeError):
        CenterCrop("224")
    with pytest.raises(ValueError, match="scale"):
        RandomResizedCrop(224, scale=(1.0, 0.5))
    with pytest.raises(ValueError, match="0x33"):  # 1x10000: new_short = int(33 * 32 / 320000) == 0
        ImagePipeline([Resize(32, max_size=33)]).plan(np.array([1]), np.array([10000]), None)


def test_center_crop_exact_without_resize():
    rng = np.random.default_rng(3)
    H, W = rng.integers(224, 900, 500), rng.integers(224, 900, 500)
    for size in (224, (224, 160), [200]):
        ch, cw = (size, size) if isinstance(size, int) else (size[0], size[-1])
        plan = ImagePipeline([CenterCrop(size)]).plan(H, W, None)
        exp = np.array([tv_center_crop_box(h, w, ch, cw) for h, w in zip(H, W)])
        np.testing.assert_array_equal(plan.crops, exp)
        assert (plan.out_hw == [ch, cw]).all()


def test_resize_then_center_crop_within_half_pixel():
    rng = np.random.default_rng(4)
    H = np.concatenate([rng.integers(20, 3000, 3000), [256, 300, 255, 4000]])
    W = np.concatenate([rng.integers(20, 3000, 3000), [256, 256, 3000, 30]])
    for resize, crop, max_size in [(256, 224, None), (232, 224, None), ((300, 250), (200, 240), None),
                                   (256, 224, 600)]:
        pipe = ImagePipeline([Resize(resize, max_size=max_size), CenterCrop(crop)])
        ch, cw = (crop, crop) if isinstance(crop, int) else crop
        sizes = [(h, w, tv_resized_size(int(h), int(w), resize, max_size)) for h, w in zip(H, W)]
        sizes = [s for s in sizes if s[2][0] >= ch and s[2][1] >= cw]
        h_ = np.array([s[0] for s in sizes])
        w_ = np.array([s[1] for s in sizes])
        plan = pipe.plan(h_, w_, None)
        assert (plan.out_hw == [ch, cw]).all()
        for k, (h, w, (rh, rw)) in enumerate(sizes):
            t, l, _, _ = tv_center_crop_box(rh, rw, ch, cw)
            sy, sx = h / rh, w / rw
            exp = np.array([t * sy, l * sx, (t + ch) * sy, (l + cw) * sx])
            top, left, bh, bw = plan.crops[k]
            got = np.array([top, left, top + bh, left + bw])
            assert np.abs(got - exp).max() <= 0.5 + 1e-9, (h, w, got, exp)


def test_center_crop_larger_than_the_image_pads_as_torchvision():
    """torchvision's F.center_crop pads (crop - size) // 2 before and the rest after, then crops at 0 on that
    axis: a padded window whose box is the whole image (that axis) and whose index map puts it there."""
    plan = ImagePipeline([CenterCrop(224)]).plan(np.array([300, 200]), np.array([300, 301]), None)
    assert (plan.out_hw == [224, 224]).all()
    pad = plan.augment.geometry.pad
    assert list(pad.active) == [False, True]
    np.testing.assert_array_equal(plan.crops[1], [0, 38, 200, 224])  # rows: all 200; cols: round(77 / 2) = 38
    rows = pad.rows[1]
    assert (rows[:12] == -1).all() and (rows[12:212] == np.arange(200)).all() and (rows[212:] == -1).all()
    assert (pad.cols[1] == np.arange(224)).all() and (pad.fill[1] == 0).all() and pad.mask_fill[1] == 0


def test_center_crop_that_would_pad_before_a_resize_raises_with_sizes():
    with pytest.raises(ValueError, match=r"224x224.*Resize.*follows it.*sample 1 of the batch is 200x300.*Resize of "
                                         r"at least the crop size"):
        ImagePipeline([CenterCrop(224), Resize(100)]).plan(np.array([300, 200]), np.array([300, 300]), None)


# ---------------------------------------------------------------- pixels: apply_pil


@pytest.mark.parametrize("hw", [(375, 500), (500, 333), (256, 256), (1024, 700)])
def test_apply_pil_matches_torchvision_resize_center_crop(hw):
    img = smooth_image(*hw)
    ours = np.asarray(apply_pil([Resize(256), CenterCrop(224)], img, np.random.default_rng(0)), float)
    # torchvision on PIL: img.resize((w, h), BILINEAR) then img.crop(box).
    rh, rw = tv_resized_size(hw[0], hw[1], 256)
    t, l, ch, cw = tv_center_crop_box(rh, rw, 224, 224)
    ref = img.resize((rw, rh), Image.Resampling.BILINEAR).crop((l, t, l + cw, t + ch))
    diff = np.abs(ours - np.asarray(ref, float))
    assert ours.shape == (224, 224, 3)
    assert diff.mean() < 2.0, diff.mean()


def test_apply_pil_executes_the_plan():
    img = smooth_image(300, 420, seed=2)
    pipe = ImagePipeline([Resize(280), RandomResizedCrop((96, 128)), RandomHorizontalFlip()])
    for seed in range(8):
        plan = pipe.plan(np.array([300]), np.array([420]), np.random.default_rng(seed))
        top, left, h, w = map(int, plan.crops[0])
        exp = img.crop((left, top, left + w, top + h)).resize((128, 96), Image.Resampling.BILINEAR)
        if plan.flips[0]:
            exp = exp.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        got = apply_pil(pipe, img, np.random.default_rng(seed))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(exp))


def test_flip_before_crop_mirrors_the_box():
    img = smooth_image(200, 301, seed=3)
    # torchvision: flip, then centre crop of the flipped image. Exact (no resize).
    ours = apply_pil([RandomHorizontalFlip(p=1.0), CenterCrop((150, 120))], img, np.random.default_rng(0))
    t, l, ch, cw = tv_center_crop_box(200, 301, 150, 120)
    ref = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT).crop((l, t, l + cw, t + ch))
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(ref))
    # A random crop chosen on the mirror is the mirrored box on the source.
    H, W = np.full(64, 400), np.full(64, 611)
    a = ImagePipeline([RandomHorizontalFlip(1.0), RandomResizedCrop(64)]).plan(H, W, np.random.default_rng(7))
    b = ImagePipeline([RandomResizedCrop(64), RandomHorizontalFlip(1.0)])
    # Same draws in a different order: flip-first draws its 64 uniforms first.
    rng = np.random.default_rng(7)
    rng.random(64)
    b = b.plan(H, W, rng)
    np.testing.assert_array_equal(a.crops[:, [0, 2, 3]], b.crops[:, [0, 2, 3]])
    np.testing.assert_array_equal(a.crops[:, 1], W - b.crops[:, 1] - b.crops[:, 3])
    assert a.flips.all() and b.flips.all()
    # Two flips cancel.
    two = ImagePipeline([RandomHorizontalFlip(1.0), RandomHorizontalFlip(1.0)]).plan(H, W, rng)
    assert not two.flips.any()


# ---------------------------------------------------------------- invariants, determinism, API

pipelines = st.sampled_from([
    [RandomResizedCrop(224), RandomHorizontalFlip()],
    [Resize(64), CenterCrop(56)],
    [Resize((80, 40)), RandomResizedCrop((16, 24), scale=(0.5, 1.0))],
    [RandomHorizontalFlip(0.3), Resize(50, max_size=90), RandomResizedCrop(32, ratio=(0.2, 5.0))],
    [Resize(10), CenterCrop((10, 7)), Resize(300)],
    [RandomResizedCrop(8, scale=(0.001, 0.01)), RandomHorizontalFlip(0.9)],
    [RandomResizedCrop(100), CenterCrop(60), RandomResizedCrop(20)],
    [RandomHorizontalFlip()],
])


@settings(max_examples=150, deadline=None)
@given(
    pipe=pipelines,
    sizes=st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 3000)), min_size=1, max_size=40),
    seed=st.integers(0, 2**32 - 1),
)
def test_plan_invariants(pipe, sizes, seed):
    p = ImagePipeline(pipe)
    H = np.array([s[0] for s in sizes])
    W = np.array([s[1] for s in sizes])
    if any(isinstance(t, Resize) and t.max_size for t in pipe):  # avoid 0-wide sides by construction
        keep = np.maximum(H, W) <= 50 * np.minimum(H, W)
        H, W = H[keep], W[keep]
    plan = p.plan(H, W, np.random.default_rng(seed))
    top, left, h, w = plan.crops.T
    assert plan.crops.dtype == np.int32 and plan.out_hw.dtype == np.int32 and plan.flips.dtype == np.uint8
    assert (h >= 1).all() and (w >= 1).all() and (top >= 0).all() and (left >= 0).all()
    assert (top + h <= H).all() and (left + w <= W).all()
    assert (plan.out_hw >= 1).all() and set(np.unique(plan.flips)) <= {0, 1}
    if p.output_size is not None:
        assert (plan.out_hw == p.output_size).all()
    again = p.plan(H, W, np.random.default_rng(seed))
    for x, y in zip(plan, again):
        np.testing.assert_array_equal(x, y)


def test_determinism_and_seed_sensitivity():
    p = ImagePipeline(Compose([RandomResizedCrop(224), RandomHorizontalFlip()]))
    H = np.arange(100, 356)
    W = np.arange(400, 144, -1)
    a = p.plan(H, W, np.random.default_rng(42))
    b = p.plan(H, W, np.random.default_rng(42))
    c = p.plan(H, W, np.random.default_rng(43))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.crops, c.crops)


@pytest.mark.parametrize("prob", [0.0, 0.3, 0.5, 1.0])
def test_flip_frequency(prob):
    n = 20_000
    pipe = ImagePipeline([RandomHorizontalFlip(prob)])
    plan = pipe.plan(full(n, 10), full(n, 20), np.random.default_rng(1))
    assert abs(plan.flips.mean() - prob) <= 4 * math.sqrt(prob * (1 - prob) / n) + 1e-12
    assert (plan.crops == [0, 0, 10, 20]).all() and (plan.out_hw == [10, 20]).all()


def test_output_size():
    assert ImagePipeline([RandomResizedCrop(224), RandomHorizontalFlip()]).output_size == (224, 224)
    assert ImagePipeline([Resize(256), CenterCrop((224, 200))]).output_size == (224, 200)
    assert ImagePipeline([Resize(256)]).output_size is None
    assert ImagePipeline([Resize((32, 64))]).output_size == (32, 64)
    assert ImagePipeline([CenterCrop((100, 50)), Resize(20)]).output_size == (40, 20)
    assert ImagePipeline([]).output_size is None
    assert ImagePipeline([RandomHorizontalFlip()]).output_size is None


def test_bad_transform_types():
    class Normalize:
        pass

    with pytest.raises(TypeError, match=r"Normalize.*RandomResizedCrop, Resize, CenterCrop"):
        ImagePipeline([Resize(256), Normalize()])
    with pytest.raises(TypeError, match="'foo'"):
        ImagePipeline(Compose([CenterCrop(3), "foo"]))
    with pytest.raises(TypeError, match="Compose"):
        ImagePipeline(42)
    with pytest.raises(TypeError, match="integer"):
        ImagePipeline([Resize(2)]).plan(np.array([1.5]), np.array([2.0]), None)
    with pytest.raises(ValueError, match="empty"):
        ImagePipeline([Resize(2)]).plan(np.array([0]), np.array([3]), None)


def test_compose_forms_are_equivalent():
    ts = [Resize(64), CenterCrop(48), RandomHorizontalFlip()]
    a = ImagePipeline(ts)
    assert a == ImagePipeline(Compose(ts)) == ImagePipeline([Compose(ts[:2]), ts[2]]) == ImagePipeline(a)
    assert a.describe()[0] == {"name": "Resize", "size": 64, "interpolation": "bilinear",
                               "max_size": None, "antialias": True}


def _identity(img):  # a callable fastload does not know: run per sample
    return img


def _identity_after(img):  # the same, after Normalize (on the float image)
    return img


def test_pipelines_that_differ_in_one_stage_are_unequal_and_read_differently():
    """Each stage, the tensor stage (ToDtype/Normalize) too, counts in ``==`` and shows in the repr: the repr tells
    two pipelines apart in fastload.mix's refusal (which printed two identical reprs when only a Normalize
    differed) and keys num_workers='auto''s cache."""
    import torch

    import fastload.transforms as T

    to_float = T.ToDtype(torch.float32, scale=True)
    base = [T.Resize(16), T.ColorJitter(0.2), _identity, to_float, T.Normalize([0.5] * 3, [0.5] * 3), _identity_after]
    variants = {
        "transforms": [T.Resize(17), *base[1:]],
        "augment": [base[0], T.ColorJitter(0.3), *base[2:]],
        "fallback": [*base[:2], lambda img: img, *base[3:]],
        "tensor": [*base[:4], T.Normalize([0.4] * 3, [0.5] * 3), base[5]],
        "after": [*base[:5], lambda img: img],
    }
    ref = ImagePipeline(base)
    assert ref == ImagePipeline(list(base)) and repr(ref) == repr(ImagePipeline(list(base)))
    assert "Normalize(mean=[0.5, 0.5, 0.5]" in repr(ref)
    for stage, ts in variants.items():
        other = ImagePipeline(ts)
        assert other != ref, stage
        if stage not in ("fallback", "after"):  # two callables of one name read alike (their names are all shown)
            assert repr(other) != repr(ref), stage


def test_reprs_match_torchvision():
    assert repr(RandomResizedCrop(224)) == (
        "RandomResizedCrop(size=(224, 224), scale=(0.08, 1.0), ratio=(0.75, 1.3333), "
        "interpolation=bilinear, antialias=True)")
    assert repr(Resize(256)) == "Resize(size=256, interpolation=bilinear, max_size=None, antialias=True)"
    assert repr(CenterCrop(224)) == "CenterCrop(size=(224, 224))"
    assert repr(RandomHorizontalFlip()) == "RandomHorizontalFlip(p=0.5)"
    assert repr(Compose([CenterCrop(2), RandomHorizontalFlip()])) == (
        "Compose(\n    CenterCrop(size=(2, 2))\n    RandomHorizontalFlip(p=0.5)\n)")

    class Mode:  # torchvision's InterpolationMode.BILINEAR has .value == "bilinear"
        value = "bilinear"

    assert Resize(8, interpolation=Mode()) == Resize(8)
