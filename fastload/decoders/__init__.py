"""Optional image decoders that execute fastload's plans instead of the native core.

``dali.py``: :class:`DaliDecoder`, NVIDIA DALI on the GPU (or DALI's CPU-only mode). Importing this
package is cheap: DALI itself is imported only when a decoder is constructed.
"""

from __future__ import annotations

from .dali import DaliDecoder

__all__ = ["DaliDecoder"]
