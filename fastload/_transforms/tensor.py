"""Tensor transforms that run on the batch after it reaches its device: ``ToDtype`` and
``Normalize`` (exported by ``fastload.transforms``, with torchvision.transforms.v2's semantics).

uint8 pixels travel over PCIe; conversion and normalisation happen on the device, fused into two
kernels writing into a preallocated buffer (a type conversion, then one multiply-add with
per-channel constants), keeping the channels_last layout. On a CPU-only machine the same
declarations run on the CPU, so one training script works everywhere: float32 from a channels_last
batch in one native pass (``_C.affine_u8_f32``, a multiply then an add per element, the GIL released
and no torch intra-op threads), other dtypes and layouts with torch's ops. MixUp/CutMix on the CPU
(``_augment/mix.py``) ride in that same pass (``apply(..., mix=plan)``, ``_C.mix_affine_u8_f32``): a pass of
their own over the float batch cost as much as the conversion itself.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .._native import native

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class TensorTransform:
    """Base of the transforms that run on whole batches on their device; equal when their settings are."""

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash(repr(self))


class ToDtype(TensorTransform):
    """Convert to ``dtype``; with ``scale=True`` uint8 0..255 becomes 0..1 (torchvision v2's rule)."""

    def __init__(self, dtype: torch.dtype, scale: bool = False):
        if dtype not in _FLOATS and dtype != torch.uint8:
            raise ValueError(f"ToDtype(dtype={dtype}) should be a float dtype ({', '.join(map(str, _FLOATS))})")
        self.dtype, self.scale = dtype, bool(scale)

    def __repr__(self) -> str:
        return f"ToDtype(dtype={self.dtype}, scale={self.scale})"


def _floats(name: str, values: Any) -> list[float]:
    """Normalize's ``mean``/``std`` as floats, or an error naming the argument and what it should be."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(
            f"Normalize: {name}={values!r} should be a sequence of numbers, one per channel "
            f"(e.g. {name}=[0.485, 0.456, 0.406])"
        )
    try:
        return [float(v) for v in values]
    except (TypeError, ValueError):
        raise ValueError(f"Normalize: {name}={list(values)!r} should hold numbers, one per channel") from None


class Normalize(TensorTransform):
    """``(x - mean) / std`` per channel, on a float batch (put a float ``ToDtype`` before it)."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        self.mean, self.std = _floats("mean", mean), _floats("std", std)
        if len(self.mean) != len(self.std) or not self.mean:
            raise ValueError(f"Normalize: mean {self.mean} and std {self.std} need one value per channel")
        if any(s == 0 for s in self.std):
            raise ValueError(f"Normalize: std {self.std} has a zero")

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean}, std={self.std})"


def _one_pass_on_cpu(x: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether the native one-pass kernel can do ``out = x * a + b``: uint8 to float32 on the CPU, both
    channels_last (NHWC in memory, as the slots and their outputs are). It also keeps torch's intra-op
    threads, which spin after each op, off the cores the decode threads use."""
    return (
        x.device.type == "cpu"
        and out.device.type == "cpu"
        and x.dtype == torch.uint8
        and out.dtype == torch.float32
        and x.dim() == 4
        and x.shape == out.shape
        and 1 <= x.shape[1] <= native().AFFINE_MAX_CHANNELS
        and x.permute(0, 2, 3, 1).is_contiguous()
        and out.permute(0, 2, 3, 1).is_contiguous()
    )


def _fill(t: torch.Tensor, values: list[float]) -> torch.Tensor:
    """Write ``values`` along dimension 1 of ``t`` by one fill per value: on a device, no host-to-device copy
    (a copy from a pageable CPU tensor is a host sync: the first batch of a process would wait for the GPU)."""
    for k, v in enumerate(values):
        t[:, k].fill_(v)
    return t


def _current_stream(device: torch.device) -> Any:
    """The stream work on ``device`` is queued on now (None off CUDA: everything runs in order)."""
    return torch.cuda.current_stream(device) if device.type == "cuda" else None


class TensorPipeline:
    """ToDtype/Normalize folded into ``out = convert(x) * a + b`` with per-channel ``a``, ``b``."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorPipeline) and other.transforms == self.transforms

    def __hash__(self) -> int:  # a key of the device ring's constants (equal pipelines: equal constants)
        return hash(self.transforms)

    def __init__(self, transforms: Sequence[TensorTransform]):
        self.transforms = tuple(transforms)
        self.dtype = torch.uint8
        scale = 1.0
        mean: list[float] | None = None
        std: list[float] | None = None
        for t in self.transforms:
            if isinstance(t, ToDtype):
                if mean is not None:
                    raise ValueError("ToDtype after Normalize is not supported: convert first, then normalize")
                self.dtype = t.dtype
                if t.scale and t.dtype in _FLOATS:
                    scale = 1.0 / 255.0
            elif isinstance(t, Normalize):
                if self.dtype not in _FLOATS:
                    raise ValueError(
                        "Normalize needs a float batch: put ToDtype(torch.float32 / float16 / "
                        "bfloat16, scale=True) before it (uint8 crosses PCIe, floats are made on "
                        "the device)"
                    )
                if mean is not None:
                    raise ValueError("only one Normalize per pipeline")
                mean, std = t.mean, t.std
            else:
                raise TypeError(f"{t!r} is not a tensor transform (ToDtype, Normalize)")
        self._scale, self._mean, self._std = scale, mean, std
        self._consts: dict[Any, tuple[torch.Tensor, torch.Tensor]] = {}

    def __bool__(self) -> bool:
        return bool(self.transforms)

    def affine(self, channels: int) -> tuple[list[float], list[float]] | None:
        """``a`` and ``b`` of ``out = convert(x) * a + b`` for ``channels`` channels, as host floats already
        rounded to the output dtype, or None for a plain conversion. Rounded through float32, so that a
        float16/bfloat16 pipeline rounds each constant once from the same float32 value (a fill of the rounded
        value is then exact in any dtype)."""
        if self._mean is None and self._scale == 1.0:
            return None
        mean = self._mean or [0.0] * channels
        std = self._std or [1.0] * channels
        if len(mean) != channels:
            raise ValueError(f"Normalize has {len(mean)} channels, the batch has {channels}")
        a = [self._scale / s for s in std]
        b = [-m / s for m, s in zip(mean, std)]
        f32 = torch.float32  # explicit: a user may have changed torch's default dtype
        return torch.tensor(a, dtype=f32).to(self.dtype).tolist(), torch.tensor(b, dtype=f32).to(self.dtype).tolist()

    def constants(self, channels: int, streams: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``a`` and ``b`` as (1, C, 1, 1) tensors made through ``streams`` (a ``_ring`` streams backend) on its
        current stream: allocated there and written by fill kernels queued there, never copied from the host.
        They are for that stream only: read on another, the reader would have to wait for these fills. So the
        caller keeps them per stream (``fast/device.py`` per device ring, whose side stream runs the pipeline),
        not on the pipeline, which every loader over the same dataset shares."""
        folded = self.affine(channels)
        if folded is None:
            return None
        out = []
        for values in folded:
            t = streams.empty((1, channels, 1, 1), self.dtype, False)
            streams.launch(lambda t=t, v=values: _fill(t, v), writes=(t,), what="normalize constants")
            out.append(t)
        return out[0], out[1]

    def _constants(self, channels: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The constants for ``apply`` without given ones, cached on the pipeline per stream: on a CUDA device
        per current stream, so that each stream reads constants written in its own order."""
        if self._mean is None and self._scale == 1.0:
            return None
        key = (channels, device, _current_stream(device))
        if key not in self._consts:
            a, b = self.affine(channels)
            self._consts[key] = tuple(
                _fill(torch.empty((1, channels, 1, 1), dtype=self.dtype, device=device), v) for v in (a, b)
            )
        return self._consts[key]

    def output_like(self, x: torch.Tensor) -> torch.Tensor:
        """A buffer for the result of ``apply(x)``: x's shape and layout, the output dtype."""
        fmt = (
            torch.channels_last
            if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
            else torch.contiguous_format
        )
        return torch.empty(x.shape, dtype=self.dtype, device=x.device, memory_format=fmt)

    def fuses_mix(self, x: torch.Tensor, out: torch.Tensor) -> bool:
        """Whether ``apply(x, out, mix=...)`` can run: the native one-pass kernel's case (uint8 to float32 on
        the CPU, channels_last); elsewhere the mix runs after the pipeline, on its result."""
        return bool(self.transforms) and _one_pass_on_cpu(x, out)

    def apply(
        self,
        x: torch.Tensor,
        out: torch.Tensor | None = None,
        mix: Any = None,
        consts: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Run the pipeline on an NCHW batch ``x``, into ``out`` when given. ``mix``: a MixUp/CutMix plan
        (``_augment.mix.MixPlan``: ``kind``, ``lam``, ``box``) fused into the same native pass, each sample
        mixed with the original pixels of the one before it (torchvision's roll(1, 0)); only where
        ``fuses_mix(x, out)``. ``consts``: ``a`` and ``b`` made by ``constants`` on the stream this runs on
        (the device prefetcher's); without them, the pipeline's own for the current stream."""
        if not self.transforms:
            return x
        if out is None:
            out = self.output_like(x)
        if consts is None:
            consts = self._constants(x.shape[1], x.device)
        if mix is not None:
            if not self.fuses_mix(x, out):
                raise ValueError(
                    f"{mix.kind} fused into {self!r} needs a uint8 channels_last batch converted to "
                    f"float32 on the CPU, got {x.dtype} {tuple(x.shape)} on {x.device} into {out.dtype}"
                )
            scale, shift = (
                [c.flatten().tolist() for c in consts]
                if consts is not None
                else ([1.0] * x.shape[1], [0.0] * x.shape[1])
            )
            native().mix_affine_u8_f32(
                x.permute(0, 2, 3, 1).numpy(), out.permute(0, 2, 3, 1).numpy(), scale, shift, mix.kind, mix.lam, mix.box
            )
            return out
        if consts is not None and _one_pass_on_cpu(x, out):
            a, b = consts
            native().affine_u8_f32(
                x.permute(0, 2, 3, 1).numpy(),
                out.permute(0, 2, 3, 1).numpy(),
                a.flatten().tolist(),
                b.flatten().tolist(),
            )
            return out
        out.copy_(x)  # the dtype conversion, layout kept
        if consts is not None:
            a, b = consts
            torch.addcmul(b, out, a, out=out)  # one fused multiply-add per element
        return out

    def __repr__(self) -> str:
        return f"TensorPipeline({list(self.transforms)})"
