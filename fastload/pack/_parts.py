"""Packing on many machines: a pack split into parts and the merge (the parts as Ray tasks: ``_ray.py``).

``pack(..., part=(i, n))`` packs a deterministic slice of the source into ``DST/parts/i``: whole
*blocks* of ``block`` source samples (for fixed-size numpy sources, whole shards of rows). The packer
never lets a shard straddle a block, and numbers the shards of block b from ``b * block`` (see
``_local.DEFAULT_BLOCK``), so every shard a part writes is the very file, name and bytes, that a pack on
one machine with the same settings writes. ``merge(DST)`` then only moves the shard files up (a rename,
no bytes copied) and writes one manifest listing the parts' shards in source order: the result is the
single-machine dataset byte for byte.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .._errors import FastloadError
from ..formats._manifest import MANIFEST_NAME, STATE_NAME, Manifest, fsync_dir, write_manifest
from ..formats.registry import FORMATS
from ..formats.remote import is_url, url_to_fs
from ._sinks import remove_pack

PARTS_DIR = "parts"


def parse_part(part: tuple[int, int] | str) -> tuple[int, int]:
    """``"2/8"`` or ``(2, 8)`` -> (2, 8), checked: 0 <= i < n."""
    try:
        i, n = (int(x) for x in part.split("/")) if isinstance(part, str) else (int(part[0]), int(part[1]))
    except (ValueError, TypeError, IndexError):
        raise ValueError(f"part={part!r} should be 'I/N' (or (I, N)): part I of N, counted from 0") from None
    if not (n >= 1 and 0 <= i < n):
        raise ValueError(f"part={part!r}: I must be in 0..N-1 (part I of N, counted from 0)")
    return i, n


def part_span(num_samples: int, unit: int, i: int, n: int) -> tuple[int, int]:
    """Source samples [lo, hi) of part i of n: units (blocks) [U*i//n, U*(i+1)//n) of the U in all."""
    units = -(-num_samples // unit)
    lo, hi = units * i // n, units * (i + 1) // n
    return min(num_samples, lo * unit), min(num_samples, hi * unit)


def _part_manifests(dest: Path) -> list[tuple[str, Manifest]]:
    root = dest / PARTS_DIR
    if not root.is_dir():
        raise FastloadError(
            f"{dest} has no {PARTS_DIR}/ folder: pack the parts first (fastload pack SRC {dest} --part I/N for each I)"
        )
    found = []
    for name in _sorted_parts(os.listdir(root), root):
        path = root / name
        if not (path / MANIFEST_NAME).is_file():
            raise FastloadError(
                f"part {path} is unfinished (no {MANIFEST_NAME}): run its pack command again "
                f"(fastload pack SRC {dest} --part {name}/N) to finish it, then merge"
            )
        found.append((str(path), Manifest.parse((path / MANIFEST_NAME).read_bytes(), f"part '{path}'")))
    return found


def _sorted_parts(names: list[str], root: Any) -> list[str]:
    bad = [n for n in names if not n.isdigit()]
    if bad:
        raise FastloadError(f"{root}/{bad[0]}: not a part (parts are {PARTS_DIR}/0, {PARTS_DIR}/1, ...)")
    if not names:
        raise FastloadError(f"{root} holds no parts")
    return sorted(names, key=int)


def _joined(dest: Any, parts: list[tuple[str, Manifest]]) -> Manifest:
    """The merged manifest, after checking that the parts are all of one pack, in order."""
    infos = [m.metadata.get("part") for _, m in parts]
    for (path, _), p in zip(parts, infos):
        if not isinstance(p, dict):
            raise FastloadError(
                f"{path}: its manifest has no part information (metadata.part): not written by fastload pack --part"
            )
    n = infos[0]["parts"]
    have = [p["index"] for p in infos]
    if have != list(range(n)) or any(p["parts"] != n for p in infos):
        missing = sorted(set(range(n)) - set(have))
        raise FastloadError(
            f"{dest}/{PARTS_DIR}: the pack was split into {n} parts; found {have}"
            + (f", missing {missing}" if missing else "")
            + ": pack the missing parts first"
        )
    first = parts[0][1]
    fmt = FORMATS.get(first.layout)
    if fmt is None or not fmt.parts:
        raise FastloadError(f"{parts[0][0]}: layout {first.layout!r} is not one packed in parts")
    for path, m in parts:
        fmt.check(m, f"part '{path}'")

    def rest(m: Manifest) -> dict:
        return {k: v for k, v in m.metadata.items() if k != "part"}

    for path, m in parts:
        if (
            m.layout != first.layout
            or m.schema != first.schema
            or m.image_mode != first.image_mode
            or rest(m) != rest(first)
        ):
            raise FastloadError(f"part {path} comes from a different source or settings than part 0")
    spans = [p["samples"] for p in infos]
    if any(a[1] != b[0] for a, b in zip(spans, spans[1:])) or spans[0][0] != 0:
        raise FastloadError(f"{dest}/{PARTS_DIR}: the parts' sample ranges {spans} do not follow one another")
    shards = [e for _, m in parts for e in m.shards]
    skipped = [s for _, m in parts for s in m.skipped]
    return Manifest(
        first.layout,
        first.schema,
        sum(e.num_samples for e in shards),
        shards,
        first.image_mode,
        skipped,
        rest(first),
        created_by=first.created_by,
    )


def merge(dest: str | os.PathLike, *, storage_options: dict | None = None, progress: bool = False) -> Manifest:
    """Join the parts in ``dest/parts/`` into one dataset at ``dest``; returns its manifest.

    Every part must be finished and from the same pack (same N, schema, settings). Shard files are
    moved, not copied (in object storage: server-side); the manifest is written last. Re-running after
    an interruption finishes the job. ``dest`` may be a URL (``storage_options`` for its backend).
    ``progress`` shows a bar of the shards moved (server-side copies in object storage take a while).
    """
    if is_url(str(dest)):
        return _merge_url(str(dest).rstrip("/"), storage_options, progress)
    dest = Path(dest)
    if not dest.is_dir():
        raise FastloadError(
            f"cannot merge {dest}: "
            + ("it is not a folder" if dest.exists() else "no such folder")
            + f" (merge joins the parts in DST/{PARTS_DIR}/ that `fastload pack SRC DST --part I/N` "
            f"wrote)"
        )
    if (dest / MANIFEST_NAME).is_file() and not (dest / PARTS_DIR).exists():
        raise FastloadError(f"{dest} already holds a finished dataset and no {PARTS_DIR}/ folder: nothing to merge")
    parts = _part_manifests(dest)
    merged = _joined(dest, parts)
    if (dest / MANIFEST_NAME).is_file():
        _same_or_refuse(dest, (dest / MANIFEST_NAME).read_bytes(), merged)
    if (dest / STATE_NAME).exists():  # its shards have the names the parts' have: they would be replaced
        raise FastloadError(
            f"{dest} holds an unfinished pack ({STATE_NAME}) whose shards merging would replace; "
            f"finish or remove that pack first, or merge into a new folder (move {PARTS_DIR}/ there)"
        )
    for path, _m, e in _shards_told(parts, merged, dest, progress):
        src, dst = Path(path) / e.file, dest / e.file
        if src.exists():
            os.replace(src, dst)  # same filesystem: a rename, no bytes copied
        elif not dst.is_file():
            raise FastloadError(f"part {path}: shard {e.file} is missing")
        if dst.stat().st_size != e.bytes:
            raise FastloadError(f"{dst}: {dst.stat().st_size} bytes, part {path} says {e.bytes}")
    fsync_dir(dest)
    write_manifest(dest, merged)
    for path, _ in parts:  # each part's own files (its manifest), then the folders they emptied; nothing else
        remove_pack(Path(path))
    try:
        (dest / PARTS_DIR).rmdir()
    except OSError:
        pass
    fsync_dir(dest)
    return merged


def _same_or_refuse(dest: Any, raw: bytes, merged: Manifest) -> None:
    """``dest`` already has a manifest: this merge's own (an earlier run stopped before removing the
    parts), or another dataset, whose shards and manifest the merge would replace: refused."""
    try:
        same = Manifest.parse(raw, f"dataset '{dest}'").to_json() == merged.to_json()
    except FastloadError:
        same = False
    if not same:
        raise FastloadError(
            f"{dest} already holds a packed dataset other than these parts; merging would replace "
            f"its shards and manifest. Merge into a new folder (move {PARTS_DIR}/ there), or remove "
            f"the dataset first"
        )


def _shards_told(parts: list[tuple[str, Manifest]], merged: Manifest, dest: Any, progress: bool):
    """(part path, part manifest, shard entry) of every shard to move, with a progress bar if asked."""
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(merged.shards), unit="shard", desc=f"merge {dest}")
    try:
        for path, m in parts:
            for e in m.shards:
                yield path, m, e
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()


def _merge_url(url: str, storage_options: dict | None, progress: bool = False) -> Manifest:
    fs, root = url_to_fs(url, storage_options)
    proot = f"{root}/{PARTS_DIR}"
    try:
        names = [n.rstrip("/").rsplit("/", 1)[-1] for n in fs.ls(proot, detail=False)]
    except FileNotFoundError:
        if fs.exists(f"{root}/{MANIFEST_NAME}"):
            raise FastloadError(
                f"{url} already holds a finished dataset and no {PARTS_DIR}/: nothing to merge"
            ) from None
        raise FastloadError(
            f"{url} has no {PARTS_DIR}/: pack the parts first (fastload pack SRC {url} --part I/N for each I)"
        ) from None
    parts = []
    for name in _sorted_parts(names, f"{url}/{PARTS_DIR}"):
        where = f"{url}/{PARTS_DIR}/{name}"
        try:
            raw = fs.cat_file(f"{proot}/{name}/{MANIFEST_NAME}")
        except FileNotFoundError:
            raise FastloadError(
                f"part {where} is unfinished (no {MANIFEST_NAME}): run its pack command again to finish it, then merge"
            ) from None
        parts.append((where, Manifest.parse(raw, f"part '{where}'")))
    merged = _joined(url, parts)
    if fs.exists(f"{root}/{MANIFEST_NAME}"):
        _same_or_refuse(url, fs.cat_file(f"{root}/{MANIFEST_NAME}"), merged)
    folder = dict(zip((w for w, _ in parts), _sorted_parts(names, url)))
    for where, _m, e in _shards_told(parts, merged, url, progress):
        name = folder[where]
        src, dst = f"{proot}/{name}/{e.file}", f"{root}/{e.file}"
        if fs.exists(src):
            fs.mv(src, dst)  # object stores copy server-side: no bytes through this machine
        elif not fs.exists(dst):
            raise FastloadError(f"part {where}: shard {e.file} is missing")
        if fs.size(dst) != e.bytes:
            raise FastloadError(f"{url}/{e.file}: {fs.size(dst)} bytes, part {where} says {e.bytes}")
    fs.pipe_file(f"{root}/{MANIFEST_NAME}", merged.to_json().encode())  # last: now it is a dataset
    for name in folder.values():  # the parts' manifests (their shards moved); other objects there stay
        fs.rm_file(f"{proot}/{name}/{MANIFEST_NAME}")
    return merged
