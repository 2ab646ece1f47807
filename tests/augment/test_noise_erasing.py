"""Erasing with noise after Normalize (``fastload/_augment/noise_erasing.py``, issue 30 item 1): timm's
RandomErasing in modes const/rand/pixel with several boxes, torchvision's ``value='random'``.

The boxes are checked against a transcription of timm 1.0's ``RandomErasing._erase`` fed the same uniforms
(tests/augment/test_timm_real.py does the same against timm's own object where timm imports); the noise by its
statistics (fixed seeds: the bounds are many standard errors wide and the values are fixed, so never flaky).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import fastload
import fastload.transforms as T
from fastload._augment.noise_erasing import ErasePlan, NoiseErasing
from fastload._draws import SampleDraws
from test_timm_convert import MEAN, STD, Erasing
from test_torchvision_convert import V1, tv

LOG_RATIO = (math.log(0.3), math.log(1 / 0.3))


class Replay:
    """Python's ``random`` for timm's ``_erase`` on one image, handing out the draws fastload made: ``random`` the
    probability's uniform, ``randint`` the count then each found box's top and left (fastload's), ``uniform`` each
    attempt's area and aspect uniforms (``a + (b - a) * u``, Python's formula) in timm's order."""

    def __init__(self, u_p, count, u_area, u_aspect, boxes):
        self.u_p, self.count, self.u_area, self.u_aspect, self.boxes = u_p, count, u_area, u_aspect, boxes
        self.box, self.attempt, self.area_next, self.ints = 0, 0, True, []

    def random(self):
        return self.u_p

    def uniform(self, a, b):
        if self.area_next:
            if self.attempt == 10:  # every attempt failed: timm goes on with the next box
                self.box, self.attempt = self.box + 1, 0
            u = self.u_area[self.box, self.attempt]
        else:
            u = self.u_aspect[self.box, self.attempt]
            self.attempt += 1
        self.area_next = not self.area_next
        return a + (b - a) * u

    def randint(self, a, b):
        if self.count is not None:  # the first randint is the count
            v, self.count = self.count, None
        elif not self.ints:  # a box was found: its top, then its left
            top, left = (int(v) for v in self.boxes[self.box, :2])
            v, self.ints = top, [left]
        else:
            v = self.ints.pop()
            self.box, self.attempt = self.box + 1, 0
        assert a <= v <= b, (a, v, b)
        return v


def timm_erase(img, random, probability, min_area, max_area, log_aspect_ratio, min_count, max_count):
    """timm 1.0's ``RandomErasing._erase`` (timm/data/random_erasing.py) drawing from ``random``, each box painted
    with its number (1, 2, ...) so that the boxes can be compared, later ones over earlier ones."""
    chan, img_h, img_w = img.shape
    if random.random() > probability:
        return
    area = img_h * img_w
    count = min_count if min_count == max_count else random.randint(min_count, max_count)
    for b in range(count):
        for attempt in range(10):
            target_area = random.uniform(min_area, max_area) * area / count
            aspect_ratio = math.exp(random.uniform(*log_aspect_ratio))
            h = int(round(math.sqrt(target_area * aspect_ratio)))
            w = int(round(math.sqrt(target_area / aspect_ratio)))
            if w < img_w and h < img_h:
                top = random.randint(0, img_h - h)
                left = random.randint(0, img_w - w)
                img[:, top : top + h, left : left + w] = b + 1
                break


def painted(plan, k, h, w):
    out = torch.zeros((1, h, w))
    for j, (top, left, bh, bw) in enumerate(plan.boxes[k]):
        out[:, top : top + bh, left : left + bw] = j + 1
    return out


@pytest.mark.parametrize("count", [(1, 1), (1, 3), (2, 2)])
@pytest.mark.parametrize("area", [(0.02, 1 / 3), (0.3, 0.9)], ids=["timm's", "large"])
def test_the_boxes_are_timms_on_the_same_draws(count, area):
    """400 images of random sizes (large areas make attempts fail, so later attempts and boxes without any are
    taken too): fastload's boxes against timm's ``_erase`` given the same uniforms, box for box."""
    gen = np.random.default_rng(3)
    n = 400
    hw = np.stack([gen.integers(4, 80, n), gen.integers(4, 80, n)], axis=1)
    e = NoiseErasing(0.7, area, LOG_RATIO, "pixel", count)
    plan = e.plan(hw, np.random.default_rng(9))
    replay = np.random.default_rng(9)  # the same calls on the same generator: the plan's uniforms
    u_p = replay.random(n)
    sel = np.flatnonzero(u_p < 0.7)
    counts = np.full(sel.size, count[0]) if count[0] == count[1] else replay.integers(count[0], count[1] + 1, sel.size)
    u_area, u_aspect = replay.random((sel.size, count[1], 10)), replay.random((sel.size, count[1], 10))
    found = skipped = 0
    for k in range(n):
        h, w = (int(v) for v in hw[k])
        img = torch.zeros((1, h, w))
        if k in sel:
            s = int(np.searchsorted(sel, k))
            rnd = Replay(u_p[k], None if count[0] == count[1] else int(counts[s]), u_area[s], u_aspect[s],
                         plan.boxes[k])
        else:
            rnd = Replay(u_p[k], None, None, None, None)
        timm_erase(img, rnd, 0.7, *area, LOG_RATIO, *count)
        assert torch.equal(img, painted(plan, k, h, w)), (k, h, w, plan.boxes[k])
        found += int((plan.boxes[k, :, 2] > 0).sum())
        skipped += int(k in sel and (plan.boxes[k, :, 2] == 0).any())
    assert found > 100 and (skipped > 10 or area[1] < 0.5)  # found and failed boxes both exercised


def erase(mode, n=200, size=(40, 56), count=(1, 1), dtype=torch.float32, seed=0):
    e = NoiseErasing(1.0, (0.02, 1 / 3), LOG_RATIO, mode, count)
    plan = e.plan(np.tile(size, (n, 1)), np.random.default_rng(seed))
    x = torch.full((n, *size, 3), 7.0, dtype=dtype)  # NHWC: 7 is no value the noise would give (P < 1e-11)
    e.apply(x, plan)
    return x, plan


def inside(plan, size):
    n, m, _ = plan.boxes.shape
    mask = torch.zeros((n, *size), dtype=torch.bool)
    for k in range(n):
        for top, left, h, w in plan.boxes[k]:
            mask[k, top : top + h, left : left + w] = True
    return mask


def test_pixel_noise_is_standard_normal_per_pixel_and_channel_and_nothing_else_changes():
    x, plan = erase("pixel")
    mask = inside(plan, (40, 56))
    assert torch.all(x[~mask] == 7.0)  # the rest of the image untouched
    v = x[mask].double()  # (pixels, 3)
    assert v.shape[0] > 20000
    assert not (v == 7.0).any()
    se = 1 / math.sqrt(v.numel())
    assert abs(v.mean().item()) < 5 * se and abs(v.std().item() - 1) < 5 * se * math.sqrt(0.5) * 1.5
    assert abs((v**4).mean().item() - 3) < 0.1  # a normal's kurtosis, not a uniform's (1.8)
    corr = np.corrcoef(v.numpy().T)  # channels independent
    assert np.abs(corr - np.eye(3)).max() < 5 * se * math.sqrt(3)
    k = int(np.flatnonzero(plan.boxes[:, 0, 2] > 1)[0])
    top, left, h, w = plan.boxes[k, 0]
    box = x[k, top : top + h, left : left + w]
    assert box.reshape(-1, 3).unique(dim=0).shape[0] == h * w  # a value per pixel


def test_rand_noise_is_one_standard_normal_value_per_box_and_channel():
    x, plan = erase("rand", n=3000, count=(1, 2))
    values = []
    for k in range(len(plan.boxes)):
        for top, left, h, w in plan.boxes[k]:
            if h and w:
                box = x[k, top : top + h, left : left + w].reshape(-1, 3)
                values.append(box[-1])
    mask = inside(plan, (40, 56))
    assert torch.all(x[~mask] == 7.0)
    v = torch.stack(values).double()
    assert v.shape[0] > 3000
    se = 1 / math.sqrt(v.numel())
    assert abs(v.mean().item()) < 5 * se and abs(v.std().item() - 1) < 0.05
    assert v[:, 0].ne(v[:, 1]).all()  # one value per channel, not per box
    # one box alone: every pixel of it holds the same colour
    k = int(np.flatnonzero((plan.boxes[:, 0, 2] > 1) & (plan.boxes[:, 1, 2] == 0))[0])
    top, left, h, w = plan.boxes[k, 0]
    assert x[k, top : top + h, left : left + w].reshape(-1, 3).unique(dim=0).shape[0] == 1


def test_const_writes_zeros_in_every_box():
    x, plan = erase("const", count=(1, 3))
    mask = inside(plan, (40, 56))
    assert torch.all(x[mask] == 0) and torch.all(x[~mask] == 7.0)
    assert not plan.seeds.any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_the_noise_is_stored_in_the_batchs_dtype(dtype):
    x, plan = erase("pixel", n=20, dtype=dtype)
    mask = inside(plan, (40, 56))
    assert x.dtype == dtype and torch.all(x[~mask] == 7.0)
    assert abs(x[mask].double().std().item() - 1) < 0.05


def test_a_samples_boxes_and_noise_depend_only_on_seed_epoch_and_index():
    e = NoiseErasing(0.5, (0.02, 1 / 3), LOG_RATIO, "pixel", (1, 3))
    size = (32, 32)

    def rows(indices, epoch=0):
        plan = e.plan(np.tile(size, (len(indices), 1)), SampleDraws(5, epoch, indices))
        x = torch.zeros((len(indices), *size, 3))
        e.apply(x, plan)
        return dict(zip(indices, x)), plan

    a, pa = rows(list(range(40)))
    b, pb = rows([33, 7, 12, 90, 5])
    assert pa.boxes[:, :, 2].any()
    for i in (33, 7, 12, 5):
        assert torch.equal(a[i], b[i])
    c, _ = rows(list(range(40)), epoch=1)
    assert not all(torch.equal(a[i], c[i]) for i in range(40))  # another epoch, other draws


def test_a_subset_plan_erases_its_samples_as_the_whole_batch_does():
    e = NoiseErasing(1.0, (0.02, 1 / 3), LOG_RATIO, "pixel", (1, 2))
    plan = e.plan(np.tile((20, 20), (6, 1)), np.random.default_rng(1))
    whole = torch.zeros((6, 20, 20, 3))
    e.apply(whole, plan)
    part = torch.zeros((2, 20, 20, 3))
    e.apply(part, plan.take(3, 5))
    assert torch.equal(part, whole[3:5])
    assert isinstance(plan.take(0, 1), ErasePlan)


@pytest.mark.parametrize("mode, count", [("pixel", 1), ("rand", 1), ("const", 3), ("pixel", 2)])
def test_timms_erasing_converts_to_a_noise_erasing_after_normalize(mode, count):
    recipe = [T.CenterCrop(24), T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD),
              Erasing(0.25, mode=mode, max_count=count)]
    p = T.ImagePipeline(recipe)
    (e,) = p.erase
    assert not p.after and not p.fallback and not p.augment and p.on_floats
    assert (e.mode, e.count, e.p) == (mode, (1, count), 0.25)
    assert e.area == pytest.approx((0.02, 1 / 3)) and e.log_ratio == pytest.approx(LOG_RATIO)
    assert not p.batch_tensor  # normalized by the fill stage, before the erasing


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_torchvisions_random_erasing_after_normalize_erases_with_normal_noise_per_pixel(version):
    """torchvision (v1 and v2) draws ``normal_()`` per pixel and channel after Normalize: it ran per sample; now a
    NoiseErasing in mode 'pixel' with torchvision's scale and ratio."""
    from fastload._augment.noise_erasing import NoiseErasing as NE

    if version == "v1":
        given = tv(V1, "RandomErasing", p=0.3, scale=(0.05, 0.2), ratio=(0.5, 2.0), value="random", inplace=False)
    else:
        given = tv("torchvision.transforms.v2._augment", "RandomErasing", p=0.3, scale=(0.05, 0.2),
                   ratio=(0.5, 2.0), value=None, inplace=False)
    p = T.ImagePipeline([T.CenterCrop(24), T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD), given])
    (e,) = p.erase
    assert isinstance(e, NE) and e.source is given and not p.after
    assert (e.mode, e.count, e.p) == ("pixel", (1, 1), 0.3)
    assert e.area == pytest.approx((0.05, 0.2)) and e.log_ratio == pytest.approx((math.log(0.5), math.log(2.0)))


def test_fastloads_own_random_erasing_after_normalize_erases_with_normal_noise():
    p = T.ImagePipeline([T.CenterCrop(8), T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD),
                         T.RandomErasing(value="random")])
    (e,) = p.erase
    assert e.mode == "pixel" and e.source is None
    # before Normalize it stays the uint8 tile's erasing (uniform bytes, planned in the decoder)
    p = T.ImagePipeline([T.CenterCrop(8), T.RandomErasing(value="random"), T.ToDtype(torch.float32, scale=True)])
    assert not p.erase and isinstance(p.augment[0], T.RandomErasing)


def test_a_noise_erasing_where_it_cannot_run_natively_runs_as_the_librarys_object():
    timm_like = Erasing(0.25, mode="pixel")
    p = T.ImagePipeline([T.CenterCrop(8), T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD),
                         lambda img: img, timm_like])
    assert not p.erase and p.after[1].fn is timm_like and "follows a callable" in p.after[1].reason
    with pytest.raises(ValueError, match="comes after .*lambda.*move RandomErasing"):  # fastload's own: refused
        T.ImagePipeline([T.CenterCrop(8), T.ToDtype(torch.float32, scale=True), lambda img: img,
                         T.RandomErasing(value="random")])
    with pytest.raises(ValueError, match="leaves uint8 pixels"):
        T.ImagePipeline([T.CenterCrop(8), T.ToDtype(torch.uint8), Erasing(0.25, mode="pixel")])


def recipe(mode="pixel", count=2, p=0.6):
    return [T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToDtype(torch.float32, scale=True),
            T.Normalize(MEAN, STD), Erasing(p, mode=mode, max_count=count)]


def test_the_loader_erases_on_the_fast_path_deterministically_per_sample(image_shards):
    """No FastPathWarning (nothing per sample); a sample's pixels are the same in batches of 4 and of 6, with 0 or 2
    workers; erased pixels hold normal noise, the rest is the image the same pipeline without erasing gives."""
    ds = fastload.open(image_shards, transforms={"image": recipe()})
    plain = fastload.open(image_shards, transforms={"image": recipe()[:-1]})
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastload.FastPathWarning)
        a = torch.cat([x for x, _ in fastload.DataLoader(ds, batch_size=4, seed=3)])
        b = torch.cat([x for x, _ in fastload.DataLoader(ds, batch_size=6, seed=3, num_workers=2)])
    ref = torch.cat([x for x, _ in fastload.DataLoader(plain, batch_size=5, seed=3)])
    assert a.dtype == torch.float32 and a.shape[1:] == (3, 24, 24)
    assert torch.equal(a, b)
    changed = (a != ref).any(1)  # (N, H, W): the erased pixels
    assert 0.02 < changed.float().mean() < 0.5
    assert torch.equal(a.permute(0, 2, 3, 1)[~changed], ref.permute(0, 2, 3, 1)[~changed])
    noise = a.permute(0, 2, 3, 1)[changed].double()
    assert abs(noise.mean().item()) < 0.1 and abs(noise.std().item() - 1) < 0.1
    c = torch.cat([x for x, _ in fastload.DataLoader(ds, batch_size=4, seed=4)])
    assert not torch.equal(a, c)


def test_ds_getitem_erases_with_the_same_kind_of_noise(image_shards):
    ds = fastload.open(image_shards, transforms={"image": recipe(p=1.0, count=1)})
    img = ds[0][0] if isinstance(ds[0], tuple) else ds[0]["image"]
    assert img.dtype == torch.float32
    mean, std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)
    pixels = img * std + mean
    levels = pixels * 255
    off_level = ((levels - levels.round()).abs() > 1e-3).any(0)  # noise is no pixel level; the image's are
    assert 0 < off_level.float().mean() < 0.6


def test_a_decoder_writing_device_rows_cannot_run_it_and_says_why():
    """The fill stage erases host rows: a GPU decoder (rows on the device) must refuse the pipeline (by name), as
    it does the per-sample callables; without the erasing nothing is refused."""
    from fastload._fill.batcher import beyond_geometry
    from fastload.decoders._base import host_rows_refusal

    names = beyond_geometry({"image": T.ImagePipeline(recipe()[:2] + recipe()[2:])})
    why = host_rows_refusal(names)
    assert why is not None and "RandomErasing" in why and "mode='pixel'" in why
    assert host_rows_refusal(beyond_geometry({"image": T.ImagePipeline(recipe()[:-1])})) is None


# -- a constant erasing after a noise erasing (both after Normalize, applied in order as torchvision does) -------
TIMMS = ((0.02, 1 / 3), (0.3, 1 / 0.3))  # timm's default area and aspect range (torchvision's: 0.33 and 3.3)


def noise_then_const(noise, const):
    return [T.CenterCrop(24), T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD), noise, const]


@pytest.mark.parametrize(
    "noise, const, value",
    [
        (T.RandomErasing(0.3, value="random"), T.RandomErasing(0.4, *TIMMS, value=(0.5, -1.0, 2.0)),
         (0.5, -1.0, 2.0)),
        (tv(V1, "RandomErasing", p=0.3, scale=(0.02, 0.33), ratio=(0.3, 3.3), value="random", inplace=False),
         tv(V1, "RandomErasing", p=0.4, scale=TIMMS[0], ratio=TIMMS[1], value=0, inplace=False), (0.0,)),
        (tv(V1, "RandomErasing", p=0.3, scale=(0.02, 0.33), ratio=(0.3, 3.3), value="random", inplace=False),
         Erasing(0.4, mode="const"), (0.0,)),
    ],
    ids=["fastload", "torchvision", "timm-const"],
)
def test_a_constant_erasing_after_a_noise_erasing_erases_the_floats_after_it(noise, const, value):
    """It was refused ('ToDtype/Normalize must come after every geometric transform ...', which it does): lifted
    onto the uint8 tile, as a constant erasing alone is, it would run before the noise. Now both run on the float
    rows in their order, the constant in normalized units, exactly."""
    p = T.ImagePipeline(noise_then_const(noise, const))
    first, second = p.erase
    assert not p.augment and not p.after and not p.fallback
    assert (first.mode, first.p, second.mode, second.p, second.value) == ("pixel", 0.3, "const", 0.4, value)
    assert second.area == pytest.approx(TIMMS[0]) and second.log_ratio == pytest.approx(LOG_RATIO)
    assert second.source is (None if isinstance(const, T.RandomErasing) else const)


def test_the_constant_erasing_after_noise_writes_its_value_over_the_noise(image_shards):
    """On the loader: every sample's constant box holds exactly the value (in normalized units, as torchvision
    writes it), over the noise where the boxes meet; the pixels of neither box are the plain pipeline's."""
    value = (0.5, -1.0, 2.0)
    steps = [T.RandomResizedCrop(24), T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)]
    erasings = [T.RandomErasing(1.0, scale=(0.3, 0.6), value="random"), T.RandomErasing(1.0, scale=(0.1, 0.3),
                                                                                       value=value)]
    ds = fastload.open(image_shards, transforms={"image": steps + erasings})
    plain = fastload.open(image_shards, transforms={"image": steps})
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastload.FastPathWarning)
        a = torch.cat([x for x, _ in fastload.DataLoader(ds, batch_size=4, seed=3)])
    ref = torch.cat([x for x, _ in fastload.DataLoader(plain, batch_size=4, seed=3)])
    const = (a.permute(0, 2, 3, 1) == torch.tensor(value)).all(-1)  # (N, H, W): pixels holding the value
    changed = (a != ref).any(1)
    noise = changed & ~const
    assert const.flatten(1).any(1).all(), "a sample without the constant box"
    assert noise.flatten(1).any(1).float().mean() > 0.5  # the noise boxes, left where the constant box is not
    assert torch.equal(a.permute(0, 2, 3, 1)[~changed], ref.permute(0, 2, 3, 1)[~changed])
    # the constant box is one rectangle per sample, written last (no noise inside it)
    for k in range(len(a)):
        rows, cols = torch.nonzero(const[k], as_tuple=True)
        box = const[k, rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
        assert box.all(), f"sample {k}: the constant box is not whole (noise written over it)"


def test_an_erasing_that_cannot_run_there_says_what_it_follows():
    """After a callable on the float image: torchvision's constant erasing runs as its own object, per sample;
    fastload's is refused naming the callable. A noise erasing between ToDtype and Normalize is refused naming the
    Normalize after it (it said 'ToDtype/Normalize must come after every geometric transform')."""
    given = tv(V1, "RandomErasing", p=0.4, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0, inplace=False)
    p = T.ImagePipeline([T.CenterCrop(8), T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD),
                         lambda img: img, given])
    assert not p.erase and p.after[1].fn is given and "follows a callable" in p.after[1].reason
    with pytest.raises(ValueError, match="comes after .*lambda.*move RandomErasing"):
        T.ImagePipeline([T.CenterCrop(8), T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD),
                         lambda img: img, T.RandomErasing(value=0)])
    with pytest.raises(ValueError, match=r"RandomErasing\(.*mode='pixel'.* comes before Normalize.*must come after "
                                         r"every ToDtype/Normalize"):
        T.ImagePipeline([T.CenterCrop(8), T.ToDtype(torch.float32, scale=True), T.RandomErasing(value="random"),
                         T.Normalize(MEAN, STD)])
