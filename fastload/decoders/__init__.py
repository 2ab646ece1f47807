"""Image decoders that execute fastload's plans: one interface, ``decode(sources, plan, out)``, and one registry.

``_base.py``: the interface, :class:`DecoderKind` (what a decoder registers), ``JpegOnly`` and
:class:`ImageSources`, a batch's encoded images as every decoder reads them.
``native.py``: :class:`NativeDecoder`, the native core's ``decode_batch`` on CPU threads (the default).
``exact.py``: the same at full size (no DCT scaling): PIL's pixels, for evaluation (``decoder="exact"``).
``dali.py``: :class:`DaliDecoder`, NVIDIA DALI on the GPU (or DALI's CPU-only mode).
``nvjpeg.py``: :class:`NvjpegDecoder`, torchvision's batched nvJPEG decoder on the GPU.
``hybrid.py``: ``HybridDecoder``, the native and a GPU decoder sharing each batch (``decoder="auto"``).

A new decoder is one new module defining ``KIND = DecoderKind(name, make, ...)`` (``_base.py`` says what each
field means) plus one line in :data:`REGISTRY`. Importing this package is cheap: a decoder's module loads on
first use of its name (the loader's native path never loads ``dali.py``/``nvjpeg.py``), DALI and torchvision
only when a decoder is made or probed.
"""

from __future__ import annotations

import importlib
from typing import Any

# The registry: each decoder once, its ``decoder=`` name -> the module defining its ``KIND``. Order matters
# for 'auto', which pairs native threads with the first usable GPU decoder listed (DALI first: it uses the
# GPU's hardware JPEG decoder).
REGISTRY = {
    "native": ".native",
    "exact": ".exact",
    "dali": ".dali",
    "nvjpeg": ".nvjpeg",
    "auto": ".hybrid",
}

__all__ = ["DaliDecoder", "ImageSources", "NativeDecoder", "NvjpegDecoder", "REGISTRY", "kind", "names"]
_HOMES = {"DaliDecoder": ".dali", "ImageSources": "._base", "NativeDecoder": ".native", "NvjpegDecoder": ".nvjpeg"}


def names() -> tuple[str, ...]:
    """Every registered decoder's name, in registry order."""
    return tuple(REGISTRY)


def kind(name: str) -> Any:
    """The ``DecoderKind`` registered as ``name`` (its module is imported now); ValueError naming the choices."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"decoder={name!r} should be one of {', '.join(map(repr, REGISTRY))}")
    return importlib.import_module(REGISTRY[name], __name__).KIND


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
