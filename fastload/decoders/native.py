"""``decoder="native"`` (the default): the native core executes fastload's plans on CPU threads.

One call per batch, ``_C.decode_batch``: every sample is decoded by libjpeg-turbo (DCT-scaled to the
smallest size that still covers the planned box at the output resolution, and cropped while decoding),
resized (PIL's antialiased triangle filter), mirrored, and written into its row of ``out``, by the
threads of ``pool`` with the GIL released; raw (unencoded) images are cropped and resized alike. Every
(region, offset, length) is bounds-checked in the native code, and a sample that fails is zeroed and
reported as ``(k, message)``. No per-sample Python: the batch's bytes are handed over as
``ImageSources``' ``regions, region, offset, length`` (read as attributes: no call back into the reader).

A plan with issue 21's augmentation (``plan.augment``) goes to ``_C.decode_augment_batch`` instead: the same
decode, and each sample's vertical flip, affine warp and pixel operations run on its tile by the thread that
decoded it, right after (fastload/_augment/engine_native.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .._augment.engine_native import augment_arrays
from .._native import native
from ._base import DecoderContext, DecoderKind


class NativeDecoder:
    """``decode(sources, plan, out)`` (``decoders/_base.py``) by ``_C.decode_batch``.

    ``pool``: the ``_C.Pool`` whose threads decode (the loader's batcher sets its own before each batch;
    None: the calling thread). ``dct_scaling=False`` decodes every image at full size before resizing
    (slower; the reference the GPU decoders are measured against).
    """

    def __init__(self, pool: Any = None, *, dct_scaling: bool = True):
        self.pool = pool
        self.dct_scaling = dct_scaling

    def decode(self, sources: Any, plan: Any, out: Any) -> list[tuple[int, str]]:
        """Decode ``sources`` (an ``ImageSources``) with ``plan.crops[k]`` (or ``plan.frames[k]``, torchvision's
        resize then crop exactly) and ``plan.flips[k]`` into ``out[k]``: a uint8 ``(n, H, W, 3)`` numpy array or CPU
        tensor. Returns the failures ``[(k, message)]``."""
        augment = plan.augment  # executed here, all of it: no geometry_only refusal, only the length check
        planned = len(plan.crops)  # plan.n, without a call into transforms per batch
        if planned != sources.n:
            raise ValueError(f"the plan has {planned} samples but {sources.n} images were given")
        if augment is not None and augment.channels != 3:
            raise NotImplementedError(
                "the native decoder writes 3-channel rows; Grayscale(num_output_channels=1) "
                "is not supported in a loader (use num_output_channels=3)"
            )
        if isinstance(out, torch.Tensor):
            out = out.numpy()
        meta = sources.meta
        if self.pool is None:
            self.pool = native().Pool(0)
        args = (
            self.pool,
            sources.regions,
            sources.region,
            sources.offset,
            sources.length,
            meta[:, 2].astype(np.uint8),
            np.ascontiguousarray(meta[:, :2], dtype=np.int32),
            np.ascontiguousarray(plan.crops, dtype=np.int32),
            np.ascontiguousarray(plan.flips, dtype=np.uint8),
            out,
        )
        interp = None if plan.interp is None else np.ascontiguousarray(plan.interp, dtype=np.uint8)
        frames = getattr(plan, "frames", None)
        frames = None if frames is None else np.ascontiguousarray(frames, dtype=np.int32)
        opts = {"dct_scaling": self.dct_scaling, "interpolation": interp, "frames": frames}
        if augment is not None:
            return native().decode_augment_batch(*args, augment_arrays(augment), **opts)
        return native().decode_batch(*args, **opts)

    def close(self) -> None:
        pass


def _make(ctx: DecoderContext) -> NativeDecoder:
    return ctx.native  # one per loader: the batcher gives it its pool before each batch


KIND = DecoderKind("native", make=_make, augments=True)
