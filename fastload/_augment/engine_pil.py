"""The PIL reference engine: executes one sample's plan with PIL, as torchvision's v1 PIL backend would.

``ds[i]`` runs it on its natively decoded tile (``pipeline.reference``).

Slow on purpose and per sample: it is the reference the batched (and later native) engines are tested
against, and what ``ds[i]`` will use. Geometry: ``crop`` -> ``resize(BILINEAR)`` (only from a source image)
-> ``FLIP_LEFT_RIGHT`` -> ``FLIP_TOP_BOTTOM`` -> ``Image.transform(AFFINE)`` with the plan's matrix,
resampling and fill; then the sample's steps in order through each operation's PIL kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._install import pil
from .ops import OPS
from .padding import assemble
from .plan import BICUBIC, BILINEAR, AugmentPlan

pil("the PIL reference engine (ds[i] with augmentations or a mask field)")  # else the hint naming Pillow and -SIMD
from PIL import Image  # noqa: E402

__all__ = ["mask_fills", "run_pil", "run_pil_mask"]


def run_pil(image: Any, plan: AugmentPlan, sample: int, *, source: bool = False) -> np.ndarray:
    """Execute sample ``sample``'s plan on ``image`` (HWC uint8 RGB array or RGB ``PIL.Image``).

    ``source=False``: ``image`` is the tile (already cropped and resized, ``out_hw`` of the sample).
    ``source=True``: ``image`` is the source picture and the plan's crop box and resize run first.
    Returns HWC uint8 with ``plan.channels`` channels."""
    img = image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image, dtype=np.uint8), "RGB")
    if img.mode != "RGB":
        raise ValueError(f"run_pil: expected an RGB image, got mode {img.mode!r}")
    if not 0 <= sample < plan.n:
        raise IndexError(f"run_pil: sample {sample} is outside the plan's batch of {plan.n}")
    geo = plan.geometry
    resample = {BILINEAR: Image.Resampling.BILINEAR, BICUBIC: Image.Resampling.BICUBIC}.get(
        int(geo.interpolation[sample]), Image.Resampling.NEAREST
    )
    img = _geometry(
        img,
        plan,
        sample,
        source,
        "run_pil",
        "tile",
        Image.Resampling.BILINEAR,
        resample,
        tuple(int(v) for v in geo.fill[sample]),
    )
    for name, params in plan.ops_of(sample):
        img = OPS[name].pil(img, params)
    out = np.asarray(img)
    return out[:, :, :1].copy() if plan.channels == 1 else out


def run_pil_mask(
    mask: Any, plan: AugmentPlan, sample: int, *, fill: int | None = None, source: bool = False, frame: Any = None
) -> np.ndarray:
    """Move one segmentation mask (H, W) uint8 with its image's geometry: crop and resize NEAREST (``source``; a
    padded RandomCrop's window padded with ``fill``; ``frame``: the image's ``Plan.frames`` row, its box resized
    whole, then the window), flips, the affine always NEAREST with ``fill`` outside; pixel operations skip masks.
    ``fill`` None: each transform's own mask fill, from the plan (``mask_fills``)."""
    m = np.asarray(mask)
    if m.dtype != np.uint8 or m.ndim != 2:
        raise TypeError(f"run_pil_mask: mask should be an (H, W) uint8 array, got {m.dtype} {m.shape}")
    pad_fill, affine_fill = mask_fills(plan, sample) if fill is None else (int(fill), int(fill))
    img = _geometry(
        Image.fromarray(m, "L"),
        plan,
        sample,
        source,
        "run_pil_mask",
        "mask",
        Image.Resampling.NEAREST,
        Image.Resampling.NEAREST,
        affine_fill,
        pad_fill,
        frame,
    )
    return np.asarray(img)


def mask_fills(plan: AugmentPlan, sample: int) -> tuple[int, int]:
    """Sample ``sample``'s mask fills: a padded RandomCrop's window's, the affine's (255 where a plan has none)."""
    geo = plan.geometry
    pad = geo.pad
    pad_fill = 255 if pad is None or pad.mask_fill is None else int(pad.mask_fill[sample])
    return pad_fill, 255 if geo.mask_fill is None else int(geo.mask_fill[sample])


def _geometry(
    img: Image.Image,
    plan: AugmentPlan,
    sample: int,
    source: bool,
    who: str,
    what: str,
    resize: Image.Resampling,
    resample: Image.Resampling,
    fill: Any,
    pad_fill: Any = None,
    frame: Any = None,
) -> Image.Image:
    """The sample's geometry, the same for an image and its mask but for the resampling and the fill: crop and
    ``resize`` (from a source picture), or a check of the tile's size; flips; the affine with ``resample``."""
    geo = plan.geometry
    oh, ow = (int(v) for v in geo.out_hw[sample])
    if source:
        if geo.crops is None:
            raise ValueError(f"{who}(source=True) needs a plan made with crop boxes (plan_batch(..., crops=...))")
        top, left, h, w = (int(v) for v in geo.crops[sample])
        pad = geo.pad
        if pad is not None and pad.active[sample]:  # a padded window: its decoded box, then assembled
            dh, dw = (int(v) for v in pad.decode_hw[sample])
            box = np.asarray(img.crop((left, top, left + w, top + h)).resize((dw, dh), resize))
            # the same window for a mask, padded with the mask's own fill (not the image's colour)
            colour = pad.fill[sample] if pad_fill is None else np.asarray(pad_fill)
            img = Image.fromarray(assemble(box, pad.rows[sample], pad.cols[sample], colour, flip=False))
        elif frame is not None:  # a resize then a crop of its pixels (Plan.frames), as torchvision runs them
            top, left, h, w, rh, rw, y, x = (int(v) for v in frame)
            img = img.crop((left, top, left + w, top + h)).resize((rw, rh), resize).crop((x, y, x + ow, y + oh))
        else:
            img = img.crop((left, top, left + w, top + h)).resize((ow, oh), resize)
    elif (img.height, img.width) != (oh, ow):
        raise ValueError(f"{who}: sample {sample} was planned as {oh}x{ow} but the {what} is {img.height}x{img.width}")
    if geo.hflip[sample]:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if geo.vflip[sample]:
        img = img.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
    if geo.has_affine[sample]:
        img = img.transform(
            (ow, oh),
            Image.Transform.AFFINE,
            tuple(float(v) for v in geo.affine[sample].ravel()),
            resample=resample,
            fillcolor=fill,
        )
    return img
