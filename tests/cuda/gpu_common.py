"""What the GPU tests share: the tests/ folder on sys.path (for conftest's data builders), whether a CUDA
torchvision is there, and the marks that skip a module cleanly without them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:
    import torchvision  # noqa: F401

    HAVE_TV = True
except ImportError:
    HAVE_TV = False

NEEDS_CUDA_AND_TORCHVISION = [pytest.mark.cuda, pytest.mark.skipif(not (torch.cuda.is_available() and HAVE_TV),
                                                                   reason="needs CUDA and torchvision")]
