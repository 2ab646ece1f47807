"""timm's ``Mixup`` / ``FastCollateMixup`` run on the loader's batch (issue 30 item 1).

Why timm's own object, and not fastload's MixUp/CutMix (``mix.py``): no setting of timm's Mixup is exactly one
of fastload's batch transforms. timm (``timm/data/mixup.py``, 1.0) pairs sample ``i`` with ``n - 1 - i`` (the
batch flipped), fastload with ``i - 1`` (rolled, as torchvision v2); timm's CutMix box has sides
``int(H * sqrt(1 - lam))`` placed at ``cy - cut // 2 .. cy + (cut + 1) // 2``, fastload's half sides
``int(0.5 * sqrt(1 - lam) * H)`` either side; timm smooths the labels (``label_smoothing=0.1`` by default), mixes
with probability ``prob``, switches between its two with ``switch_prob``, draws per pair or per sample in modes
``'pair'`` / ``'elem'``, and has ``cutmix_minmax`` boxes; and it draws from numpy's global generator. So its
own ``__call__(x, target)`` runs on the batch after the loader, on the batch's device, as timm's ``train.py``
calls ``mixup_fn``: that is timm's semantics by construction.

``FastCollateMixup`` (what timm's ``train.py`` passes as ``collate_fn`` with the prefetcher) mixes the uint8
samples while collating, rounding the blend to uint8, before the prefetcher normalizes. Here the same draws
(its parent ``Mixup.__call__``: the same parameters, the same order of ``np.random`` calls) mix the batch after
it is normalized on the device: CutMix's boxes and all labels are identical, a MixUp blend differs by timm's
uint8 rounding only (at most half a level, ``0.5 / 255 / std`` after normalizing), said once in a warning. A
half-precision batch (``img_dtype``) is mixed in float32 and written back, so its labels are timm's too.

Classes are matched by module and name: timm is never imported here.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

__all__ = ["TimmMixup", "is_timm_mixup"]

_MODULE = "timm.data.mixup"
_MODES = ("batch", "pair", "elem")


def _timm_class(obj: Any, name: str) -> type | None:
    for c in type(obj).__mro__:
        if c.__module__ == _MODULE and c.__name__ == name:
            return c
    return None


def is_timm_mixup(obj: Any) -> bool:
    """Whether ``obj`` is timm's ``Mixup`` or ``FastCollateMixup`` (or a subclass of them)."""
    return _timm_class(obj, "Mixup") is not None


class TimmMixup:
    """timm's ``Mixup`` (or ``FastCollateMixup``) applied to a normalized float batch ``(x, target)``: ``x``
    (N, C, H, W), ``target`` (N,) class indices; returns ``(x, soft targets (N, num_classes))`` as timm's
    ``Mixup.__call__`` does (``x`` mixed in place). ``mixup_enabled`` reads and sets the object's (timm's
    ``train.py`` turns mixing off at ``--mixup-off-epoch`` through the loader)."""

    def __init__(self, mixup: Any) -> None:
        base = _timm_class(mixup, "Mixup")
        if base is None:
            raise TypeError(f"{mixup!r} is not timm's Mixup or FastCollateMixup (timm.data.mixup)")
        mode = getattr(mixup, "mode", None)
        if mode == "half":
            raise ValueError(
                f"{type(mixup).__name__}: mode='half' gives a batch of half the samples, each mixed, which "
                f"fastload's loader does not do; use mode 'elem' (each sample its own draw) or 'batch'"
            )
        if mode not in _MODES:
            # timm itself treats any other mode as 'batch' silently; a typo here would mix per batch unasked
            raise ValueError(f"{type(mixup).__name__}: mode={mode!r} should be one of {list(_MODES)}")
        k = getattr(mixup, "num_classes", None)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"{type(mixup).__name__}: num_classes={k!r} should be a positive int")
        self.mixup = mixup
        self.collates = _timm_class(mixup, "FastCollateMixup") is not None
        self._call: Callable = base.__call__  # Mixup's, also for FastCollateMixup (whose own __call__ collates)
        if self.collates:
            warnings.warn(
                "fastload: timm's FastCollateMixup mixes the batch after it is normalized on the device, "
                "with its own draws (Mixup.__call__); CutMix boxes and the soft labels are timm's exactly, a "
                "MixUp blend differs from timm's by its rounding to uint8 (at most half a level)",
                UserWarning,
                stacklevel=3,
            )

    @property
    def mixup_enabled(self) -> bool:
        return bool(self.mixup.mixup_enabled)

    @mixup_enabled.setter
    def mixup_enabled(self, value: bool) -> None:
        self.mixup.mixup_enabled = value

    def __call__(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        name = type(self.mixup).__name__
        if not isinstance(x, torch.Tensor) or x.ndim != 4 or not x.is_floating_point():
            raise ValueError(
                f"{name}: the images should be a float (N, C, H, W) batch, got "
                f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}"
            )
        if x.shape[0] % 2:
            # timm asserts this; said with the fix
            raise ValueError(
                f"{name}: the batch size should be even (it pairs sample i with sample N-1-i), got a "
                f"batch of {x.shape[0]}: use an even batch_size and drop_last=True"
            )
        if not isinstance(target, torch.Tensor) or target.shape[:1] != x.shape[:1]:
            raise ValueError(
                f"{name}: the targets should be a tensor of {x.shape[0]} class indices, got "
                f"{tuple(getattr(target, 'shape', ())) or type(target).__name__}"
            )
        if self.collates and x.dtype in (torch.float16, torch.bfloat16):
            # timm's draws per pair and per sample ('pair', 'elem') make ``lam`` a tensor of the images' dtype: in
            # half precision the soft labels would lose the digits timm's collate keeps (float32), and a blend would
            # round twice. So a float32 copy is mixed and written back (create_loader(fp16=True), img_dtype=...).
            # (A plain Mixup is timm's call as it is, in the batch's dtype, as timm's train.py would make it.)
            wide, target = self._call(self.mixup, x.float(), target)
            return x.copy_(wide), target
        return self._call(self.mixup, x, target)

    def __repr__(self) -> str:
        return f"TimmMixup({type(self.mixup).__name__}, mode={self.mixup.mode!r})"
