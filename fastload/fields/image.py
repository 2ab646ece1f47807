"""``image`` fields: an RGB picture, stored as JPEG bytes or raw uint8 HxWx3 (``--image-mode``).

Column ``meta`` ('<u4', (3,)): height, width and encoding (``IMAGE_JPEG``/``IMAGE_RAW``, defined once in the
native core that decodes them, csrc/batch.h); the blob holds the JPEG or the raw pixels. Packing decodes,
shrinks and re-encodes as ``ImageOptions`` (pack/_encode.py) says; ``ds[i]`` decodes natively (with the
loader's transforms' kernels); a batch is one decoder call per field (``_images.ImageDecoding``) into an
(n, H, W, 3) slot buffer, collated NCHW in channels_last memory, ToDtype/Normalize applied there on the CPU
unless a device prefetcher does it.
"""

from __future__ import annotations

import io
import os
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import torch

from .._errors import SchemaError
from .._install import pil
from .._native import is_jpeg, native
from ._codec import Codec, Column, NotFastPath, Part, as_array, draw_plan, exact_or_bad, is_pil_image

IMAGE_JPEG = int(native().IMAGE_JPEG)
IMAGE_RAW = int(native().IMAGE_RAW)
IMAGE_ENCODINGS = (IMAGE_JPEG, IMAGE_RAW)
MAX_JPEG_SIDE = 65535  # the JPEG format's own limit
MAX_RAW_SIDE = (1 << 31) - 1
SMALL_IMAGE_PIXELS = 1 << 16  # image_mode='auto' stores a non-JPEG this small raw (e.g. CIFAR)


class FileImage:
    """An image file on disk, read by the worker that encodes it (``ImageCodec.encode``), not by the source."""

    __slots__ = ("path",)

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)

    def __repr__(self) -> str:
        return f"FileImage({self.path!r})"


# -- encoding -------------------------------------------------------------------------------------


def check_jpeg(data: bytes, check: str = "decode") -> tuple[int, int]:
    """Return (height, width) of a JPEG after validating it (see ImageOptions.check), or raise."""
    C = native()
    h, w, _ = C.jpeg_info(data)
    if check == "header":
        if data.rstrip(b"\x00")[-2:] != b"\xff\xd9":
            raise ValueError("JPEG has no end-of-image marker (truncated file?)")
        return h, w
    C.decode_crop_resize(data, (0, 0, h, w), (max(1, -(-h // 8)), max(1, -(-w // 8))), False)
    return h, w


def _fit(size: tuple[int, int], max_side: int | None) -> tuple[int, int] | None:
    """New (width, height) so the longer side is max_side, or None if it already fits."""
    w, h = size
    if max_side is None or max(w, h) <= max_side:
        return None
    s = max_side / max(w, h)
    return max(1, round(w * s)), max(1, round(h * s))


def _to_pil(value: Any):
    Image = pil("an image field given as an array (packing)")

    if is_pil_image(value):
        return value
    arr = as_array(value)
    if arr is None:
        raise SchemaError(
            f"an image field needs a PIL image, an image file or a uint8 array, got {type(value).__name__}"
        )
    if arr.dtype != np.uint8:
        raise SchemaError(f"an image array must be uint8, got {arr.dtype}")
    if (
        arr.ndim == 3
        and arr.shape[0] in (1, 3)
        and arr.shape[2] not in (1, 3)
        and type(value).__module__.startswith("torch")
    ):
        arr = arr.transpose(1, 2, 0)  # torch CHW -> HWC
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] == 3)):
        raise SchemaError(f"an image array must be HxW, HxWx1 or HxWx3 (CHW for tensors), got shape {arr.shape}")
    return Image.fromarray(np.ascontiguousarray(arr))


def encoded_image(cell: Any) -> Any:
    """A source's cell of encoded image data, as the value the image codec stores as it is (a JPEG within
    ``max_side``, byte for byte): bytes stay bytes; a ``{"bytes": ..., "path": ...}`` record (a Hugging Face
    image column read with ``Image(decode=False)``, and the same struct in its Parquet files) gives its bytes,
    or, without bytes, ``FileImage(path)``. Anything else is returned unchanged (pixels: encoded by the codec,
    with a warning where that loses detail). For source adapters (``sources/``)."""
    if isinstance(cell, Mapping) and set(cell) <= {"bytes", "path"}:
        data, path = cell.get("bytes"), cell.get("path")
        if data is not None:
            return bytes(data)
        if path:
            return FileImage(path)
        raise SchemaError("the image record holds neither bytes nor a path")
    return cell


def untouched_jpeg(img: Any) -> bytes | None:
    """The JPEG file a PIL image was decoded from, when the image is still exactly that file's pixels (opened with
    ``Image.open(path)``, not converted, resized or drawn on since): its bytes, else None.

    An image changed in place (``paste``, ``ImageDraw``, ``thumbnail``) keeps its class and ``format``, so the
    file is decoded again and its pixels compared: the bytes are stored only when they give the same pixels."""
    path = getattr(img, "filename", None)
    if getattr(img, "format", None) != "JPEG" or not path or not os.path.isfile(path):
        return None
    from PIL import Image

    try:
        with open(path, "rb") as fh:
            data = fh.read()
        if not is_jpeg(data):
            return None
        fresh = Image.open(io.BytesIO(data))
        if fresh.size != img.size or fresh.mode != img.mode:
            return None
        fresh.load()
        return data if fresh.tobytes() == img.tobytes() else None
    except (OSError, ValueError, SyntaxError):  # the file changed since, or PIL cannot read it again
        return None


def file_bytes(value: Any) -> bytes | None:
    """The encoded bytes a source value stands for (a ``FileImage``'s file, or bytes as given), else None."""
    if isinstance(value, FileImage):
        with open(value.path, "rb") as fh:
            return fh.read()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return None


# Lossy re-encodes nobody asked for (image_mode='auto' storing pixels as JPEG): the pack warns once (pack/_local.py).
_NOTES = threading.local()


@contextmanager
def reencodings() -> Iterator[list[str]]:
    """Collects, for the images encoded in the block on this thread, why any was re-encoded with loss unasked."""
    before = getattr(_NOTES, "notes", None)
    _NOTES.notes = notes = []
    try:
        yield notes
    finally:
        _NOTES.notes = before


def _note_reencoded(value: Any, data: bytes | None, quality: int) -> None:
    notes = getattr(_NOTES, "notes", None)
    if notes is None:
        return
    if data is not None:
        what = "its encoded bytes are not a JPEG (PNG, WebP, ...)"
    elif is_pil_image(value):
        what = (
            "it is a PIL image not opened from a JPEG file, or changed since (converted, resized, drawn on), so "
            "no JPEG bytes of it are at hand"
        )
    else:
        what = f"it is a {type(value).__name__} of pixels, not encoded bytes"
    notes.append(
        f"re-encoded as JPEG at quality={quality} (lossy: its pixels differ slightly from the source's), "
        f"because {what} and it is larger than {SMALL_IMAGE_PIXELS:,} pixels (smaller ones are stored raw)"
    )


def encode_image(value: Any, opts: Any) -> tuple[tuple, bytes]:
    """``(meta,), blob`` for one image; ``opts``: the packer's ``ImageOptions`` (mode, max_side, quality, check).
    Encoded JPEG bytes at hand (a file, bytes, an untouched PIL image from a JPEG file) are stored as they are
    unless ``max_side`` shrinks them or ``mode='jpeg'``; pixels are stored raw or, when large, as JPEG at
    ``quality``, which, unasked (``mode='auto'``), is noted for the pack's warning (``reencodings``)."""
    data = file_bytes(value)
    if data is None and is_pil_image(value) and opts.mode in ("auto", "passthrough"):
        data = untouched_jpeg(value)  # jpeg/raw modes decode anyway: the image's own pixels serve as well
    if data is not None and is_jpeg(data):
        h, w = check_jpeg(data, opts.check)
        if opts.mode == "passthrough" or (opts.mode == "auto" and _fit((w, h), opts.max_side) is None):
            return (np.array([h, w, IMAGE_JPEG], dtype="<u4"),), data
    elif opts.mode == "passthrough":
        what = (
            "encoded bytes that are not a JPEG"
            if data is not None
            else f"pixels (a {type(value).__name__}), not a JPEG file's bytes"
        )
        raise SchemaError(
            f"image_mode='passthrough' stores JPEG files untouched, but this image is {what}; "
            f"use image_mode='auto', 'jpeg' or 'raw'"
        )
    Image = pil("packing an image that is not a JPEG kept as it is (re-encoding, resizing)")

    if data is not None:
        img = Image.open(io.BytesIO(data))
        new = _fit(img.size, opts.max_side)
        if new is not None and img.format == "JPEG":
            img.draft("RGB", new)  # DCT-scaled decode when shrinking a lot
        img.load()
    else:
        img = _to_pil(value)
    if img.mode != "RGB":
        img = img.convert("RGB")
    new = _fit(img.size, opts.max_side)
    if new is not None:
        img = img.resize(new, Image.BICUBIC, reducing_gap=3.0)
    w, h = img.size
    if not w or not h:
        raise SchemaError(f"image is empty (height {h}, width {w})")
    was_jpeg = data is not None and is_jpeg(data)
    raw = opts.mode == "raw" or (opts.mode == "auto" and not was_jpeg and w * h <= SMALL_IMAGE_PIXELS)
    if raw:
        arr = np.asarray(img, dtype=np.uint8)
        return (np.array([h, w, IMAGE_RAW], dtype="<u4"),), arr.tobytes()
    if opts.mode == "auto" and new is None:  # neither mode='jpeg' nor max_side asked for a new encoding
        _note_reencoded(value, data, opts.quality)
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=opts.quality)
    return (np.array([h, w, IMAGE_JPEG], dtype="<u4"),), out.getvalue()


# -- the codec ------------------------------------------------------------------------------------


class ImageCodec(Codec):
    kind = "image"

    def columns(self, field: Any) -> tuple[Column, ...]:
        return (Column("meta", np.dtype("<u4"), (3,)),)

    def expected_blob_length(self, field: Any, columns: dict) -> np.ndarray:
        meta = columns["meta"].astype(np.int64)
        # h * w * 3 < 2**66 can overflow int64: flag such rows (-2, never matches) instead of wrapping
        return np.where(meta[:, 2] == IMAGE_RAW, exact_or_bad(meta[:, :2], 3), -1)

    def check_columns(self, field: Any, columns: dict, first: int = 0) -> str | None:
        meta = columns["meta"]
        bad = np.nonzero(~np.isin(meta[:, 2], IMAGE_ENCODINGS))[0]
        if bad.size:
            return f"sample {first + int(bad[0])}: image encoding {int(meta[bad[0], 2])} is not 0 (jpeg) or 1 (raw)"
        # no image is empty; a JPEG side fits 16 bits; the native core indexes pixels with int32
        limit = np.where(meta[:, 2] == IMAGE_JPEG, MAX_JPEG_SIDE, MAX_RAW_SIDE)
        bad = np.nonzero((meta[:, :2] == 0).any(axis=1) | (meta[:, :2] > limit[:, None]).any(axis=1))[0]
        if bad.size:
            h, w, enc = (int(v) for v in meta[bad[0]])
            kind = "JPEG" if enc == IMAGE_JPEG else "raw"
            return (
                f"sample {first + int(bad[0])}: {kind} image size {h}x{w} is impossible (each side must be "
                f"1..{MAX_JPEG_SIDE if enc == IMAGE_JPEG else MAX_RAW_SIDE})"
            )
        return None

    def encode(self, field: Any, value: Any, opts: Any) -> tuple[tuple, bytes]:
        return encode_image(value, opts)

    def read(self, field: Any, reader: Any, at: Any, ctx: Any) -> Any:
        h, w, enc = (int(v) for v in reader.row(at, field.name, "meta", 0))
        blob = reader.blob(at, field.name, 0)
        if not ctx.decode:
            return bytes(blob)
        pipeline = ctx.pipelines.get(field.name)
        if pipeline is not None:  # its plan drawn once per ds[i], shared with the masks that follow it
            plan = None if ctx.plans is None else draw_plan(ctx, field.name, reader, at)
            return ctx.transformed_image(pipeline, blob, h, w, enc, plan)
        if enc == IMAGE_JPEG:
            arr = native().decode_jpeg(blob)
            if arr.shape[:2] != (h, w):
                raise ValueError(f"JPEG is {arr.shape[1]}x{arr.shape[0]}, the shard records {w}x{h}")
        else:
            arr = np.frombuffer(blob, dtype=np.uint8).reshape(h, w, 3).copy()
        return torch.from_numpy(arr).permute(2, 0, 1)

    def batch(self, field: Any, dataset: Any) -> "ImagePart":
        p = dataset.pipelines.get(field.name)
        if p is None or p.output_size is None:
            raise NotFastPath(
                f"image field '{field.name}' has no transform giving a fixed output size "
                f"(e.g. RandomResizedCrop(224)); images of different sizes cannot be batched"
            )
        return ImagePart(field, p)


class ImagePart(Part):
    """One decoder call per batch (the batcher's ``images``: ``_images.ImageDecoding``) into (n, H, W, 3)
    rows, on the host or, for GPU decoders, on the device."""

    def __init__(self, field: Any, pipeline: Any):
        super().__init__(field)
        self.pipeline = pipeline
        #: callables after ToDtype/Normalize: the fill stage normalizes on the CPU into the slot's float rows
        #: (``after_key``) and runs them there, so the batch leaves as those floats (``_fill/images.py``)
        self.after_key = f"{self.name}:after" if pipeline.on_floats else None
        # ToDtype/Normalize left for the collate stage or the device, or None
        self.tensor = pipeline.batch_tensor if pipeline.batch_tensor else None

    def buffers(self, batcher: Any, b: int, alloc: Callable) -> dict:
        h, w = self.pipeline.output_size
        out = batcher.images.buffers(self.name, (b, h, w, 3), alloc)
        if self.after_key is not None:  # NHWC: the collated NCHW view is channels_last, as the uint8 rows'
            out[self.after_key] = alloc((b, h, w, 3), self.pipeline.tensor.dtype)
        return out

    def fill(
        self, batcher: Any, slot: Any, at: Any, indices: np.ndarray, rng: Any, pool: Any, failed: dict
    ) -> list | None:
        """Decodes the batch; for a GPU decoder's rows returns ``[event]``, the event after its last write of
        them (``replace`` renews it after fix-ups), which the batch's tensor carries to the device prefetcher."""
        images = batcher.images
        for k, msg in images.fill(pool, self.pipeline, self.field, slot, batcher.reader, at, rng, batcher.plans):
            failed.setdefault(k, f"field '{self.name}': {msg}")
        return None if images.device is None else [images.ready_event(slot.tensors[self.name])]

    def replace(self, batcher: Any, slot: Any, n: int, obj: Any, bad: list, sources: list) -> None:
        if batcher.images.device is not None:  # GPU decoders' rows: on a stream of the decoders', complete on return
            batcher.images.move_rows(slot.tensors[self.name], bad, sources)
            obj[0] = batcher.images.ready_event(slot.tensors[self.name])  # after the fix-ups, on the rows stream
            return
        for key in (self.name, self.after_key):
            if key is not None:
                arr = slot.tensors[key]
                for k, src in zip(bad, sources):
                    arr[k] = arr[src]

    def collate(self, tensors: dict, n: int, obj: Any, tensor_transforms: bool, cpu_output: Callable) -> Any:
        if self.after_key is not None:  # normalized and transformed by the fill stage
            return tensors[self.after_key][:n].permute(0, 3, 1, 2)
        images = tensors[self.name][:n].permute(0, 3, 1, 2)  # NCHW, channels_last
        if obj is not None and obj[0] is not None:  # a GPU decoder's rows: readers wait on this on the device
            images.fastload_ready = obj[0]
        if tensor_transforms and self.tensor is not None:
            images = self.tensor.apply(images, cpu_output(self.name, self.tensor, images))
        return images

    def split(self, value: Any, n: int) -> list:
        return list(value.unbind(0))  # CHW views of the NCHW batch


IMAGE = ImageCodec()
