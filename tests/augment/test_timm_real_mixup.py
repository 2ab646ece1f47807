"""timm's own Mixup / FastCollateMixup on fastload's batch (issue 30 item 1); skipped where timm does not import.

Run in the test-only venv (``bash scripts/timm_test_venv.sh``, then ``bench/.venvs/timm/bin/python -m pytest
tests/augment/test_timm_real_mixup.py``). Each case draws from the same numpy global state in timm's collate and
in fastload's ``TimmMixup``: timm's collate mixes the uint8 samples and the prefetcher normalizes; fastload mixes
the normalized batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("timm.data", reason="timm is not importable here (bash scripts/timm_test_venv.sh)")
from timm.data import FastCollateMixup, Mixup  # noqa: E402

from fastload._augment.timm_mix import TimmMixup  # noqa: E402
from timm_mix_common import half_level, versus_collate  # noqa: E402

KINDS = {
    "mixup": dict(mixup_alpha=0.8),
    "cutmix": dict(mixup_alpha=0.0, cutmix_alpha=1.0),
    "both": dict(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5),
    "minmax": dict(mixup_alpha=0.0, cutmix_minmax=(0.2, 0.8)),
    "prob": dict(mixup_alpha=0.8, cutmix_alpha=1.0, prob=0.5),
    "no-correct": dict(mixup_alpha=0.0, cutmix_alpha=1.0, correct_lam=False, label_smoothing=0.0),
}


@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("seed", range(4))
def test_fastload_matches_timms_collate_mixup(mode, kind, seed):
    m = FastCollateMixup(num_classes=5, mode=mode, **KINDS[kind])
    (want_x, want_y), (got_x, got_y) = versus_collate(m, seed)
    assert torch.allclose(got_y, want_y, atol=1e-6)
    assert (got_x - want_x).abs().max() <= half_level()
    if "mixup_alpha" in KINDS[kind] and KINDS[kind]["mixup_alpha"] == 0.0:
        assert torch.equal(got_x, want_x)  # CutMix alone: the boxes, exactly


@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_batches_keep_timms_labels(mode, dtype):
    # create_loader(fp16=True or img_dtype=torch.bfloat16): the batch is normalized in that dtype before it is
    # mixed; timm's collate mixed the uint8 samples with float32 labels, which fastload keeps exactly too
    for seed in range(4):
        m = FastCollateMixup(num_classes=5, mode=mode, **KINDS["both"])
        (want_x, want_y), (got_x, got_y) = versus_collate(m, seed, dtype=dtype)
        assert got_x.dtype == want_x.dtype == dtype and got_y.dtype == want_y.dtype
        assert torch.allclose(got_y, want_y, atol=1e-6), (got_y - want_y).abs().max()
        # the blend: timm's rounding to uint8, plus one rounding to dtype of values below 3 in magnitude
        spacing = 3 * torch.finfo(dtype).eps
        assert (got_x.float() - want_x.float()).abs().max() <= half_level() + spacing


@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
def test_fastload_runs_timms_mixup_on_the_batch(mode):
    x, y = torch.randn(6, 3, 8, 8), torch.tensor([0, 1, 2, 3, 4, 0])
    kw = dict(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=5, mode=mode)
    np.random.seed(2)
    want = Mixup(**kw)(x.clone(), y)
    np.random.seed(2)
    got = TimmMixup(Mixup(**kw))(x.clone(), y)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
