"""Image transforms fastload does not know, run per sample on the decoded uint8 image (issue 21 item 4).

``fastload.open(transforms={"image": [...]})`` never refuses a callable: a user's function, a torchvision
transform without a fastload equivalent (or with parameters fastload cannot reproduce, see
``torchvision_convert.py``), an albumentations pipeline. Each becomes a :class:`UserTransform` at the end of
the image pipeline: the decoder runs the native part (crop, resize, flip and fastload's augmentations) into the
batch's rows, then these run per sample on each row, in list order, before ToDtype/Normalize. One placed
before a native transform is refused (``ImagePipeline``, naming both and the order to use): it would have to
run before the decoder, on source images of every size, and everything after it per sample too.

Calling convention (what torchvision v2 would hand a per-sample transform): ``t(img)`` with ``img`` a
contiguous uint8 CHW ``torch.Tensor``; an albumentations-like object (its class's module starts with
``albumentations``) is called ``t(image=hwc_numpy)["image"]``. The result must be a uint8 image of the same
shape: a CHW tensor (or an HWC numpy array for albumentations); an RGB PIL image of the same size is accepted
too. Anything else raises ``ValueError`` naming the transform and what was expected and got (the caller adds
the dataset, sample and field).

Randomness: each sample's transforms run with ``random``, ``numpy.random`` and ``torch`` seeded from that
sample's seed, which the pipeline draws from the sample's own draws (``Plan.seeds``, ``_draws.py``): the result is a
function of (seed, epoch, sample index) whichever process runs it and whichever batch holds the sample, so it never
depends on ``num_workers``, the batch size or the rank. The caller's global
generators are restored afterwards (at ``num_workers=0`` this runs in the training thread).

After ToDtype/Normalize (issue 30 item 2): a callable that follows them in the list (timm's ``RandomErasing``
after its ``Normalize``) is an :class:`AfterNormalize`, run per sample on the float image the same way: the
pipeline converts and normalizes the batch's rows on the CPU into a float buffer of the slot (the batch then
leaves as floats: on a device path 4x the bytes of uint8 cross to the device), and each sample's float CHW
tensor (contiguous, the pipeline's dtype) is handed to the callable, which returns a tensor of the same shape
and dtype (or changes it in place and returns it). Its rows travel through the same worker processes as raw
bytes (``(H, W, 3 * itemsize)`` uint8: numpy has no bfloat16), viewed as the float dtype here.

``fallback_workers.py`` runs a batch's samples in forked worker processes; ``run_rows`` runs them here.
"""

from __future__ import annotations

import random
import time
import types
from typing import Any, Sequence

import numpy as np
import torch

__all__ = ["AfterNormalize", "BadResult", "SampleTimes", "UserTransform", "run_rows", "run_sample"]


def _is_albumentations(fn: Any) -> bool:
    return type(fn).__module__.split(".")[0] == "albumentations"


def _short(fn: Any) -> str:
    """A transform's name for messages: its repr when short (torchvision's are), else its qualified name."""
    text = repr(fn)
    if len(text) <= 80 and "\n" not in text and " at 0x" not in text:
        return text
    named = fn if isinstance(fn, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)) else type(fn)
    return f"{getattr(named, '__module__', None) or '?'}.{getattr(named, '__qualname__', type(fn).__qualname__)}"


class UserTransform:
    """An image transform fastload does not know, run per sample after the native part (module docstring).

    ``fn``: the user's callable; ``reason``: why it is not planned natively (for the warning), e.g. a
    torchvision transform whose parameters fastload cannot reproduce; ``pil``: call ``fn`` with an RGB PIL image
    (a library's transform that only takes PIL images, e.g. timm's auto-augment policies)."""

    def __init__(self, fn: Any, reason: str | None = None, pil: bool = False) -> None:
        if not callable(fn):
            raise TypeError(f"{fn!r} ({type(fn).__name__}) is not callable")
        self.fn = fn
        self.reason = reason
        self.pil = bool(pil)
        self.albumentations = _is_albumentations(fn)
        self.name = _short(fn)

    def describe(self) -> dict[str, Any]:
        return {"name": "UserTransform", "transform": self.name, "reason": self.reason}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UserTransform) and self.fn == other.fn

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"UserTransform({self.name})"

    def __call__(self, img: np.ndarray) -> np.ndarray:
        """``img``: one HWC uint8 image; returns this transform's result as an HWC uint8 array of its shape."""
        h, w, c = img.shape
        if self.albumentations:
            out = self.fn(image=img)
            got = out.get("image") if isinstance(out, dict) else out
            res = _as_hwc(got, h, w, c, chw=False)
            if res is None:
                raise BadResult(
                    f"{self.name} returned {_what(out)} (called as t(image=img)); expected a dict whose "
                    f"'image' is a uint8 HWC numpy array of shape {(h, w, c)}"
                )
            return res
        if self.pil:
            from PIL import Image

            out = self.fn(Image.fromarray(img))
            res = _as_hwc(out, h, w, c, chw=True)
            if res is None:
                raise BadResult(
                    f"{self.name} returned {_what(out)} (called with an RGB PIL image of {w}x{h}); "
                    f"expected an RGB PIL image of {w}x{h} or a uint8 CHW torch.Tensor of shape {(c, h, w)}"
                )
            return res
        out = self.fn(torch.from_numpy(img).permute(2, 0, 1).contiguous())
        res = _as_hwc(out, h, w, c, chw=True)
        if res is None:
            raise BadResult(
                f"{self.name} returned {_what(out)}; expected a uint8 CHW torch.Tensor of shape "
                f"{(c, h, w)} (the image it was given, transformed in place of it), or an RGB PIL image "
                f"of {w}x{h}"
            )
        return res


class AfterNormalize(UserTransform):
    """A transform after ToDtype/Normalize, run per sample on the float image (module docstring). ``dtype``: the
    float dtype ToDtype made (the pipeline's)."""

    def __init__(self, fn: Any, dtype: torch.dtype, reason: str | None = None) -> None:
        super().__init__(fn, reason)
        if self.albumentations:
            raise ValueError(
                f"{self.name} is an albumentations transform after ToDtype/Normalize: albumentations "
                f"takes the uint8 image, so put it before ToDtype/Normalize"
            )
        self.dtype = dtype

    @classmethod
    def of(cls, t: UserTransform, dtype: torch.dtype) -> "AfterNormalize":
        if t.pil:
            raise ValueError(
                f"{t.name} takes PIL images ({t.reason or 'a PIL-only transform'}), which cannot hold "
                f"the normalized float image: put it before ToDtype/Normalize"
            )
        return cls(t.fn, dtype, t.reason)

    def describe(self) -> dict[str, Any]:
        return {"name": "UserTransform", "transform": self.name, "reason": self.reason, "on": str(self.dtype)}

    def __repr__(self) -> str:
        return f"AfterNormalize({self.name})"

    def __call__(self, img: np.ndarray) -> np.ndarray:
        """``img``: one image's float HWC pixels as bytes, ``(H, W, C * itemsize)`` uint8; the transform's result
        is written into it (and it is returned)."""
        pixels = torch.from_numpy(img).view(self.dtype)  # (H, W, C), sharing img's memory
        h, w, c = pixels.shape
        out = self.fn(pixels.permute(2, 0, 1).contiguous())
        if not (
            isinstance(out, torch.Tensor)
            and out.dtype == self.dtype
            and out.device.type == "cpu"
            and tuple(out.shape) == (c, h, w)
        ):
            raise BadResult(
                f"{self.name} returned {_what(out)}; expected a {str(self.dtype).replace('torch.', '')} "
                f"CHW torch.Tensor of shape {(c, h, w)} (it runs after ToDtype/Normalize, on the float "
                f"image it was given)"
            )
        pixels.copy_(out.permute(1, 2, 0))
        return img


class BadResult(ValueError):
    """A transform's result is not a uint8 image of the shape it was given (the message says what it was)."""


def _what(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).replace('torch.', '')} tensor of shape {tuple(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"a {value.dtype} numpy array of shape {value.shape}"
    if isinstance(value, dict):
        return f"a dict with keys {sorted(map(str, value))}" + (
            f" whose 'image' is {_what(value['image'])}" if "image" in value else ""
        )
    if type(value).__module__.startswith("PIL"):
        return f"a PIL image (mode {getattr(value, 'mode', '?')}, {getattr(value, 'size', '?')})"
    return f"{type(value).__name__} {value!r}"[:200]


def _as_hwc(value: Any, h: int, w: int, c: int, chw: bool) -> np.ndarray | None:
    """``value`` as an HWC uint8 array of shape (h, w, c), or None when it is not such an image."""
    if type(value).__module__.startswith("PIL"):
        if getattr(value, "mode", None) != "RGB" or tuple(value.size) != (w, h):
            return None
        return np.asarray(value)
    if isinstance(value, torch.Tensor):
        if value.dtype != torch.uint8 or value.device.type != "cpu" or not chw or tuple(value.shape) != (c, h, w):
            return None
        return value.permute(1, 2, 0).numpy()
    if isinstance(value, np.ndarray) and not chw:
        return value if value.dtype == np.uint8 and value.shape == (h, w, c) else None
    return None


class SampleTimes:
    """Seconds spent in each fallback transform and how many images it ran on (for the warning's cost)."""

    def __init__(self, n: int) -> None:
        self.seconds = [0.0] * n
        self.images = 0

    def add(self, other: "SampleTimes") -> None:
        self.seconds = [a + b for a, b in zip(self.seconds, other.seconds)]
        self.images += other.images

    def per_image_ms(self) -> list[float]:
        return [1000.0 * s / max(1, self.images) for s in self.seconds]


class _Seeded:
    """``random``, ``numpy.random`` and ``torch``'s CPU generator seeded for one sample, restored afterwards.
    Only the CPU generator: ``torch.manual_seed`` would also seed every CUDA generator (which is not restored,
    and, before CUDA starts, is queued with a stack trace: ~0.2 ms a sample)."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def __enter__(self) -> None:
        self.saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        random.seed(self.seed)
        # a hash of the seed, as torch's DataLoader seeds its workers' numpy: numpy and torch expand a 32-bit seed
        # alike (MT19937's init_genrand), so the same one gave torch numpy's numbers again
        np.random.seed(int(np.random.SeedSequence(self.seed).generate_state(1)[0]))
        torch.default_generator.manual_seed(self.seed)

    def __exit__(self, *exc: Any) -> None:
        random.setstate(self.saved[0])
        np.random.set_state(self.saved[1])
        torch.set_rng_state(self.saved[2])


def run_sample(
    transforms: Sequence[UserTransform], img: np.ndarray, seed: int, times: SampleTimes | None = None
) -> np.ndarray:
    """Run ``transforms`` in order on ``img`` (an HWC uint8 row, written in place and returned), seeded with
    ``seed``."""
    cur = img
    with _Seeded(seed):
        for k, t in enumerate(transforms):
            start = time.perf_counter()
            cur = t(cur)
            if times is not None:
                times.seconds[k] += time.perf_counter() - start
    if cur is not img:
        img[...] = cur
    if times is not None:
        times.images += 1
    return img


def run_rows(
    transforms: Sequence[UserTransform],
    rows: np.ndarray,
    ks: Sequence[int],
    seeds: np.ndarray,
    where: Any,
    times: SampleTimes | None = None,
) -> None:
    """``run_sample`` on rows ``ks`` of ``rows`` in this process. ``where(k)``: the location of row ``k`` for
    errors (dataset, shard, sample, field); a transform's own exception gets it as a note."""
    for k in ks:
        try:
            run_sample(transforms, rows[k], int(seeds[k]), times)
        except BadResult as e:
            raise BadResult(f"{where(k)}: {e}") from None
        except Exception as e:
            if hasattr(e, "add_note"):  # Python 3.11+; on 3.10 the exception goes up as raised
                e.add_note(f"fastload: raised by a per-sample image transform at {where(k)}")
            raise
