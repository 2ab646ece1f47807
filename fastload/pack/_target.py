"""One machine's pack (a whole source, or one part of it) into a local folder or to a URL: the source adapted,
the destination checked, then ``pack_local`` or ``pack_to_url``. Both the router and each Ray task call it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

from .._errors import FastloadError
from ..formats.remote import is_url
from ..sources import as_source
from ._local import PackSummary, pack_local
from ._upload import pack_to_url


def pack_to(
    source: Any,
    dest: str | os.PathLike,
    *,
    overwrite: bool,
    part: Any,
    on_shard: Callable[[Path], None] | None,
    staging: str | os.PathLike | None,
    storage_options: Mapping[str, Any] | None,
    schema: Any,
    root: Any,
    path_column: str,
    missing: Mapping[str, Any] | None,
    **kwargs: Any,
) -> PackSummary:
    """``kwargs``: ``pack_local``'s options (format, image_mode, ..., progress, block), already checked."""
    url = is_url(str(dest))
    if not url:
        _check_writable(Path(dest))
        if (
            isinstance(source, (str, os.PathLike))
            and Path(source).is_dir()
            and Path(source).resolve() in (Path(dest).resolve(), *Path(dest).resolve().parents)
        ):
            raise ValueError(
                f"destination {dest} is inside the source folder {source}: the pack's files would become "
                f"part of the source (a class folder); choose a destination outside it"
            )
    src = as_source(
        source,
        schema=schema,
        root=root,
        path_column=path_column,  # its errors before any write
        missing=missing,
        storage_options=storage_options,
    )
    if url:
        return pack_to_url(
            src,
            str(dest),
            staging=staging,
            storage_options=dict(storage_options or {}),
            overwrite=overwrite,
            part=part,
            **kwargs,
        )
    return pack_local(src, Path(dest), overwrite=overwrite, part=part, on_shard=on_shard, **kwargs)


def _check_writable(dest: Path) -> None:
    """A local destination whose nearest existing folder cannot be written fails now, not after the pack."""
    here = dest
    while not here.exists() and here != here.parent:
        if here.is_symlink():  # a dangling link: mkdir would fail on it
            break
        here = here.parent
    if here.exists() and not here.is_dir():
        raise FastloadError(f"cannot pack into {dest}: {here} is a file, not a folder")
    if here.is_dir() and not os.access(here, os.W_OK | os.X_OK):
        raise FastloadError(
            f"cannot pack into {dest}: the folder {here} is not writable (permissions or a "
            f"read-only filesystem); choose a destination you can write"
        )
