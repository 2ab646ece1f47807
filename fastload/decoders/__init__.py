"""Image decoders that execute fastload's plans: one interface, ``decode(sources, crops, flips, out)``.

``_base.py``: the interface and :class:`ImageSources`, a batch's encoded images as every decoder reads them.
``native.py``: :class:`NativeDecoder`, the native core's ``decode_batch`` on CPU threads (the default).
``dali.py``: :class:`DaliDecoder`, NVIDIA DALI on the GPU (or DALI's CPU-only mode).
``nvjpeg.py``: :class:`NvjpegDecoder`, torchvision's batched nvJPEG decoder on the GPU.
``hybrid.py``: ``HybridDecoder``, the native and a GPU decoder sharing each batch (``decoder="auto"``).
Importing this package is cheap: the decoder modules load on first use of their names (the loader's
native path never loads ``dali.py``/``nvjpeg.py``), DALI and torchvision only when a decoder is made.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["DaliDecoder", "ImageSources", "NativeDecoder", "NvjpegDecoder"]
_HOMES = {"DaliDecoder": ".dali", "ImageSources": "._base", "NativeDecoder": ".native", "NvjpegDecoder": ".nvjpeg"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
