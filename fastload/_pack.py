"""``fastload.pack``: read a source on all cores, write shards (or LMDB), crash-safe and resumable.

Crash safety: shard files are written under a temporary name and renamed when complete; after each
shard, ``pack_state.json`` records the finished shards and where to resume; the manifest is written
last. A dataset without a manifest never opens as complete. Running the same pack again resumes after
the last finished shard, and because shard boundaries depend only on the encoded bytes, the result is
byte-for-byte what an uninterrupted pack writes.
"""

from __future__ import annotations

import errno
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping


from ._version import __version__
from ._encode import ImageOptions
from ._errors import FastloadError, SourceError
from ._schema import Field
from .formats.sinks import ArraySink, array_rows, is_write_error, prepare_dest, sink_for
from ._encode_pool import _encoded
from .sources import ArraySource, Source, as_source

DEFAULT_SHARD_SIZE = 256 << 20
# Shards never straddle a multiple of BLOCK source samples, and the shards of block b are numbered
# b * BLOCK + 0, 1, ...: where a shard starts and what it is called depend on its own block only, so a
# pack split into parts (whole blocks each, ``_parts.py``) merges into exactly the files one machine writes.
DEFAULT_BLOCK = 65536
# skip_bad skipping more than this share of the samples fails the pack: the data is likely not what the
# user thinks (a wrong schema, a wrong folder), and a mostly empty dataset would fail only at training time
DEFAULT_MAX_SKIPPED = 0.1


@dataclass
class PackSummary:
    dest: str
    format: str
    samples: int
    skipped: list[dict]
    bytes: int
    shards: int
    seconds: float
    resumed_from: int = 0
    image_encodings: dict = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        return (self.samples - self.resumed_from) / self.seconds if self.seconds > 0 else float("inf")

    @property
    def where(self) -> str:
        return f"{self.shards} shard(s)" if self.format == "shards" else "one LMDB environment"

    def __str__(self) -> str:
        mb = self.bytes / 1e6
        lines = [
            f"packed {self.samples} samples into {self.dest} ({self.where}, {mb:.1f} MB) "
            f"in {self.seconds:.2f} s: {self.samples_per_s:,.0f} samples/s, {mb / max(self.seconds, 1e-9):.1f} MB/s",
        ]
        if self.resumed_from:
            lines.append(f"resumed after {self.resumed_from} samples already packed")
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} bad source sample(s):")
            lines.extend(f"  {s['source']}: {s['error']}" for s in self.skipped[:20])
            if len(self.skipped) > 20:
                lines.append(f"  ... and {len(self.skipped) - 20} more (listed in the manifest)")
        return "\n".join(lines)


def parse_size(text: str | int) -> int:
    """'256MB' -> 268435456 (binary units; K, M, G, T, with or without B)."""
    if isinstance(text, int):
        return text
    s = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(s[-1:], 1)
    num = s[:-1] if s[-1:] in "KMGT" else s
    try:
        value = int(float(num) * mult)
    except ValueError:
        raise ValueError(f"size {text!r} is not a number with an optional K/M/G/T unit, e.g. '256MB'") from None
    if value <= 0:
        raise ValueError(f"size {text!r} must be positive")
    return value


# -- the pack -----------------------------------------------------------------------------------

def pack(
    source: Any,
    dest: str | os.PathLike,
    *,
    format: str = "shards",
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
    dict), a CSV/JSONL manifest (paths relative to ``root``), or a map-style torch Dataset.
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
    each shard is uploaded when complete and the manifest last (``formats/upload.py``); re-running
    resumes. ``on_shard`` is called with the path of each shard file once it is complete.
    """
    from .formats.remote import is_url

    if engine not in ("local", "ray"):
        raise ValueError(f"engine={engine!r} should be 'local' or 'ray'")
    if format not in ("shards", "lmdb"):
        raise ValueError(f"format={format!r} should be 'shards' or 'lmdb'")
    url = is_url(str(dest))
    if url and format != "shards":
        raise ValueError(f"format={format!r} cannot be packed to a URL ({dest}): a URL dataset is shards, uploaded "
                         f"as each is finished; use format='shards'")
    if on_shard is not None and format != "shards":
        raise ValueError(f"on_shard= is called with each finished shard file, so it needs format='shards', not "
                         f"{format!r}")
    if engine == "ray" and part is not None:
        raise ValueError("engine='ray' packs every part itself: leave part=None")
    if part is not None and format != "shards":
        raise ValueError("packing in parts needs format='shards' (an LMDB environment is one file)")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block={block!r} should be a positive number of samples")
    if isinstance(max_skipped, bool) or not isinstance(max_skipped, (int, float)) or not 0 <= max_skipped <= 1:
        raise ValueError(f"max_skipped={max_skipped!r} should be a share of the samples between 0 and 1 "
                         f"(0.1: fail when more than 10% would be skipped)")
    if part is not None:
        from ._parts import parse_part

        parse_part(part)
    ImageOptions(image_mode, max_side, quality, check)  # checked now, before anything is written
    try:
        parse_size(shard_size)
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f"shard_size={shard_size!r} should be a positive size in bytes, or a string with a K/M/G/T "
                         f"unit such as '256MB'") from None
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 0):
        raise ValueError(f"workers={workers!r} should be an int >= 0 (or None: one per core)")
    if engine == "ray":
        from ._parts import pack_on_ray

        return pack_on_ray(source, dest, parts=parts, address=ray_address, progress=progress, format=format,
                           image_mode=image_mode, max_side=max_side, quality=quality, check=check,
                           shard_size=shard_size, workers=workers, overwrite=overwrite, skip_bad=skip_bad,
                           max_skipped=max_skipped, schema=schema, root=root, path_column=path_column,
                           missing=missing, block=block,
                           **({"storage_options": dict(storage_options)} if storage_options else {}))
    if not url:
        _check_writable(Path(dest))
        if isinstance(source, (str, os.PathLike)) and Path(source).is_dir() and \
                Path(source).resolve() in (Path(dest).resolve(), *Path(dest).resolve().parents):
            raise ValueError(f"destination {dest} is inside the source folder {source}: the pack's files would become "
                             f"part of the source (a class folder); choose a destination outside it")
    src = as_source(source, schema=schema, root=root, path_column=path_column,  # its errors before any write
                    missing=missing)
    kwargs = dict(format=format, image_mode=image_mode, max_side=max_side, quality=quality, check=check,
                  shard_size=shard_size, workers=workers, skip_bad=skip_bad, max_skipped=max_skipped,
                  progress=progress, block=block)
    if url:
        from .formats.upload import pack_to_url

        return pack_to_url(_pack_local, src, str(dest), staging=staging, storage_options=dict(storage_options or {}),
                           overwrite=overwrite, part=part, **kwargs)
    return _pack_local(src, Path(dest), overwrite=overwrite, part=part, on_shard=on_shard, **kwargs)


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
        raise FastloadError(f"cannot pack into {dest}: the folder {here} is not writable (permissions or a "
                            f"read-only filesystem); choose a destination you can write")


def _pack_local(src: Source, dest: Path, *, format: str, image_mode: str, max_side: int | None, quality: int,
                check: str, shard_size: int | str, workers: int | None, overwrite: bool, skip_bad: bool,
                max_skipped: float, progress: bool, block: int, part: Any, on_shard: Callable[[Path], None] | None,
                staged_for: str | None = None) -> PackSummary:
    """The pack into a local folder (``dest``, or the staging folder of a URL pack: ``staged_for``)."""
    opts = ImageOptions(image_mode, max_side, quality, check)
    shard_bytes = parse_size(shard_size)
    workers = os.cpu_count() or 1 if workers is None else int(workers)
    params = {"format": format, "image_mode": image_mode, "max_side": max_side, "quality": quality, "check": check,
              "shard_size": shard_bytes, "schema": src.schema.to_json(), "fingerprint": src.fingerprint(),
              "version": __version__, "block": block}
    arrays = isinstance(src, ArraySource) and format == "shards" and all(f.fixed_size for f in src.schema)
    span = (0, len(src))
    if part is not None:
        from ._parts import part_span, parse_part

        i, n = parse_part(part)
        span = part_span(len(src), array_rows(src, shard_bytes) if arrays else block, i, n)
        params["part"] = {"index": i, "parts": n, "samples": list(span)}
        dest = dest / "parts" / str(i)
    label = staged_for or str(dest)  # what the user named: the URL, not the staging folder
    t0 = time.perf_counter()
    with _writing(dest):
        state = prepare_dest(dest, overwrite, params, staged_for)
        if state is not None and state.get("complete"):
            from .formats.reader import read_manifest

            m = read_manifest(dest)
            return PackSummary(str(dest), format, m.num_samples, m.skipped, sum(s.bytes for s in m.shards),
                               len(m.shards), time.perf_counter() - t0, m.num_samples)
        if arrays:
            writer = ArraySink(dest, src, params, shard_bytes, state, span, on_shard, staged_for is not None)
            start = writer.next_sample
            writer.run(progress, label)
            manifest = writer.finish()
            return PackSummary(str(dest), format, manifest.num_samples, [], writer.total_bytes(),
                               len(manifest.shards), time.perf_counter() - t0, start - span[0])
        writer = sink_for(dest, src, params, shard_bytes, state, span, on_shard, staged_for is not None)
    start = writer.next_sample
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=span[1] - span[0], initial=start - span[0], unit="sample", desc=f"pack {label}",
                   smoothing=0.1)
    samples = _encoded(src, opts, start, workers, span[1])
    limit = _SkipLimit(src, span, max_skipped, len(writer.state["skipped"]))
    try:
        with _writing(dest):
            for i, encoded, error in samples:
                if error is not None:
                    if not skip_bad:
                        raise SourceError(f"{src.describe(i)}: {error}{_hint(error)}")
                    limit.skip(i, error)
                    writer.skip({"index": i, "source": src.describe(i), "error": error})
                else:
                    writer.add(i, encoded)
                if bar is not None:
                    bar.update(1)
            limit.check_all()
            manifest = writer.finish()
    finally:
        samples.close()  # ends worker processes now, not when a traceback holding this frame is dropped
        writer.close()
        if bar is not None:
            bar.close()
    return PackSummary(str(dest), format, manifest.num_samples, manifest.skipped, writer.total_bytes(),
                       len(manifest.shards), time.perf_counter() - t0, start - span[0])


def _hint(error: str) -> str:
    """What to do about a failed sample. A schema mismatch fails every sample alike: skipping would pack an
    empty dataset, so the hint is to fix the data or the schema, never ``skip_bad``."""
    if error.startswith("SchemaError:"):
        return (" (every sample like this one fails alike, so skipping is no fix: make the data and the schema "
                "agree, converting the data or declaring the field with schema=..., or change the options the "
                "error names)")
    return " (pass skip_bad=True / --skip-bad to skip bad samples and list them in the manifest)"


class _SkipLimit:
    """``skip_bad`` within bounds: more than ``max_skipped`` of the span's samples skipped, or every one of
    them, stops the pack before its manifest is written (as soon as the share is certain to be passed)."""

    def __init__(self, src: Source, span: tuple[int, int], share: float, skipped: int):
        self.src, self.total, self.share, self.skipped = src, span[1] - span[0], share, skipped
        self.first: list[str] = []

    def skip(self, i: int, error: str) -> None:
        self.skipped += 1
        if len(self.first) < 3:
            self.first.append(f"{self.src.describe(i)}: {error}")
        if self.skipped > self.share * self.total:
            self._fail(f"more than max_skipped={self.share:g} ({self.share:.0%}) of the {self.total} samples")

    def check_all(self) -> None:
        if self.total and self.skipped >= self.total:
            self._fail(f"every one of the {self.total} samples")

    def _fail(self, what: str) -> None:
        shown = "; ".join(self.first)
        raise SourceError(f"skip_bad would skip {what} (skipped {self.skipped} so far), so the dataset would be "
                          f"{'empty' if self.skipped >= self.total else 'missing much of its data'}; first "
                          f"failures: {shown}. Fix the source, or raise max_skipped= (--max-skipped) if that many "
                          f"bad samples are expected")


@contextmanager
def _writing(dest: Path) -> Iterator[None]:
    """Turns a failed write (a full disk, a file size limit, an I/O error) into one clear error.
    Everything committed so far stays resumable: nothing is marked complete before the manifest."""
    try:
        yield
    except FastloadError:
        raise
    except Exception as e:
        if isinstance(e, OSError):
            what = f"{e.strerror or e}" + (f" ({e.filename})" if e.filename else "")
            full = e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        elif is_write_error(e):
            what, full = str(e), False
        else:
            raise
        hint = "the disk is full or a file size limit was reached" if full else \
            "is the disk full, read-only or failing?"
        raise FastloadError(f"cannot write the dataset at {dest}: {what} ({hint}). Nothing incomplete is marked "
                            f"as finished: free some space and run the same pack again to resume where it "
                            f"stopped") from e
