"""What a pack finds at its destination, whatever the format: ``prepare_dest`` (a finished dataset, an
unfinished pack to resume, a killed pack's scratch, files that are not fastload's), ``sink_for`` (the
format's writer, from the registry), and the clean-ups (``clear_pack``, ``remove_pack``) that remove only
the files a pack writes. The writers themselves live with their formats (``formats/shards.py``,
``formats/lmdb.py``) and are reached through the ``Format`` objects of ``formats/registry.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from .._errors import FastloadError
from ..formats._manifest import MANIFEST_NAME, STATE_NAME, fsync_dir
from ..formats.registry import FORMATS, format_named
from ._lock import LOCK_NAME, remove_if_free


def sink_for(
    dest: Path,
    src: Any,
    params: dict,
    shard_bytes: int,
    state: dict | None,
    span: tuple[int, int],
    on_shard: Callable[[Path], None] | None = None,
    keep_state: bool = False,
) -> Any:
    """The writer for ``params["format"]`` that takes samples one at a time (``add``/``skip``/``finish``)."""
    return format_named(params["format"]).sink(dest, src, params, shard_bytes, state, span, on_shard, keep_state)


def is_write_error(e: BaseException) -> bool:
    """True for a failed write that a format's own library raised (LMDB's errors are not OSErrors)."""
    return any(f.is_write_error(e) for f in FORMATS.values())


# -- the destination: what a pack finds there, and its resume state -----------------------------


def _own_file(name: str) -> bool:
    """Exactly the names a pack writes (and their temporary names): only these are ever removed."""
    base = name.removesuffix(".tmp")
    return name == LOCK_NAME or any(f.owns(base) for f in FORMATS.values())


def prepare_dest(dest: Path, overwrite: bool, params: dict, staged_for: str | None = None) -> dict | None:
    """Create or clear ``dest``; return the resume state of an unfinished identical pack, if any.

    ``staged_for``: ``dest`` stages a pack for that URL (``_upload.py``). Its resume state outlives the
    manifest until the upload is done, so a re-run finishes uploading only a staged pack of the same
    source and options, and refuses any other (the same check as a local resume)."""
    where = f"staging folder {dest} (for {staged_for})" if staged_for else f"destination {dest}"
    if not dest.exists():
        dest.mkdir(parents=True)
        return None
    if not dest.is_dir():
        raise FastloadError(f"{where} exists and is not a directory")
    names = [n for n in os.listdir(dest) if n != LOCK_NAME]  # the lock: this pack's own (pack_local holds it)
    foreign = [n for n in names if not _own_file(n) or (dest / n).is_dir()]
    if foreign:
        raise FastloadError(
            f"{where} holds files fastload did not write ({', '.join(sorted(foreign)[:5])}); "
            f"refusing to write there — choose an empty or new directory"
        )
    for f in FORMATS.values():
        what = f.foreign(dest, names)
        if what:
            raise FastloadError(f"{where} holds {what}; refusing to write there — choose an empty or new directory")
    if overwrite:
        for n in names:
            (dest / n).unlink()  # files only, each one a pack's own (a folder counts as foreign)
        return None
    fmt = format_named(params["format"])
    if MANIFEST_NAME in names and STATE_NAME in names:
        state = fmt.read_state(dest)
        if state is not None and state.get("params") == params:
            if staged_for is None:  # killed after the manifest, before its resume state was removed: finish that
                (dest / STATE_NAME).unlink()
                fsync_dir(dest)
            return {"complete": True}
    if staged_for is not None and (MANIFEST_NAME in names or STATE_NAME in names):
        state = fmt.read_state(dest)
        if state is None or state.get("params") != params:
            raise FastloadError(
                f"{where} holds a pack of a different source or different options, not yet "
                f"uploaded; run the command that started it to finish it, pass overwrite=True "
                f"(--overwrite) to discard it (and replace any dataset at {staged_for}), or "
                f"choose another staging folder (--staging / staging=)"
            )
        return state
    if any(f.complete(dest) for f in FORMATS.values()):
        raise FastloadError(f"{where} already holds a packed dataset; pass overwrite=True (--overwrite) to replace it")
    state = fmt.read_state(dest)
    if state is None:
        if names and not _nothing_committed(dest, names):
            raise FastloadError(f"{where} is not empty and holds no resumable pack; use --overwrite")
        for n in names:  # scratch of a pack killed before it committed anything
            (dest / n).unlink()
        return None
    if state.get("params") != params:
        raise FastloadError(
            f"{where} holds an unfinished pack with different parameters or source; "
            f"run the original command to resume it, or pass --overwrite to start over"
        )
    return state


def clear_pack(dest: Path, keep: str) -> None:
    """Remove a finished pack's own files from ``dest`` before packing there again (``overwrite``); the
    folder ``keep`` is left to its owner. Anything fastload did not write is refused, and nothing removed."""
    names = [n for n in os.listdir(dest) if n != LOCK_NAME]  # a lock is only ever removed by its holder
    foreign = [n for n in names if n != keep and (not _own_file(n) or (dest / n).is_dir())]
    if foreign:
        shown = ", ".join(sorted(foreign)[:5])
        raise FastloadError(
            f"destination {dest} holds files fastload did not write ({shown}); refusing to write "
            f"there — choose an empty or new directory"
        )
    for n in names:
        if n != keep:
            (dest / n).unlink()


def remove_pack(dest: Path) -> None:
    """Remove a pack's own files from ``dest`` (a staged copy, once uploaded), then ``dest`` if that
    emptied it; anything else there is left alone."""
    if not dest.is_dir():
        return
    for n in os.listdir(dest):
        if n == LOCK_NAME:
            remove_if_free(dest / n)  # a killed pack's; one a running pack holds stays
        elif _own_file(n) and (dest / n).is_file():
            (dest / n).unlink()
    try:
        dest.rmdir()
    except OSError:
        pass


def _nothing_committed(dest: Path, names: list[str]) -> bool:
    """True when ``names`` are only what a pack killed before its first commit leaves: temporary files
    (never complete by construction) and a format's empty scratch (an LMDB environment holding no entry)."""
    rest = [n for n in names if not n.endswith(".tmp")]
    return not rest or any(f.nothing_committed(dest, rest) for f in FORMATS.values())
