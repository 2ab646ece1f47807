"""The field kinds, listed once. ``Field.kind`` names resolve here; everything else asks the field's codec.

A new field kind: one module defining a ``Codec`` subclass (``_codec.py`` says what each method does; a kind
stored as fixed-size columns can batch with ``FixedPart``, one read per sample from a blob with ``ObjectPart``)
and an instance of it, plus one line below (or ``register(codec)`` at run time). The schema's checks and JSON,
the formats' columns and checks, the packer's encoding, ``ds[i]``, the batcher's slots and fill, the collate
stage, ``__getitems__`` and ``fastload inspect`` all follow.
"""

from __future__ import annotations

from typing import Any

from .._errors import SchemaError
from . import array, image, mask, number, text
from ._codec import Codec

# Order: the order ``Field``'s error message lists the kinds in.
CODECS: dict[str, Codec] = {
    c.kind: c
    for c in (
        image.IMAGE,
        number.INT,
        number.FLOAT,
        array.NDARRAY,
        text.BYTES,
        text.STR,
        mask.MASK,
    )
}


def register(codec: Codec) -> Codec:
    """Add a field kind at run time (a plug-in's); ValueError if its name is taken. Every process that packs or
    reads the kind must register it (forked workers inherit it; a module the dataset's users import does it)."""
    if not isinstance(codec, Codec) or not isinstance(codec.kind, str) or not codec.kind.isidentifier():
        raise ValueError(f"register: {codec!r} should be a Codec whose kind is an identifier")
    if codec.kind in CODECS:
        raise ValueError(f"register: field kind {codec.kind!r} is already registered")
    CODECS[codec.kind] = codec
    return codec


def kinds() -> tuple[str, ...]:
    """Every registered field kind's name, in registry order."""
    return tuple(CODECS)


def codec_of(field: Any) -> Codec:
    """The codec of ``field``'s kind; SchemaError naming the field and the kinds there are."""
    codec = CODECS.get(field.kind) if isinstance(field.kind, str) else None
    if codec is None:
        raise SchemaError(f"field '{field.name}': kind {field.kind!r} is not one of {', '.join(CODECS)}")
    return codec


def blob_problem(schema: Any, segment: Any, indices: Any, first: int = 0) -> str | None:
    """The first stored value of ``segment`` (a format's segment: ``row``, ``blob``) at ``indices`` that its kind's
    ``Codec.check_blob`` refuses, as ``sample N: field 'x': why``; None when all pass (the formats' verify)."""
    checked = [(f, codec_of(f)) for f in schema if type(codec_of(f)).check_blob is not Codec.check_blob]
    for i in indices if checked else ():
        for f, codec in checked:
            msg = codec.check_blob(f, segment.blob(f.name, i), lambda col, f=f, i=i: segment.row(f.name, col, i))
            if msg is not None:
                return f"sample {first + i}: field '{f.name}': {msg}"
    return None
