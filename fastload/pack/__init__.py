"""The write wing: everything that writes a packed dataset. ``formats/`` reads and verifies; the writers of
each format live with it and are reached through its ``Format`` object (``formats/registry.py``).

``_router.py``     ``fastload.pack``: the arguments checked; one machine (``_target.py``) or Ray (``_ray.py``)
``_target.py``     one machine's pack: the source adapted, then a local folder or a URL
``_local.py``      ``pack_local``: encode in order, write with the format's sink, crash-safe and resumable
``_upload.py``     a URL: staged locally, each shard uploaded when complete, the manifest last
``_parts.py``      ``--part I/N`` spans and ``merge``
``_ray.py``        the parts as Ray tasks, then the merge
``_sinks.py``      the destination (finished, resumable, scratch, foreign) and the format's sink
``_lock.py``       one writer per destination folder (an flock the kernel releases if the pack dies)
``_encode.py``     source values to stored form; ``_encode_pool.py`` encodes on threads or processes

(Inside ``fastload/__init__.py`` the name ``fastload.pack`` is rebound to the function: the public API.)
"""

from ._local import PackSummary, parse_size
from ._parts import merge, parse_part
from ._router import pack

__all__ = ["PackSummary", "merge", "pack", "parse_part", "parse_size"]
