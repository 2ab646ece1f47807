"""``mask`` fields: a segmentation mask, one uint8 class id per pixel, moved with its image's geometry.

Column ``meta`` ('<u4', (2,)): height and width; the blob is an 8-bit grayscale PNG (lossless: a class id
must come back as itself, which JPEG would not do). Packing takes a PNG file (``FileImage``) or PNG bytes, a
PIL image or an (H, W) uint8 array: a PIL ``P`` image (VOC's palette PNGs) keeps its palette *indices*, the
class ids, never the colours they are drawn in; any other mode or shape is refused, naming the field and
sample.

A mask follows the dataset's one image field with transforms (``follows``): the image's plan (crop box,
resize, flips, a padded RandomCrop's window, the affine) is executed on the mask with NEAREST interpolation
and the mask's own fill, skipping pixel operations. Each transform gives it (``fill={"image": 0, "mask": 255}``,
``_augment/type_fill.py``); a plain fill is the image's and the mask's stays 255: torchvision's segmentation
reference's "ignore".
A mask must have its image's size. ``ds[i]`` shares the plan through ``ReadContext.plans`` (whichever of the
image and its mask reads first draws it); a batch through the batcher's ``plans`` (the image part records
its plan, mask parts fill after the image parts). The engines that move a mask are the augmentation's
(``_augment/masks.py``), handed to this module, which imports none of them: ``ds[i]`` runs the PIL reference
(``ReadContext.moved_mask``); a batch is one native call (``Batcher.move_masks``: csrc/mask.cc, libpng decode
and Pillow's nearest arithmetic on the pool's threads, GIL released) whose masks equal the reference's exactly.
"""

from __future__ import annotations

import io
from typing import Any, Callable

import numpy as np
import torch

from .._errors import SchemaError
from .._install import pil
from .._native import native
from ._codec import Codec, Column, NotFastPath, RowsPart, as_array, draw_plan, is_pil_image
from .image import file_bytes

MAX_SIDE = (1 << 31) - 1  # PNG's own limit
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# -- encoding -------------------------------------------------------------------------------------


def _pil_mask(img: Any) -> np.ndarray:
    """A PIL image as its (H, W) class ids: ``L`` as it is, ``P`` by its palette indices."""
    if img.mode not in ("L", "P"):
        raise SchemaError(
            f"a mask must be single-channel (PIL mode 'L', or 'P' whose palette indices are kept), "
            f"got mode {img.mode!r}; convert it to class ids first"
        )
    if img.mode == "P":
        img = img.copy()
        img.info.pop("transparency", None)
    return np.asarray(img, dtype=np.uint8)  # a P image's array is its indices


def mask_array(value: Any) -> np.ndarray:
    """``value`` (PNG file or bytes, PIL image, (H, W) uint8 array or tensor) as an (H, W) uint8 array, or
    SchemaError saying what was expected (the caller names the field and sample)."""
    Image = pil("a mask field (packing)")

    data = file_bytes(value)
    if data is not None:
        if not data.startswith(PNG_SIGNATURE):
            raise SchemaError("a mask file must be a PNG (lossless, 8-bit: L or palette P), this is not one")
        try:
            img = Image.open(io.BytesIO(data))
            img.load()
        except Exception as e:  # PIL's errors for a broken PNG vary (OSError, SyntaxError, ValueError...)
            raise SchemaError(f"the mask PNG does not decode ({type(e).__name__}: {e})") from None
        arr = _pil_mask(img)
    elif is_pil_image(value):
        arr = _pil_mask(value)
    else:
        arr = as_array(value)
        if arr is None:
            raise SchemaError(
                f"a mask field needs an (H, W) uint8 array, a PIL image (mode L or P) or a PNG file, "
                f"got {type(value).__name__}"
            )
        if arr.dtype != np.uint8:
            raise SchemaError(f"a mask array must be uint8 class ids, got {arr.dtype}")
        if arr.ndim != 2:
            raise SchemaError(f"a mask array must be (H, W), got shape {arr.shape}")
    if not arr.shape[0] or not arr.shape[1]:
        raise SchemaError(f"mask is empty (height {arr.shape[0]}, width {arr.shape[1]})")
    return np.ascontiguousarray(arr)


def encode_png(arr: np.ndarray) -> bytes:
    Image = pil("a mask field (packing)")

    out = io.BytesIO()
    Image.fromarray(arr, "L").save(out, format="PNG")
    return out.getvalue()


def decode_png(blob: Any, h: int, w: int) -> np.ndarray:
    """The stored PNG as an (h, w) uint8 array (natively, libpng); ValueError (the sample's failure) when it
    is not an 8-bit grayscale PNG of that size or does not decode."""
    return native().decode_mask(blob, h, w)


# -- following the image --------------------------------------------------------------------------


def follows(field: Any, pipelines: dict) -> str | None:
    """The image field whose plan mask ``field`` follows: the one image field with transforms; None when no
    image has any (the mask comes back as stored). ValueError when several could be meant."""
    if len(pipelines) > 1:
        raise ValueError(
            f"mask field '{field.name}' follows its image's transforms, but {len(pipelines)} fields "
            f"have transforms ({', '.join(sorted(pipelines))}): a dataset with masks can transform "
            f"one image field"
        )
    return next(iter(pipelines), None)


def size_mismatch(mask_hw: Any, image_hw: Any) -> str:
    return (
        f"mask is {int(mask_hw[0])}x{int(mask_hw[1])} but its image is {int(image_hw[0])}x{int(image_hw[1])}: "
        f"a mask must have its image's size to follow its geometry"
    )


# -- the codec ------------------------------------------------------------------------------------


class MaskCodec(Codec):
    kind = "mask"

    def columns(self, field: Any) -> tuple[Column, ...]:
        return (Column("meta", np.dtype("<u4"), (2,)),)

    def check_columns(self, field: Any, columns: dict, first: int = 0) -> str | None:
        meta = columns["meta"]
        bad = np.nonzero((meta == 0).any(axis=1) | (meta > MAX_SIDE).any(axis=1))[0]
        if bad.size:
            h, w = (int(v) for v in meta[bad[0]])
            return f"sample {first + int(bad[0])}: mask size {h}x{w} is impossible (each side must be 1..{MAX_SIDE})"
        return None

    def encode(self, field: Any, value: Any, opts: Any) -> tuple[tuple, bytes]:
        arr = mask_array(value)
        return (np.array(arr.shape, dtype="<u4"),), encode_png(arr)

    def check_blob(self, field: Any, blob: Any, row: Callable) -> str | None:
        h, w = (int(v) for v in row("meta"))
        try:
            decode_png(blob, h, w)
        except ValueError as e:
            return str(e)
        return None

    def describe(self, field: Any) -> str:
        return " uint8 class ids, PNG"  # after the kind, as ndarray's dtype

    def repr(self, field: Any) -> str:
        return f"Field({field.name!r}, 'mask')"  # Field has no ``mask`` constructor

    def read(self, field: Any, reader: Any, at: Any, ctx: Any) -> Any:
        h, w = (int(v) for v in reader.row(at, field.name, "meta", 0))
        blob = reader.blob(at, field.name, 0)
        if not ctx.decode:
            return bytes(blob)
        arr = decode_png(blob, h, w)
        image = follows(field, ctx.pipelines)
        if image is not None:
            if ctx.plans is None:
                raise ValueError(f"mask field '{field.name}' needs its image's plan, which this reader does not share")
            image_hw = tuple(int(v) for v in reader.row(at, image, "meta", 0)[:2])
            if arr.shape != image_hw:
                raise ValueError(size_mismatch(arr.shape, image_hw))
            arr = ctx.moved_mask(arr, draw_plan(ctx, image, reader, at))
        return torch.from_numpy(np.array(arr))  # writable: torch shares it

    def batch(self, field: Any, dataset: Any) -> "MaskPart":
        try:
            image = follows(field, dataset.pipelines)
        except ValueError as e:
            raise NotFastPath(str(e)) from None
        p = None if image is None else dataset.pipelines[image]
        if p is None or p.output_size is None:
            raise NotFastPath(
                f"mask field '{field.name}' follows an image with no transform giving a fixed output "
                f"size (e.g. RandomResizedCrop(224)); masks of different sizes cannot be batched"
            )
        alone = p.fallback + p.after  # before and after ToDtype/Normalize
        if alone:  # run on the image alone: a geometric one would move the image and not its mask
            import warnings

            warnings.warn(
                f"fastload: mask field '{field.name}' follows the native transforms of image '{image}' "
                f"only; {', '.join(t.name for t in alone)} run per sample on the image alone, so a "
                f"geometric one moves the image and not its mask (use fastload.transforms' equivalents "
                f"for geometry)",
                UserWarning,
                stacklevel=2,
            )
        return MaskPart(field, image, p.output_size)


class MaskPart(RowsPart):
    """(n, H, W) uint8 rows, each mask moved with its image's plan of this batch (the batcher's ``plans``, which
    the image part fills first: ``after_images``), in one native call (``Batcher.move_masks``)."""

    after_images = True

    def __init__(self, field: Any, image: str, out_hw: tuple[int, int]):
        super().__init__(field)
        self.image, self.out_hw = image, out_hw

    def buffers(self, batcher: Any, b: int, alloc: Callable) -> dict:
        return {self.name: alloc((b,) + tuple(self.out_hw), torch.uint8)}

    def fill(self, batcher: Any, slot: Any, at: Any, indices: np.ndarray, rng: Any, pool: Any, failed: dict) -> None:
        plan = batcher.plans.get(self.image)
        if plan is None:
            raise RuntimeError(f"mask field '{self.name}': its image '{self.image}' was not planned before it")
        n = len(indices)
        reader = batcher.reader
        meta = reader.take(at, self.name, "meta").astype(np.int64)
        image_hw = reader.take(at, self.image, "meta")[:, :2].astype(np.int64)
        for k in np.flatnonzero((meta != image_hw).any(axis=1)):
            failed.setdefault(int(k), f"field '{self.name}': {size_mismatch(meta[k], image_hw[k])}")
        regions, region, offset, length = reader.blob_sources(at, self.name)
        rows = slot.arrays[self.name][:n]
        for k, msg in batcher.move_masks(pool, (regions, region, offset, length), meta, plan, rows):
            failed.setdefault(int(k), f"field '{self.name}': {msg}")


MASK = MaskCodec()
