"""The native engine: a plan's geometry and pixel steps run by C++ kernels over NHWC uint8 tiles.

The loader's native decoder runs them fused with decoding (``decoders/native.py`` ->
``_C.decode_augment_batch``: each pool thread decodes, crops, resizes and flips a sample, then runs the sample's
vertical flip, affine warp (csrc/warp.cc, PIL's ``Image.transform`` arithmetic) and pixel operations
(csrc/augment.cc) on its tile while it is in cache). :func:`run_native` runs the same kernels over tiles that
are already decoded (``_C.augment_tiles``), in place: the tests compare it with the other engines tile for tile.

The pixel kernels follow ``engine_torch.py``'s formulas and float32 roundings, so the two engines agree bit for
bit on most operations (tests/augment/test_augment_native.py states the figures per operation). Horizontal
flips are the decoder's (this runs after it, as ``run_torch(flips=False)``).

Operations map to the native kernels by name (``NATIVE_OPS``: ``_C.AUGMENT_OPS``, csrc/augment.h's one list);
importing this module checks that every operation Python defines (``ops.py``) has a native kernel and the other
way round (``check_native_ops``: RuntimeError naming each difference). An operation defined later (no native
kernel) raises NotImplementedError naming it; so does a one-channel plan (``Grayscale(num_output_channels=1)``)
in the decoder, whose rows have 3 channels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._native import native
from .ops import OPS
from .plan import AugmentPlan

__all__ = ["NATIVE_OPS", "augment_arrays", "check_native_ops", "native_arrays", "run_native"]

_PARAMS = 4  # float and int parameter columns per row (csrc/augment.h's kAugParams)

# Where each operation's plan columns go in the native rows: (column, "f" or "i", first slot); an operation
# without parameters has no entry.
_LAYOUT: dict[str, tuple[tuple[str, str, int], ...]] = {
    "brightness": (("factor", "f", 0),),
    "contrast": (("factor", "f", 0),),
    "saturation": (("factor", "f", 0),),
    "hue": (("factor", "f", 0),),
    "sharpness": (("factor", "f", 0),),
    "solarize": (("threshold", "f", 0),),
    "posterize": (("bits", "i", 0),),
    "solarize_add": (("add", "i", 0), ("threshold", "i", 1)),
    "erase": (("box", "i", 0), ("value", "f", 0)),
    "gaussian_blur": (("ksize", "i", 0), ("sigma", "f", 0)),
    "erase_random": (("box", "i", 0), ("seed", "f", 0)),
    "pil_color": (("factor", "f", 0), ("luma", "i", 0)),
    "pil_contrast": (("factor", "f", 0), ("luma", "i", 0)),
}

_default_pool = None


def check_native_ops(ops: dict, native_ops: dict, params: int) -> None:
    """RuntimeError naming every way the operations Python defines (``ops``, name -> ``plan.OpDef``) and the
    native core's (``native_ops``, name -> id; ``params`` slots of each kind a row) disagree: an operation on one
    side only, or one whose plan columns do not fit its row layout (``_LAYOUT``)."""
    problems = []
    only_python = sorted(set(ops) - set(native_ops))
    if only_python:
        problems.append(f"defined in Python (define_op) with no native kernel: {', '.join(only_python)}")
    only_native = sorted(set(native_ops) - set(ops))
    if only_native:
        problems.append(f"native kernels that no Python module defines: {', '.join(only_native)}")
    if sorted(native_ops.values()) != list(range(len(native_ops))):
        problems.append(f"the native ids are not 0..{len(native_ops) - 1}: {native_ops}")
    if params != _PARAMS:
        problems.append(f"the native rows have {params} parameter slots of each kind, this module fills {_PARAMS}")
    for name in sorted(set(ops) & set(native_ops)):
        layout = _LAYOUT.get(name, ())
        columns = ops[name].columns
        if sorted(c for c, _, _ in layout) != sorted(columns):
            problems.append(
                f"{name}: its plan columns are {sorted(columns)}, its native row layout (_LAYOUT) "
                f"places {sorted(c for c, _, _ in layout)}"
            )
            continue
        for column, _, first in layout:
            width = int(np.prod(columns[column][1], dtype=np.int64))
            if first + width > _PARAMS:
                problems.append(
                    f"{name}: column {column} ({width} values from slot {first}) overflows the "
                    f"{_PARAMS} slots of a native row"
                )
    if problems:
        raise RuntimeError(
            "fastload's augmentation operations and its native core (fastload._C) disagree: "
            + "; ".join(problems)
            + ". An operation needs both a define_op (in a module listed in "
            "fastload/_augment/ops.py) and a line in csrc/augment.h's FASTLOAD_AUG_OPS with its "
            "kernel; if the sources have both, fastload._C was built from other sources: rebuild "
            "it with `python setup.py build_ext --inplace`"
        )


_C = native()
# The native operations, name -> the id the kernels take: the C++ core's one list (csrc/augment.h), checked here,
# when the engine is imported, against every operation Python defines (ops.py).
NATIVE_OPS: dict[str, int] = dict(_C.AUGMENT_OPS)
check_native_ops(OPS, NATIVE_OPS, _C.AUGMENT_PARAMS)


def native_arrays(plan: AugmentPlan) -> tuple[np.ndarray, ...]:
    """The plan's steps as the native call's arrays: op (s,), offset (s + 1,), sample (m,), fparams (m, 4),
    iparams (m, 4). Raises NotImplementedError naming the operations the native engine does not have."""
    missing = sorted({step.op for step in plan.steps} - set(NATIVE_OPS))  # defined later than this import
    if missing:
        raise NotImplementedError(
            f"the native augmentation engine has no kernel for {', '.join(missing)} "
            f"(it has {', '.join(NATIVE_OPS)}); run these plans with engine_torch.run_torch"
        )
    sizes = np.array([step.index.size for step in plan.steps], dtype=np.int64)
    offset = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    m = int(offset[-1])
    op = np.array([NATIVE_OPS[step.op] for step in plan.steps], dtype=np.int64)
    sample = (
        np.concatenate([step.index for step in plan.steps]).astype(np.int64) if plan.steps else np.zeros(0, np.int64)
    )
    fparams, iparams = np.zeros((m, _PARAMS)), np.zeros((m, _PARAMS), dtype=np.int64)
    for step, start, stop in zip(plan.steps, offset[:-1], offset[1:]):
        for column, kind, first in _LAYOUT.get(step.op, ()):
            values = step.params[column].reshape(stop - start, -1)
            (fparams if kind == "f" else iparams)[start:stop, first : first + values.shape[1]] = values
    return op, offset, sample, fparams, iparams


def augment_arrays(plan: AugmentPlan, *, pad: bool = True) -> tuple[np.ndarray, ...]:
    """The ``augment`` tuple of ``_C.augment_tiles`` / ``_C.decode_augment_batch``: the plan's geometry after the
    horizontal flip (vflip, has_affine, affine (n, 6), interpolation, fill (n, 3)), then :func:`native_arrays`;
    then, with ``pad`` and a padded RandomCrop in the plan, its windows (padding.Padding: active, decode_hw, rows,
    cols, fill) for the decoder to assemble."""
    g = plan.geometry
    arrays = (
        g.vflip.astype(np.uint8),
        g.has_affine.astype(np.uint8),
        np.ascontiguousarray(g.affine.reshape(-1, 6), dtype=np.float64),
        g.interpolation.astype(np.uint8),
        np.ascontiguousarray(g.fill, dtype=np.float64),
        *native_arrays(plan),
    )
    if pad and g.pad is not None:
        p = g.pad
        arrays += (
            p.active.astype(np.uint8),
            p.decode_hw.astype(np.int64),
            p.rows.astype(np.int64),
            p.cols.astype(np.int64),
            np.ascontiguousarray(p.fill, dtype=np.float64),
        )
    return arrays


def run_native(images: Any, plan: AugmentPlan, pool: Any = None) -> Any:
    """Run ``plan``'s pixel steps on ``images`` **in place** and return it (a view of its first channel when
    the plan converts to one channel).

    ``images``: uint8 (N, H, W, 3), C-contiguous, a numpy array or a CPU torch tensor (its memory is used); or
    a CPU tensor (N, 3, H, W) in channels_last memory (the same bytes).
    ``pool``: a ``fastload._C.Pool`` whose threads split the samples (None: the calling thread only); the
    result does not depend on its size. The plan's horizontal flips are taken as done by the decoder."""
    nchw = _is_channels_last_nchw(images)
    arr = images.permute(0, 2, 3, 1) if nchw else images
    arr = arr.numpy() if hasattr(arr, "numpy") and not isinstance(arr, np.ndarray) else arr
    if not isinstance(arr, np.ndarray) or arr.ndim != 4:
        raise TypeError(
            f"run_native: images should be a uint8 (N, H, W, 3) numpy array or CPU tensor, got "
            f"{type(images).__name__} of shape {getattr(images, 'shape', None)}"
        )
    if arr.shape[3] != 3:
        hint = (
            " (an (N, 3, H, W) tensor must be in channels_last memory: x.contiguous(memory_format=torch.channels_last))"
            if arr.shape[1] == 3
            else ""
        )
        raise ValueError(
            f"run_native: images should be (N, H, W, 3), RGB in NHWC memory, got shape {tuple(arr.shape)}{hint}"
        )
    n, h, w = arr.shape[:3]
    if n != plan.n:
        raise ValueError(f"run_native: the batch has {n} images but the plan was made for {plan.n}")
    bad = np.flatnonzero((plan.geometry.out_hw[:, 0] != h) | (plan.geometry.out_hw[:, 1] != w))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"run_native: sample {i} was planned as {tuple(int(v) for v in plan.geometry.out_hw[i])} "
            f"(h, w) but the batch's tiles are {(h, w)}"
        )
    global _default_pool
    if pool is None:
        if _default_pool is None:
            _default_pool = _C.Pool(0)
        pool = _default_pool
    _C.augment_tiles(pool, arr, augment_arrays(plan, pad=False))  # tiles: padded windows already assembled
    if plan.channels == 1:
        return images[:, :1] if nchw else images[..., :1]
    return images


def _is_channels_last_nchw(images: Any) -> bool:
    """A torch tensor (N, 3, H, W) whose memory is NHWC: what fastload's loader hands out."""
    import sys

    torch = sys.modules.get("torch")  # only a tensor can be one, and then torch is imported
    return (
        torch is not None
        and isinstance(images, torch.Tensor)
        and images.ndim == 4
        and images.shape[1] == 3
        and images.shape[3] != 3
        and images.is_contiguous(memory_format=torch.channels_last)
    )
