"""Turn source values into stored form (runs in the pack's worker processes).

Image modes (``--image-mode``):

=============  ====================================================================================
passthrough    JPEG files are stored byte for byte; any other input is an error
jpeg           every image is decoded, shrunk to ``max_side`` if larger, re-encoded at ``quality``
raw            every image is decoded, shrunk to ``max_side`` if larger, stored as uint8 HxWx3
auto           JPEG input within ``max_side`` passes through untouched; larger JPEGs are re-encoded;
               other images are stored raw when small (<= 65,536 pixels, e.g. CIFAR) and as JPEG
               at ``quality`` otherwise
=============  ====================================================================================

Images are RGB, like torchvision's default loader: grayscale and palette inputs are converted.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .._errors import SchemaError
from .._native import is_jpeg, native
from .._schema import Field, Schema, _as_array, _is_pil_image
from ..formats._layout import IMAGE_JPEG, IMAGE_RAW
from ..sources._base import FileImage

IMAGE_MODES = ("auto", "passthrough", "jpeg", "raw")
SMALL_IMAGE_PIXELS = 1 << 16
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(frozen=True)
class ImageOptions:
    mode: str = "auto"
    max_side: int | None = None
    quality: int = 90
    #: how stored JPEGs are validated: "decode" (a full 1/8-scale decode: catches any corrupt data)
    #: or "header" (header plus end-of-image marker: catches truncation, ~10x cheaper)
    check: str = "decode"

    def __post_init__(self) -> None:
        if self.mode not in IMAGE_MODES:
            raise ValueError(f"image_mode={self.mode!r} should be one of {', '.join(IMAGE_MODES)}")
        if self.max_side is not None and self.max_side < 1:
            raise ValueError(f"max_side={self.max_side} should be a positive number of pixels")
        if self.check not in ("decode", "header"):
            raise ValueError(f"check={self.check!r} should be 'decode' or 'header'")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality={self.quality} should be between 1 and 100")
        if self.mode == "passthrough" and self.max_side is not None:
            raise ValueError("max_side cannot be used with image_mode='passthrough' (bytes are stored "
                             "untouched); use image_mode='auto' or 'jpeg' to shrink large images")


def _check_jpeg(data: bytes, check: str = "decode") -> tuple[int, int]:
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
    from PIL import Image

    if _is_pil_image(value):
        return value
    arr = _as_array(value)
    if arr is None:
        raise SchemaError(f"an image field needs a PIL image, an image file or a uint8 array, got "
                          f"{type(value).__name__}")
    if arr.dtype != np.uint8:
        raise SchemaError(f"an image array must be uint8, got {arr.dtype}")
    if arr.ndim == 3 and arr.shape[0] in (1, 3) and arr.shape[2] not in (1, 3) and type(value).__module__.startswith("torch"):
        arr = arr.transpose(1, 2, 0)  # torch CHW -> HWC
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] == 3)):
        raise SchemaError(f"an image array must be HxW, HxWx1 or HxWx3 (CHW for tensors), got shape {arr.shape}")
    return Image.fromarray(np.ascontiguousarray(arr))


def encode_image(value: Any, opts: ImageOptions) -> tuple[tuple, bytes]:
    data = None
    if isinstance(value, FileImage):
        with open(value.path, "rb") as fh:
            data = fh.read()
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
    if data is not None and is_jpeg(data):
        h, w = _check_jpeg(data, opts.check)
        if opts.mode == "passthrough" or (opts.mode == "auto" and _fit((w, h), opts.max_side) is None):
            return (np.array([h, w, IMAGE_JPEG], dtype="<u4"),), data
    elif opts.mode == "passthrough":
        raise SchemaError("image_mode='passthrough' stores JPEG files untouched, but this image is not a JPEG; "
                          "use image_mode='auto', 'jpeg' or 'raw'")
    from PIL import Image

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
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=opts.quality)
    return (np.array([h, w, IMAGE_JPEG], dtype="<u4"),), out.getvalue()


def encode_value(field: Field, value: Any, opts: ImageOptions) -> tuple[tuple, bytes | None]:
    kind = field.kind
    if kind == "image":
        return encode_image(value, opts)
    if kind == "int":
        arr = _as_array(value)
        if arr is not None:
            if arr.size != 1 or arr.dtype.kind not in "biu":
                raise SchemaError(f"expected an integer, got an array of shape {arr.shape} dtype {arr.dtype}")
            value = arr.reshape(()).item()
        if isinstance(value, (bool, np.bool_)):
            value = int(value)
        if not isinstance(value, (int, np.integer)):
            raise SchemaError(f"expected an integer, got {type(value).__name__} {value!r}")
        value = int(value)
        if not INT64_MIN <= value <= INT64_MAX:
            raise SchemaError(f"integer {value} does not fit in 64 bits")
        return (value,), None
    if kind == "float":
        arr = _as_array(value)
        if arr is not None:
            if arr.size != 1 or arr.dtype.kind not in "biuf":
                raise SchemaError(f"expected a number, got an array of shape {arr.shape} dtype {arr.dtype}")
            value = arr.reshape(()).item()
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise SchemaError(f"expected a float, got {type(value).__name__} {value!r}")
        return (float(value),), None
    if kind == "ndarray":
        arr = _as_array(value)
        if arr is None:
            arr = np.asarray(value)
        dt = np.dtype(field.dtype)
        if arr.dtype != dt:
            if not np.can_cast(arr.dtype, dt, "safe"):
                raise SchemaError(f"array of dtype {arr.dtype} cannot be stored as {dt} without loss")
            arr = arr.astype(dt)
        if arr.ndim != len(field.shape) or any(d is not None and d != a for d, a in zip(field.shape, arr.shape)):
            want = tuple("*" if d is None else d for d in field.shape)
            raise SchemaError(f"array of shape {arr.shape} does not match the schema's shape {want} "
                              f"(give an explicit schema with None for dimensions that vary)")
        if field.fixed_size:
            return (arr,), None
        return (np.array(arr.shape, dtype="<i8"),), np.ascontiguousarray(arr, dtype=dt.newbyteorder("<")).tobytes()
    if kind == "bytes":
        if isinstance(value, str) or not isinstance(value, (bytes, bytearray, memoryview)):
            raise SchemaError(f"expected bytes, got {type(value).__name__}")
        return (), bytes(value)
    if kind == "str":
        if not isinstance(value, str):
            raise SchemaError(f"expected str, got {type(value).__name__}")
        try:
            return (), value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise SchemaError(f"string is not valid unicode ({e})") from None
    raise SchemaError(f"unknown field kind {kind!r}")


def encode_sample(schema: Schema, values: Sequence[Any], opts: ImageOptions) -> list:
    """Encode one sample; errors name the field (the caller adds the sample and source)."""
    if len(values) != len(schema):
        raise SchemaError(f"sample has {len(values)} fields, the schema has {len(schema)} ({list(schema.names)})")
    out = []
    for f, v in zip(schema, values):
        try:
            out.append(encode_value(f, v, opts))
        except SchemaError as e:
            raise SchemaError(f"field '{f.name}': {e}") from None
    return out
