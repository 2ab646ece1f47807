"""Stand-ins for timm 1.0's ``Mixup`` and ``FastCollateMixup`` (``timm/data/mixup.py``), for CI, which has no timm.

Written from timm's semantics, not its code, in mode ``'batch'`` (the one CI tests use; the others raise):

- per batch, with probability ``prob`` (``np.random.rand() < prob``): if both alphas are on, CutMix when
  ``np.random.rand() < switch_prob``; ``lam = np.random.beta(alpha, alpha)`` of the chosen one;
- CutMix's box: sides ``int(H * sqrt(1 - lam))`` and ``int(W * ...)``, centre ``cy = np.random.randint(0, H)``
  then ``cx = np.random.randint(0, W)``, rows ``cy - cut_h // 2 .. cy + (cut_h + 1) // 2`` clipped (columns
  alike); ``lam`` becomes ``1 - box area / (H * W)`` when ``correct_lam``;
- sample ``i`` takes sample ``n - 1 - i`` (the batch flipped);
- targets: one-hot with ``off = smoothing / num_classes``, ``on = 1 - smoothing + off``, mixed with the flipped
  targets by ``lam``;
- ``Mixup.__call__(x, target)`` asserts an even batch and mixes ``x`` in place; ``FastCollateMixup.__call__``
  takes the list of ``(uint8 CHW numpy, int)`` samples and gives a uint8 batch, a MixUp blend rounded
  (``np.rint``) to uint8.
"""

from __future__ import annotations

import numpy as np
import torch


def _targets(target, num_classes, lam, smoothing):
    off = smoothing / num_classes
    y = torch.full((target.shape[0], num_classes), off, device=target.device)
    y.scatter_(1, target.long().view(-1, 1), 1.0 - smoothing + off)
    return y * lam + y.flip(0) * (1.0 - lam)


class Mixup:
    def __init__(
        self,
        mixup_alpha=1.0,
        cutmix_alpha=0.0,
        cutmix_minmax=None,
        prob=1.0,
        switch_prob=0.5,
        mode="batch",
        correct_lam=True,
        label_smoothing=0.1,
        num_classes=1000,
    ):
        self.mixup_alpha, self.cutmix_alpha, self.cutmix_minmax = mixup_alpha, cutmix_alpha, cutmix_minmax
        self.mix_prob, self.switch_prob, self.mode, self.correct_lam = prob, switch_prob, mode, correct_lam
        self.label_smoothing, self.num_classes, self.mixup_enabled = label_smoothing, num_classes, True

    def _draw(self, h, w):
        """(lam, box or None) for one batch."""
        if self.mode != "batch" or self.cutmix_minmax is not None:
            raise NotImplementedError("the stand-in draws per batch without cutmix_minmax only")
        if not (self.mixup_enabled and np.random.rand() < self.mix_prob):
            return 1.0, None
        both = self.mixup_alpha > 0 and self.cutmix_alpha > 0
        cut = (np.random.rand() < self.switch_prob) if both else self.cutmix_alpha > 0
        alpha = self.cutmix_alpha if cut else self.mixup_alpha
        lam = float(np.random.beta(alpha, alpha))
        if not cut:
            return lam, None
        r = np.sqrt(1 - lam)
        ch, cw = int(h * r), int(w * r)
        cy, cx = np.random.randint(0, h), np.random.randint(0, w)
        y0, y1 = int(np.clip(cy - ch // 2, 0, h)), int(np.clip(cy + (ch + 1) // 2, 0, h))
        x0, x1 = int(np.clip(cx - cw // 2, 0, w)), int(np.clip(cx + (cw + 1) // 2, 0, w))
        if self.correct_lam:
            lam = 1.0 - (y1 - y0) * (x1 - x0) / float(h * w)
        return lam, (y0, y1, x0, x1)

    def __call__(self, x, target):
        assert len(x) % 2 == 0, "Batch size should be even when using this"
        lam, box = self._draw(x.shape[-2], x.shape[-1])
        if box is not None:
            y0, y1, x0, x1 = box
            x[:, :, y0:y1, x0:x1] = x.flip(0)[:, :, y0:y1, x0:x1]
        elif lam != 1.0:
            other = x.flip(0).mul_(1.0 - lam)
            x.mul_(lam).add_(other)
        return x, _targets(target, self.num_classes, lam, self.label_smoothing)


class FastCollateMixup(Mixup):
    def __call__(self, batch):
        n = len(batch)
        assert n % 2 == 0, "Batch size should be even when using this"
        imgs = [b[0] for b in batch]
        out = torch.zeros((n, *imgs[0].shape), dtype=torch.uint8)
        lam, box = self._draw(*imgs[0].shape[-2:])
        for i in range(n):
            j = n - i - 1
            mixed = imgs[i]
            if box is not None:
                y0, y1, x0, x1 = box
                mixed = mixed.copy()
                mixed[:, y0:y1, x0:x1] = imgs[j][:, y0:y1, x0:x1]
            elif lam != 1.0:
                mixed = np.rint(mixed.astype(np.float32) * lam + imgs[j].astype(np.float32) * (1 - lam))
                mixed = mixed.astype(np.uint8)
            out[i] += torch.from_numpy(mixed)
        target = torch.tensor([b[1] for b in batch], dtype=torch.int64)
        return out, _targets(target, self.num_classes, lam, self.label_smoothing)


for _c in (Mixup, FastCollateMixup):
    _c.__module__ = "timm.data.mixup"
