"""torchvision's and timm's own RandomErasing objects after Normalize, a constant one after a noise one: both run
on the float rows in their order, as torchvision applies them. Skipped where torchvision does not import (CI);
run in the test-only venv (``bash scripts/timm_test_venv.sh``, then ``bench/.venvs/timm/bin/python -m pytest
tests/augment/test_erasing_order_real.py``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fastload.transforms as T

tvt = pytest.importorskip("torchvision.transforms", reason="torchvision is not importable here")
v2 = pytest.importorskip("torchvision.transforms.v2")

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def normalized(*erasings):
    return [T.CenterCrop(24), T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD), *erasings]


def timm_const(p):
    timm_erasing = pytest.importorskip("timm.data.random_erasing")
    return timm_erasing.RandomErasing(p, mode="const", device="cpu")


@pytest.mark.parametrize(
    "noise, const, value",
    [
        (lambda: tvt.RandomErasing(0.3, value="random"), lambda: tvt.RandomErasing(0.4, value=0), (0.0,)),
        (lambda: tvt.RandomErasing(0.3, value="random"), lambda: tvt.RandomErasing(0.4, value=(1, 2, 3)), (1, 2, 3)),
        (lambda: v2.RandomErasing(0.3, value="random"), lambda: v2.RandomErasing(0.4, value=-0.5), (-0.5,)),
        (lambda: tvt.RandomErasing(0.3, value="random"), lambda: timm_const(0.4), (0.0,)),
    ],
    ids=["v1", "v1-per-channel", "v2", "timm-const"],
)
def test_the_real_objects_convert_to_two_erasings_on_the_floats(noise, const, value):
    """They were refused with 'ToDtype/Normalize must come after every geometric transform ...'."""
    given = const()
    p = T.ImagePipeline(normalized(noise(), given))
    first, second = p.erase
    assert not p.after and not p.fallback and not p.augment
    assert (first.mode, first.p, second.mode, second.p) == ("pixel", 0.3, "const", 0.4)
    assert second.value == pytest.approx(value) and second.source is given


def test_the_erased_floats_are_torchvisions_on_the_same_boxes_and_noise():
    """torchvision's own forward of both objects, in order, on the same normalized images, with ``get_params``
    handing it each box fastload drew (and for the noise, the normal values fastload wrote; for the constant, the
    value as torchvision makes it): fastload's rows equal torchvision's bit for bit."""
    noise = tvt.RandomErasing(1.0, scale=(0.2, 0.5), value="random")
    const = tvt.RandomErasing(1.0, scale=(0.1, 0.3), value=(0.5, -1.0, 2.0))
    p = T.ImagePipeline(normalized(noise, const))
    n, hw = 16, (24, 32)
    images = torch.randn((n, *hw, 3))  # HWC rows, as the fill stage erases them
    rng = np.random.default_rng(0)
    plans = [e.plan(np.tile(hw, (n, 1)), rng) for e in p.erase]
    got = images.clone()
    for e, plan in zip(p.erase, plans):
        e.apply(got, plan)

    def boxes_of(k, plan, mode):
        def get_params(img, scale, ratio, value=None):
            top, left, h, w = (int(v) for v in plan.boxes[k, 0])
            if mode == "pixel":
                g = torch.Generator().manual_seed(int(plan.seeds[k, 0]))
                v = torch.randn((h, w, img.shape[0]), generator=g).permute(2, 0, 1)
            else:
                v = torch.tensor(value)[:, None, None]  # torchvision's own get_params' constant
            return top, left, h, w, v

        return get_params

    assert all(plan.boxes[:, 0, 2].all() for plan in plans)  # every sample erased by both
    for k in range(n):
        img = images[k].permute(2, 0, 1).clone()
        for obj, e, plan in zip((noise, const), p.erase, plans):
            obj.get_params = boxes_of(k, plan, e.mode)
            img = obj(img)
        assert torch.equal(got[k].permute(2, 0, 1), img), f"sample {k}"
    # where the boxes overlap the constant wins, as in torchvision's order
    assert any(_overlap(a[0], b[0]) for a, b in zip(plans[0].boxes, plans[1].boxes))


def _overlap(a, b) -> bool:
    return max(a[0], b[0]) < min(a[0] + a[2], b[0] + b[2]) and max(a[1], b[1]) < min(a[1] + a[3], b[1] + b[3])


def test_log_ratio_is_torchvisions():
    e = T.ImagePipeline(normalized(tvt.RandomErasing(value="random"), tvt.RandomErasing(value=0))).erase[1]
    assert e.log_ratio == pytest.approx((math.log(0.3), math.log(3.3)))
