"""Optional image decoders that execute fastload's plans instead of the native core.

``dali.py``: :class:`DaliDecoder`, NVIDIA DALI on the GPU (or DALI's CPU-only mode).
``nvjpeg.py``: :class:`NvjpegDecoder`, torchvision's batched nvJPEG decoder on the GPU.
Importing this package is cheap: DALI and torchvision are imported only when a decoder is made.
"""

from __future__ import annotations

from .dali import DaliDecoder
from .nvjpeg import NvjpegDecoder

__all__ = ["DaliDecoder", "NvjpegDecoder"]
