"""fastload: fast data loading for PyTorch.

Pack a dataset once (``fastload pack`` / ``fastload.pack``), then open it with ``fastload.open``.
"""

from __future__ import annotations

from . import transforms
from ._front.dataset import Dataset, open
from ._tools.doctor import doctor
from ._front.loader import DataLoader
from ._front.mix import mix
from .fast.device import to_device
from ._errors import (
    DecodeError,
    FastloadError,
    FastPathWarning,
    FormatError,
    RemoteError,
    SchemaError,
    SourceError,
    VersionError,
)
from .pack import PackSummary, merge
from .pack import pack  # after the package import above: fastload.pack is the function, not the package
from ._schema import Field, Schema
from ._version import __version__

__all__ = [
    "DataLoader",
    "Dataset",
    "DecodeError",
    "FastPathWarning",
    "FastloadError",
    "Field",
    "FormatError",
    "PackSummary",
    "RemoteError",
    "Schema",
    "SchemaError",
    "SourceError",
    "VersionError",
    "__version__",
    "doctor",
    "merge",
    "mix",
    "open",
    "pack",
    "to_device",
    "transforms",
]
