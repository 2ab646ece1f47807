"""``fastload.pack``: the arguments checked, then the pack routed: one machine into a local folder or a URL
(``_target.py``), or parts on a Ray cluster (``_ray.py``).

Crash safety: files are written under a temporary name and renamed when complete; the pack's resume
state records what is finished; the manifest is written last. A dataset without a manifest never opens
as complete. Running the same pack again resumes, and because shard boundaries depend only on the
encoded bytes, the result is byte-for-byte what an uninterrupted pack writes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

from .._schema import Field
from ..formats.registry import DEFAULT_FORMAT, FORMATS, format_named
from ..formats.remote import is_url
from ._encode import ImageOptions
from ._local import DEFAULT_BLOCK, DEFAULT_MAX_SKIPPED, DEFAULT_SHARD_SIZE, PackSummary, parse_size
from ._parts import parse_part
from ._ray import pack_on_ray
from ._target import pack_to


def pack(
    source: Any,
    dest: str | os.PathLike,
    *,
    format: str = DEFAULT_FORMAT,
    image_mode: str = "auto",
    max_side: int | None = None,
    quality: int = 90,
    check: str = "decode",
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    workers: int | None = None,
    overwrite: bool = False,
    skip_bad: bool = False,
    max_skipped: float = DEFAULT_MAX_SKIPPED,
    schema: Mapping[str, Field] | None = None,
    root: str | os.PathLike | None = None,
    path_column: str = "path",
    missing: Mapping[str, Any] | None = None,
    progress: bool = False,
    block: int = DEFAULT_BLOCK,
    part: tuple[int, int] | str | None = None,
    engine: str = "local",
    parts: int | None = None,
    ray_address: str | None = None,
    on_shard: Callable[[Path], None] | None = None,
    staging: str | os.PathLike | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> PackSummary:
    """Pack ``source`` into a fastload dataset at ``dest`` and return a summary.

    ``source``: an ImageFolder directory, a ``.npy``/``.npz`` file, numpy arrays (one, a tuple, or a
    dict), a CSV/JSONL manifest (paths relative to ``root``), a map-style torch Dataset, Parquet files or
    WebDataset tar shards (a file, a folder, a glob or a brace pattern, local or a URL; ``sources/parquet.py``
    and ``sources/webdataset.py`` say how their columns and members become fields).
    ``schema`` overrides inferred fields by name. ``missing`` (manifests): column -> the value its blank or
    null cells stand for (without it, such a cell stops the pack naming its line and column).
    ``check="header"`` validates stored JPEGs by header and end marker only (faster passthrough; corrupt
    entropy data then surfaces at load time). See ``fastload pack --help`` for the options.
    ``skip_bad=True`` skips unreadable samples (listed in the manifest), but a pack that would skip more
    than ``max_skipped`` of its samples (a share, default 0.1), or all of them, fails instead.

    Packing in parts (``_parts.py``): ``part=(i, n)`` (or ``"i/n"``) packs a deterministic i-th of n
    slices of the source (whole blocks of ``block`` samples) into ``dest/parts/i``, and
    ``fastload.merge(dest)`` joins the parts into the dataset one machine would have written, byte for
    byte. ``engine="ray"`` runs ``parts`` parts (default: the cluster's CPUs) as Ray tasks on the cluster
    at ``ray_address`` (default: a running one, else a local one) and merges them.

    ``dest`` may be a URL (``s3://bucket/ds``, any fsspec URL; ``storage_options`` go to its backend):
    the pack runs into ``staging`` (a new or empty folder; default: under ``~/.cache/fastload/staging``),
    each shard is uploaded when complete and the manifest last (``_upload.py``); re-running
    resumes. ``on_shard`` is called with the path of each shard file once it is complete. A URL source
    (Parquet files or tar shards) is read with the same ``storage_options``.
    """
    if engine not in ("local", "ray"):
        raise ValueError(f"engine={engine!r} should be 'local' or 'ray'")
    fmt = format_named(format)
    by_file = ", ".join(f"format={n!r}" for n, f in FORMATS.items() if f.parts)  # written file by file
    url = is_url(str(dest))
    if url and not fmt.parts:
        raise ValueError(
            f"format={format!r} cannot be packed to a URL ({dest}): a URL dataset is uploaded file by "
            f"file as each is finished; use {by_file}"
        )
    if on_shard is not None and not fmt.parts:
        raise ValueError(f"on_shard= is called with each finished shard file, so it needs {by_file}, not {format!r}")
    if engine == "ray" and part is not None:
        raise ValueError("engine='ray' packs every part itself: leave part=None")
    if part is not None and not fmt.parts:
        raise ValueError(f"packing in parts needs {by_file} (format={format!r} is not written file by file)")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block={block!r} should be a positive number of samples")
    if isinstance(max_skipped, bool) or not isinstance(max_skipped, (int, float)) or not 0 <= max_skipped <= 1:
        raise ValueError(
            f"max_skipped={max_skipped!r} should be a share of the samples between 0 and 1 "
            f"(0.1: fail when more than 10% would be skipped)"
        )
    if part is not None:
        parse_part(part)
    ImageOptions(image_mode, max_side, quality, check)  # checked now, before anything is written
    try:
        parse_size(shard_size)
    except (ValueError, TypeError, AttributeError):
        raise ValueError(
            f"shard_size={shard_size!r} should be a positive size in bytes, or a string with a K/M/G/T "
            f"unit such as '256MB'"
        ) from None
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 0):
        raise ValueError(f"workers={workers!r} should be an int >= 0 (or None: one per core)")
    if engine == "ray":
        return pack_on_ray(
            source,
            dest,
            parts=parts,
            address=ray_address,
            progress=progress,
            format=format,
            image_mode=image_mode,
            max_side=max_side,
            quality=quality,
            check=check,
            shard_size=shard_size,
            workers=workers,
            overwrite=overwrite,
            skip_bad=skip_bad,
            max_skipped=max_skipped,
            schema=schema,
            root=root,
            path_column=path_column,
            missing=missing,
            block=block,
            **({"storage_options": dict(storage_options)} if storage_options else {}),
        )
    return pack_to(
        source,
        dest,
        overwrite=overwrite,
        part=part,
        on_shard=on_shard,
        staging=staging,
        storage_options=storage_options,
        schema=schema,
        root=root,
        path_column=path_column,
        missing=missing,
        format=format,
        image_mode=image_mode,
        max_side=max_side,
        quality=quality,
        check=check,
        shard_size=shard_size,
        workers=workers,
        skip_bad=skip_bad,
        max_skipped=max_skipped,
        progress=progress,
        block=block,
    )
