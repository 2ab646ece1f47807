"""What the MixUp/CutMix loader tests share: torchvision v2's formulas in float64 on the batch's uint8 pixels
(the reference the CPU path's fused blend is held to), its tolerance, and the ``plans`` fixture (every plan a loader
draws)."""

from __future__ import annotations

import pytest
import torch

from fastload._augment.mix import BatchMix

EPS = float(torch.finfo(torch.float32).eps)


def normalized64(u8: torch.Tensor, mean=None, std=None) -> torch.Tensor:
    """torchvision's ToDtype(scale=True) then Normalize(mean, std), in float64, on an NCHW uint8 batch."""
    x = u8.to(torch.float64) / 255.0
    if mean is not None:
        m = torch.tensor(mean, dtype=torch.float64).view(1, -1, 1, 1)
        s = torch.tensor(std, dtype=torch.float64).view(1, -1, 1, 1)
        x = (x - m) / s
    return x


def torchvision_mix(u8: torch.Tensor, plan, mean=None, std=None) -> torch.Tensor:
    """torchvision v2's MixUp / CutMix on the normalized batch (float64): ``batch.roll(1, 0).mul_(1 - lam)
    .add_(batch.mul(lam))``, or the rolled batch's box pasted."""
    x = normalized64(u8, mean, std)
    rolled = x.roll(1, 0)
    if plan.kind == "mixup":
        return rolled.mul(1.0 - plan.lam).add_(x.mul(plan.lam))
    x1, y1, x2, y2 = plan.box
    out = x.clone()
    out[..., y1:y2, x1:x2] = rolled[..., y1:y2, x1:x2]
    return out


def soft_labels64(labels: torch.Tensor, plan, num_classes: int) -> torch.Tensor:
    one_hot = torch.nn.functional.one_hot(labels, num_classes).to(torch.float64)
    return one_hot.roll(1, 0).mul(1.0 - plan.label_lam).add_(one_hot.mul(plan.label_lam))


def bound(mean=None, std=None) -> float:
    """float32 rounding of the fused blend: 4 epsilons of its largest term, 255 * scale + |shift| (the native
    kernel's two multiplies and two adds; tests/native/test_convert_mix.py)."""
    if mean is None:
        return 4 * EPS
    scale = max(1 / 255 / s for s in std) * 255
    return 4 * EPS * (scale + max(abs(m / s) for m, s in zip(mean, std)))


def max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.to(torch.float64) - b.to(torch.float64)).abs().max()) if a.numel() else 0.0


def close_batches(a: list, b: list, plans: list, mean=None, std=None) -> bool:
    """Two epochs of (images, soft labels) from the same plans agree: labels and CutMix's images bit for bit,
    MixUp's images within twice the float32 rounding (one of them may blend after Normalize, in torch)."""
    if len(a) != len(b) or len(plans) != len(a):
        return False
    for (x, y), (u, v), plan in zip(a, b, plans):
        if not torch.equal(y, v) or x.shape != u.shape or x.dtype != u.dtype:
            return False
        if plan.kind == "cutmix" and not torch.equal(x, u):
            return False
        if max_error(x, u) > 2 * bound(mean, std):
            return False
    return True


__all__ = ["EPS", "bound", "close_batches", "max_error", "normalized64", "soft_labels64", "torchvision_mix"]


@pytest.fixture
def plans(monkeypatch):
    """Every plan the loader draws, in order."""
    seen = []
    real = BatchMix.plan

    def record(self, batch, rng):
        p = real(self, batch, rng)
        seen.append(p)
        return p

    monkeypatch.setattr(BatchMix, "plan", record)
    return seen
