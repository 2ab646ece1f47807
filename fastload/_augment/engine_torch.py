"""The batched torch engine: executes a plan over a whole NCHW batch on its device, no loop over samples.

The GPU decoders (``decoders/nvjpeg.py``, ``decoders/dali.py``, the GPU half of ``decoders/hybrid.py``) run it on
their decoded rows (:func:`augment_rows`), on the stream they decode on, before the event the batch is handed on
with; DALI's CPU-only mode runs it on the host rows. The tests also run it on CPU tensors against the native
and PIL engines.

It receives the decoder's tiles (already cropped, resized and mirrored by every decoder, hence ``flips=False``
there) and runs, per the plan: flips, the affine (``grid_sample`` with a mask channel for the fill, as
torchvision's ``_apply_grid_transform``), then each step over its subset (``index_select`` -> kernel ->
``index_copy_``). A padded RandomCrop's windows (``padding.py``) are assembled first by
:func:`assemble_rows` on rows where the decoder wrote each window's box, decoded at its own size, at the top left
(one gather through the host's index maps, which already say edge/reflect/symmetric, and the fill where they say
-1). All host columns travel to the device in one packed copy per plan (:func:`host_columns`; a
decoder uploads them through its pinned staging, ``decoders/_staging.py``), and the kernels build their
constants on the device, so nothing waits on the device's queue.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .ops import OPS
from .plan import BICUBIC, BILINEAR, NEAREST, AugmentPlan

__all__ = ["assemble_rows", "augment_rows", "host_columns", "padding_columns", "run_torch", "run_torch_mask"]


class Columns(dict):
    """A step's parameters as device tensors, with the numpy columns in ``.host`` for kernels that need
    values on the host (kernel sizes) without a device sync."""

    host: dict[str, np.ndarray]


def run_torch(
    images: torch.Tensor, plan: AugmentPlan, *, flips: bool = True, columns: list[torch.Tensor] | None = None
) -> torch.Tensor:
    """Execute ``plan`` on ``images`` (N, C, H, W), uint8 (or float in [0, 1] for the operations that allow it).

    Returns a new tensor (N, plan.channels, H, W) of the same dtype; ``images`` is left unchanged.
    ``flips=False`` when the decoder has already applied the plan's horizontal flips. ``columns``: the arrays of
    :func:`host_columns` (same ``flips``) already on the batch's device (None: uploaded here, :func:`upload`)."""
    _check(images, plan)
    return _execute(images.clone(), plan, flips, columns)


def _own_precision(fn):
    """Run ``fn`` with autocast off: an enclosing ``torch.autocast`` (a training step's, when the engine runs in
    the training thread) would run any operation on autocast's lists in float16/bfloat16 and change the pixels.
    The kernels also use no convolution or matmul (those follow TF32 and matmul-precision globals on a GPU), so
    their arithmetic is the same whatever the user set (tests/augment/test_engine_precision.py)."""

    @functools.wraps(fn)
    def wrapped(x, *args, **kwargs):
        with torch.autocast(x.device.type, enabled=False):
            return fn(x, *args, **kwargs)

    return wrapped


def augment_rows(
    rows: torch.Tensor, plan: AugmentPlan, *, flips: bool = False, columns: list[torch.Tensor] | None = None
) -> None:
    """Execute ``plan`` on a decoder's uint8 rows (N, H, W, 3) **in place** (the GPU decoders' rows, DALI's host
    rows in its CPU-only mode): the batch is run as an NCHW tensor and written back into ``rows``. ``flips``:
    False, the decoders mirror while resizing. ``columns`` as for :func:`run_torch`."""
    if not isinstance(rows, torch.Tensor) or rows.ndim != 4 or rows.shape[3] != 3 or rows.dtype != torch.uint8:
        raise TypeError(
            f"augment_rows: rows should be uint8 (N, H, W, 3), got {getattr(rows, 'dtype', type(rows))} "
            f"{tuple(getattr(rows, 'shape', ()))}"
        )
    if plan.channels != 3:
        raise ValueError(
            "augment_rows: image rows keep 3 channels; Grayscale(num_output_channels=1) is not "
            "supported in a loader (use num_output_channels=3)"
        )
    x = rows.permute(0, 3, 1, 2)
    _check(x, plan)
    # contiguous NCHW, as the kernels are tested; one copy in and one back, on the rows' device and stream
    rows.copy_(_execute(x.contiguous(), plan, flips, columns).permute(0, 2, 3, 1))


def padding_columns(plan: AugmentPlan) -> list[np.ndarray]:
    """What :func:`assemble_rows` needs from the host: the padded samples (int64), their tile rows' and columns'
    box indices (int64 (m, H), (m, W); the columns already mirrored where the sample is flipped, as the native
    decoder reads them, -1 = fill) and their fill colours (uint8 (m, 3), truncated as ``padding.assemble`` does).
    Empty when nothing is padded."""
    pad = plan.geometry.pad
    if pad is None:
        none = np.zeros((0, 0), np.int64)
        return [np.zeros(0, np.int64), none, none, np.zeros((0, 3), np.uint8)]
    sel = np.flatnonzero(pad.active)
    cols = pad.cols[sel].astype(np.int64)
    flip = plan.geometry.hflip[sel].astype(bool)
    cols[flip] = cols[flip, ::-1]
    return [sel.astype(np.int64), pad.rows[sel].astype(np.int64), cols, pad.fill[sel].astype(np.uint8)]


def assemble_rows(rows: torch.Tensor, columns: list[torch.Tensor]) -> None:
    """Assemble padded crop windows **in place** in a decoder's uint8 rows (N, H, W, 3): row ``sel[j]`` holds
    sample ``sel[j]``'s box (its decoded size, unflipped) at its top left; it becomes ``box[r[y], c[x]]``, the fill
    where either index is -1 (``padding.assemble``, ``csrc/augment_plan.cc`` ``assemble``). ``columns``: the
    arrays of :func:`padding_columns` on the rows' device. One gather for all padded samples, whatever their
    padding mode (the index maps encode it), and no host sync."""
    sel, r, c, fill = columns
    m = sel.shape[0]
    if m == 0:
        return
    _, h, w, _ = rows.shape
    boxes = rows.index_select(0, sel).view(m, h * w, 3)
    idx = (r.clamp(min=0) * w).unsqueeze(2) + c.clamp(min=0).unsqueeze(1)  # (m, H, W) into the box's row-major pixels
    got = torch.gather(boxes, 1, idx.view(m, h * w, 1).expand(m, h * w, 3)).view(m, h, w, 3)
    hole = ((r < 0).unsqueeze(2) | (c < 0).unsqueeze(1)).unsqueeze(3)
    rows.index_copy_(0, sel, torch.where(hole, fill.view(m, 1, 1, 3), got))


def host_columns(plan: AugmentPlan, flips: bool = True) -> list[np.ndarray]:
    """Everything the engine needs from the host for ``plan``, in the order it reads them: the flipped rows, each
    affine mode's rows, matrices and fills, each step's index and parameter columns. A caller that uploads them
    itself (a decoder's pinned staging) passes the device copies to :func:`run_torch`/:func:`augment_rows`."""
    geo = plan.geometry
    host: list[np.ndarray] = [np.flatnonzero(geo.hflip) if flips else np.zeros(0, np.int64), np.flatnonzero(geo.vflip)]
    for mode in (NEAREST, BILINEAR, BICUBIC):
        rows = np.flatnonzero(geo.has_affine & (geo.interpolation == mode))
        host += [rows, geo.affine[rows], geo.fill[rows]]
    for step in plan.steps:
        host += [step.index, *step.params.values()]
    return host


@_own_precision
def _execute(x: torch.Tensor, plan: AugmentPlan, flips: bool, columns: list[torch.Tensor] | None) -> torch.Tensor:
    """Run the plan on ``x`` (N, C, H, W), which it may write in place; returns the result."""
    for step in plan.steps:
        if x.is_floating_point() and not OPS[step.op].floats:
            raise TypeError(
                f"the {step.op} operation runs on uint8 images only, got a {x.dtype} batch; "
                f"run the augmentations before converting to float"
            )
    host = host_columns(plan, flips)
    # Everything the device needs from the host, uploaded at once (one copy, no wait on the device's queue).
    dev_arrays = iter(upload(host, x.device) if columns is None else columns)
    rows = iter(host)

    for axis in (-1, -2):  # horizontal, vertical
        sel = next(dev_arrays)
        _subset(x, next(rows), sel, lambda t, axis=axis: t.flip(axis))
    for mode in (NEAREST, BILINEAR, BICUBIC):
        sel, m, fill = next(dev_arrays), next(dev_arrays), next(dev_arrays)
        sel_rows = next(rows)
        next(rows), next(rows)
        _subset(x, sel_rows, sel, lambda t, m=m, mode=mode, fill=fill: _affine(t, m, mode, fill))
    for step in plan.steps:
        sel = next(dev_arrays)
        cols = Columns({k: next(dev_arrays) for k in step.params})
        cols.host = step.params
        kernel = OPS[step.op].torch
        if step.index.size == x.shape[0]:  # every sample (index is sorted and distinct): no gather/scatter
            x = kernel(x, cols)
        else:
            x.index_copy_(0, sel, kernel(x.index_select(0, sel), cols))
    return x[:, :1].contiguous() if plan.channels == 1 else x


@_own_precision
def run_torch_mask(masks: torch.Tensor, plan: AugmentPlan, *, fill: int = 255, flips: bool = True) -> torch.Tensor:
    """Move segmentation masks (N, H, W) or (N, 1, H, W), uint8, with their images' geometry: the same flips
    and affine, always nearest, outside filled with ``fill`` (255: torchvision's segmentation "ignore" label);
    pixel operations skip masks. Returns a new tensor of the same shape."""
    if (
        not isinstance(masks, torch.Tensor)
        or masks.dtype != torch.uint8
        or masks.ndim not in (3, 4)
        or (masks.ndim == 4 and masks.shape[1] != 1)
    ):
        raise TypeError(
            f"run_torch_mask: masks should be a uint8 (N, H, W) or (N, 1, H, W) tensor, got "
            f"{getattr(masks, 'dtype', type(masks).__name__)} {tuple(getattr(masks, 'shape', ()))}"
        )
    if isinstance(fill, bool) or not isinstance(fill, int) or not 0 <= fill <= 255:
        raise ValueError(f"run_torch_mask: fill={fill!r} should be an int in [0, 255] (a label)")
    x = (masks if masks.ndim == 4 else masks.unsqueeze(1)).clone()
    _check(x.expand(-1, 3, -1, -1), plan)
    geo = plan.geometry
    hrows = np.flatnonzero(geo.hflip) if flips else np.zeros(0, np.int64)
    vrows, arows = np.flatnonzero(geo.vflip), np.flatnonzero(geo.has_affine)
    hsel, vsel, asel, m, fills = upload(
        [hrows, vrows, arows, geo.affine[arows], np.full((arows.size, 1), float(fill))], x.device
    )
    _subset(x, hrows, hsel, lambda t: t.flip(-1))
    _subset(x, vrows, vsel, lambda t: t.flip(-2))
    _subset(x, arows, asel, lambda t: _affine(t, m, 0, fills))
    return x if masks.ndim == 4 else x[:, 0]


def upload(arrays: list[np.ndarray], device: torch.device, pack: bool | None = None) -> list[torch.Tensor]:
    """The host arrays as tensors on ``device``. On the CPU they are views of the arrays; elsewhere they are
    packed into one pinned buffer and copied with one non-blocking copy (a copy from pageable memory would
    first wait for everything queued on the device), then viewed back per array."""
    pack = device.type != "cpu" if pack is None else pack
    if not pack:
        return [torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in arrays]
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        total += -(-a.nbytes // 8) * 8  # 8-byte aligned, so every dtype can view its slice
    buf = np.zeros(max(total, 8), dtype=np.uint8)
    for a, off in zip(arrays, offsets):
        buf[off : off + a.nbytes] = np.ascontiguousarray(a).view(np.uint8).ravel()
    staged = torch.from_numpy(buf)
    if device.type == "cuda":
        staged = staged.pin_memory()
    on_dev = staged.to(device, non_blocking=True)
    out = []
    for a, off in zip(arrays, offsets):
        dtype = torch.from_numpy(np.zeros(0, dtype=a.dtype)).dtype
        out.append(on_dev[off : off + a.nbytes].view(dtype).view(a.shape))
    return out


def _check(images: Any, plan: AugmentPlan) -> None:
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise TypeError(
            f"run_torch: images should be an (N, C, H, W) tensor, got {getattr(images, 'shape', type(images).__name__)}"
        )
    n, c, h, w = images.shape
    if n != plan.n:
        raise ValueError(f"run_torch: the batch has {n} images but the plan was made for {plan.n}")
    if c != 3:
        raise ValueError(f"run_torch: images should be RGB (3 channels, as the decoders give them), got {c} channels")
    if images.dtype != torch.uint8 and not images.is_floating_point():
        raise TypeError(f"run_torch: images should be uint8 (or float in [0, 1]), got {images.dtype}")
    bad = np.flatnonzero((plan.geometry.out_hw[:, 0] != h) | (plan.geometry.out_hw[:, 1] != w))
    if bad.size:
        i = int(bad[0])
        planned = tuple(int(v) for v in plan.geometry.out_hw[i])
        raise ValueError(f"run_torch: sample {i} was planned as {planned} (h, w) but the batch's tiles are {(h, w)}")


def _subset(x: torch.Tensor, rows: np.ndarray, sel: torch.Tensor, fn: Any) -> None:
    if rows.size:
        x.index_copy_(0, sel, fn(x.index_select(0, sel)))


def _cubic(v1: torch.Tensor, v2: torch.Tensor, v3: torch.Tensor, v4: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """PIL's BICUBIC macro (Geometry.c): Keys' cubic with a = -1, in float64."""
    p2, p3, p4 = v3 - v1, 2 * (v1 - v2) + v3 - v4, v2 - v1 - v3 + v4
    return v2 + d * (p2 + d * (p3 + d * p4))


def _bicubic(x: torch.Tensor, u: torch.Tensor, v: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    """PIL's ``Image.transform(AFFINE, resample=BICUBIC)`` (bicubic_filter32RGB): the sample point ``(u, v)``
    less half a pixel, the 4x4 neighbours clamped to the tile, rows then columns in float64, clipped and truncated
    (uint8; a float batch is left unrounded); a point outside the tile takes the fill. Gathers, no convolution."""
    k, c, h, w = x.shape
    outside = (u < 0) | (u >= w) | (v < 0) | (v >= h)
    xin, yin = u - 0.5, v - 0.5
    xi, yi = xin.floor(), yin.floor()
    dx, dy = (xin - xi).unsqueeze(1), (yin - yi).unsqueeze(1)
    xi, yi = xi.long() - 1, yi.long() - 1
    src = x.to(torch.float64).reshape(k, c, h * w)
    rows = []
    for j in range(4):
        yy = (yi + j).clamp(0, h - 1)
        taps = []
        for i in range(4):
            idx = (yy * w + (xi + i).clamp(0, w - 1)).view(k, 1, h * w).expand(k, c, h * w)
            taps.append(src.gather(2, idx).view(k, c, h, w))
        rows.append(_cubic(taps[0], taps[1], taps[2], taps[3], dx))
    out = _cubic(rows[0], rows[1], rows[2], rows[3], dy)
    fill_t = fill[:, :c].to(torch.float64).view(k, c, 1, 1)
    if x.is_floating_point():
        return torch.where(outside.unsqueeze(1), fill_t, out).to(x.dtype)
    out = out.clamp(0, 255).floor()
    return torch.where(outside.unsqueeze(1), fill_t.floor(), out).to(x.dtype)


def _affine(x: torch.Tensor, mt: torch.Tensor, mode: int, fill: torch.Tensor) -> torch.Tensor:
    """Resample each tile through its inverse matrix (pixel centres, PIL's convention), fill outside (the fill
    is in the batch's own units, as torchvision applies it)."""
    k, c, h, w = x.shape
    dev = x.device
    # mt is float64: coordinates near pixel edges must not flip as they would in float32.
    ys = torch.arange(h, device=dev, dtype=torch.float64).add_(0.5).view(1, h, 1)
    xs = torch.arange(w, device=dev, dtype=torch.float64).add_(0.5).view(1, 1, w)
    u = mt[:, 0, 0].view(-1, 1, 1) * xs + mt[:, 0, 1].view(-1, 1, 1) * ys + mt[:, 0, 2].view(-1, 1, 1)
    v = mt[:, 1, 0].view(-1, 1, 1) * xs + mt[:, 1, 1].view(-1, 1, 1) * ys + mt[:, 1, 2].view(-1, 1, 1)
    # grid_sample (align_corners=False) reads pixel coordinate p at normalised 2p/size - 1.
    grid = torch.stack([u * (2.0 / w) - 1.0, v * (2.0 / h) - 1.0], dim=-1)
    if mode == BICUBIC:
        return _bicubic(x, u, v, fill)
    xf = x.to(torch.float32)
    src = torch.cat([xf, torch.ones_like(xf[:, :1])], dim=1)
    if mode == BILINEAR:
        out = F.grid_sample(src, grid.to(torch.float32), mode="bilinear", padding_mode="zeros", align_corners=False)
    else:
        # Nearest in float64, so that a coordinate just below a pixel edge stays there (PIL computes in double).
        out = F.grid_sample(src.to(torch.float64), grid, mode="nearest", padding_mode="zeros", align_corners=False).to(
            torch.float32
        )
    mask = out[:, -1:]
    out = out[:, :-1]
    fill_t = fill[:, :c].to(torch.float32).view(k, c, 1, 1)
    if mode == BILINEAR:
        out = (out - fill_t) * mask + fill_t
    else:
        out = torch.where(mask < 0.5, fill_t.expand_as(out), out)
    return out if x.is_floating_point() else out.round_().clamp_(0, 255).to(x.dtype)
