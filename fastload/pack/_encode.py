"""Turn source values into stored form (runs in the pack's worker processes): each field kind's codec
encodes its values (``fields/``; images in ``fields/image.py``), with the options below.

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

from dataclasses import dataclass
from typing import Any, Sequence

from .._errors import SchemaError
from .._schema import Field, Schema
from ..fields import codec_of

IMAGE_MODES = ("auto", "passthrough", "jpeg", "raw")


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
            raise ValueError(
                "max_side cannot be used with image_mode='passthrough' (bytes are stored "
                "untouched); use image_mode='auto' or 'jpeg' to shrink large images"
            )


def encode_value(field: Field, value: Any, opts: ImageOptions) -> tuple[tuple, bytes | None]:
    """``(column values, blob)`` for one value: the field kind's codec's ``encode`` (fields/)."""
    return codec_of(field).encode(field, value, opts)


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
