"""Access to the compiled core ``fastload._C`` with an actionable error when it is missing."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def native():
    try:
        from . import _C
    except ImportError as e:
        raise ImportError(
            "fastload's native core (fastload._C) is not built: run `pip install -e .` (or `make install`) "
            "in the source tree; it needs g++ and libjpeg-turbo headers (Debian: apt-get install g++ "
            f"libjpeg62-turbo-dev). Original error: {e}"
        ) from e
    return _C


JPEG_SOI = b"\xff\xd8\xff"


def is_jpeg(data) -> bool:
    return bytes(data[:3]) == JPEG_SOI
