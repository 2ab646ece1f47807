"""Field kinds: one codec per kind (``Field.kind``), each saying what the kind does at every stage.

``_codec.py``: the interface (:class:`Codec`, a batcher's :class:`Part`, ``Column``) and shared helpers.
``number.py`` (int, float), ``array.py`` (ndarray, fixed or variable shape; Pad/Bucket batches),
``image.py`` (image: JPEG or raw, the packer's image encoding), ``text.py`` (bytes, str), ``mask.py`` (mask:
uint8 class ids as PNG, moved with its image's plan).
``registry.py``: the kinds, listed once; ``codec_of(field)``, ``register(codec)``.
"""

from __future__ import annotations

from ._codec import Codec, Column, FixedPart, NotFastPath, ObjectPart, Part, ReadContext, RowsPart
from .registry import CODECS, codec_of, kinds, register

__all__ = [
    "CODECS",
    "Codec",
    "Column",
    "FixedPart",
    "NotFastPath",
    "ObjectPart",
    "Part",
    "ReadContext",
    "RowsPart",
    "codec_of",
    "kinds",
    "register",
]
