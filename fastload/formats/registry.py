"""The on-disk formats, listed once. Everything outside a format's own module asks here.

A new on-disk format: one module defining a ``Format`` subclass (``_format.py`` says what each method
does) and an instance of it, plus one line below. ``fastload pack --format``'s choices, the manifest's
accepted layouts, ``read_manifest``'s detection order, and the packer's destination checks all follow.

Remote datasets are not a format: a URL holds shards (the same files and manifest), reached through
fsspec and the local cache (``remote.py``); reading a cached shard is reading a shard.
"""

from __future__ import annotations

from .._errors import FormatError
from . import lmdb, shards
from ._format import Format

FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        shards.FORMAT,
        lmdb.FORMAT,
    )
}


DEFAULT_FORMAT = "shards"  # ``pack(format=...)``'s and ``fastload pack --format``'s default


def format_named(name: str, where: str = "format") -> Format:
    """The format called ``name`` (a manifest's layout, ``pack(format=...)``); ValueError naming the choices."""
    f = FORMATS.get(name) if isinstance(name, str) else None
    if f is None:
        raise ValueError(f"{where}={name!r} should be one of {', '.join(repr(n) for n in FORMATS)}")
    return f


def format_of(manifest) -> Format:
    """The format of an opened dataset's manifest."""
    f = FORMATS.get(manifest.layout)
    if f is None:  # Manifest.parse accepts only registered layouts; a hand-made Manifest might not be
        raise FormatError(f"layout {manifest.layout!r} is not one of {', '.join(repr(n) for n in FORMATS)}")
    return f
