"""One exception family for everything fastload raises about data.

Each error names where it happened (dataset, shard, sample, field, source file) so a user can find the
bad record without a debugger.
"""

from __future__ import annotations


class FastloadError(Exception):
    """Base class of fastload's own errors."""


class FormatError(FastloadError, ValueError):
    """A packed dataset is malformed: bad manifest, truncated or corrupt shard, bad offsets."""


class VersionError(FormatError):
    """A dataset was written by a newer format version than this fastload can read."""


class RemoteError(FastloadError, OSError):
    """Object storage could not be read: missing bucket or object, no credentials, refused access, or a
    network failure that outlasted the retries. The message names the URL and gives the backend's error."""


class SchemaError(FastloadError, ValueError):
    """A sample does not fit the dataset's schema, or the schema itself is invalid."""


class SourceError(FastloadError):
    """A source file or source sample could not be read or encoded while packing."""


class DecodeError(FastloadError, ValueError):
    """A stored sample could not be decoded (corrupt JPEG, bad record)."""


def where(
    dataset: object = None,
    shard: object = None,
    sample: object = None,
    field: object = None,
) -> str:
    """Format a location as ``dataset 'x', shard 'y', sample 3, field 'image'`` (skipping Nones)."""
    parts = []
    if dataset is not None:
        parts.append(f"dataset '{dataset}'")
    if shard is not None:
        parts.append(f"shard '{shard}'")
    if sample is not None:
        parts.append(f"sample {sample}")
    if field is not None:
        parts.append(f"field '{field}'")
    return ", ".join(parts)


class FastPathWarning(UserWarning):
    """A fastload.Dataset that could take the fast path was refused it; the message says why and how to fix it.
    Also: a torchvision ImageFolder (or timm ImageDataset) given to fastload.DataLoader took the fast path over
    its cached pack, or could not, and why (``_front/tvfolder.py``).

    Given once per loader. Silence with ``warnings.filterwarnings("ignore", category=fastload.FastPathWarning)``."""
