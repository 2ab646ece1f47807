"""timm's Mixup / FastCollateMixup run on the loader's batch (issue 30 item 1, ``_augment/timm_mix.py``).

CI has no timm: these run the stand-ins of ``tests/timm_mixup_standin.py`` (timm's semantics in mode 'batch',
module ``timm.data.mixup``); ``test_timm_real.py`` runs the same comparisons with timm's own objects."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from fastload._augment.mix import resolve_batch
from fastload._augment.timm_mix import TimmMixup, is_timm_mixup
from timm_mix_common import half_level, normalize, samples, versus_collate
from timm_mixup_standin import FastCollateMixup, Mixup


def collate(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return FastCollateMixup(num_classes=5, **kw)


@pytest.mark.parametrize(
    "kw",
    [dict(mixup_alpha=0.8), dict(mixup_alpha=0.0, cutmix_alpha=1.0), dict(mixup_alpha=0.8, cutmix_alpha=1.0)],
)
@pytest.mark.parametrize("seed", range(6))
def test_collate_mixup_on_the_normalized_batch_matches_timms_collate(kw, seed):
    """The same draws: CutMix's boxes and the soft labels exactly, a blend within timm's uint8 rounding."""
    (want_x, want_y), (got_x, got_y) = versus_collate(collate(**kw), seed)
    assert torch.equal(got_y, want_y)
    assert (got_x - want_x).abs().max() <= half_level()
    if kw["mixup_alpha"] == 0.0:
        assert torch.equal(got_x, want_x)


def test_the_batch_is_mixed_with_its_flip_not_its_roll():
    (want_x, _), (got_x, _) = versus_collate(collate(mixup_alpha=0.0, cutmix_alpha=1.0, label_smoothing=0.0), 3)
    assert torch.equal(got_x, want_x)
    x = normalize(torch.stack([torch.from_numpy(a) for a, _ in samples()]))
    assert not torch.equal(got_x[0], x[0])  # something was pasted, from sample 7 (flip), not sample 7 = roll's


def test_plain_mixup_is_timms_call_on_the_batch():
    x = torch.randn(4, 3, 6, 6)
    y = torch.tensor([0, 1, 2, 3])
    np.random.seed(1)
    want = Mixup(num_classes=4)(x.clone(), y)
    np.random.seed(1)
    got = TimmMixup(Mixup(num_classes=4))(x.clone(), y)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert not torch.equal(got[0], x)


def test_mixup_enabled_reaches_timms_object():
    m = TimmMixup(Mixup(num_classes=3, label_smoothing=0.0))
    m.mixup_enabled = False
    assert m.mixup.mixup_enabled is False
    x = torch.randn(2, 3, 4, 4)
    got_x, got_y = m(x.clone(), torch.tensor([0, 2]))
    assert torch.equal(got_x, x) and torch.equal(got_y, torch.tensor([[1.0, 0, 0], [0, 0, 1.0]]))


def test_an_odd_batch_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="should be even.*drop_last=True"):
        TimmMixup(Mixup(num_classes=3))(torch.zeros(3, 3, 4, 4), torch.zeros(3, dtype=torch.int64))


def test_uint8_images_are_refused():
    with pytest.raises(ValueError, match="float"):
        TimmMixup(Mixup(num_classes=3))(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.zeros(2))


def test_an_unknown_mode_is_refused_not_mixed_per_batch():
    with pytest.raises(ValueError, match="mode='elems'"):
        TimmMixup(Mixup(mode="elems"))


def test_only_timms_class_is_recognised():
    assert is_timm_mixup(Mixup()) and is_timm_mixup(collate())
    assert not is_timm_mixup(object())
    with pytest.raises(TypeError, match="not timm's Mixup"):
        TimmMixup(object())


def test_collate_mixup_says_how_it_differs():
    with pytest.warns(UserWarning, match="rounding to uint8"):
        TimmMixup(collate())


def test_batch_transforms_say_to_run_timms_mixup_on_the_batch():
    with pytest.raises(TypeError, match="timm's Mixup has no exact fastload equivalent.*mixup_fn"):
        resolve_batch(Mixup(), None, {}, False)
