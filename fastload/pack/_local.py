"""The pack into a local folder (``pack_local``): read a source on all cores, write it with the format's
sink, crash-safe and resumable. (``_router.py`` checks the arguments and chooses local, URL or Ray.)

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
import warnings
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator


from .._errors import FastloadError, SourceError
from .._version import __version__
from ..formats.reader import read_manifest
from ..formats.registry import format_named
from ..sources import ArraySource, Source
from ._encode import ImageOptions
from ._encode_pool import _encoded
from ._parts import parse_part, part_span
from ._lock import writer_lock
from ._sinks import is_write_error, prepare_dest, sink_for

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
    #: samples whose images were stored as JPEG with loss though nobody asked (image_mode='auto' given pixels)
    reencoded: int = 0

    @property
    def samples_per_s(self) -> float:
        return (self.samples - self.resumed_from) / self.seconds if self.seconds > 0 else float("inf")

    @property
    def where(self) -> str:
        return format_named(self.format).where(self.shards)

    def __str__(self) -> str:
        mb = self.bytes / 1e6
        lines = [
            f"packed {self.samples} samples into {self.dest} ({self.where}, {mb:.1f} MB) "
            f"in {self.seconds:.2f} s: {self.samples_per_s:,.0f} samples/s, {mb / max(self.seconds, 1e-9):.1f} MB/s",
        ]
        if self.resumed_from:
            lines.append(f"resumed after {self.resumed_from} samples already packed")
        if self.reencoded:
            lines.append(
                f"{self.reencoded} sample(s) had pixels, not JPEG bytes, and were re-encoded as JPEG (lossy; "
                f"image_mode='raw' keeps exact pixels)"
            )
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


# -- the pack into a local folder -----------------------------------------------------------------


def part_unit(src: Source, format: str, shard_bytes: int, block: int) -> int:
    """How many source samples a part packs whole (``part_span``'s unit): ``block``, or for fixed-size arrays
    the rows of one shard."""
    fmt = format_named(format)
    arrays = fmt.arrays and isinstance(src, ArraySource) and all(f.fixed_size for f in src.schema)
    return fmt.array_rows(src, shard_bytes) if arrays else block


def pack_local(
    src: Source,
    dest: Path,
    *,
    format: str,
    image_mode: str,
    max_side: int | None,
    quality: int,
    check: str,
    shard_size: int | str,
    workers: int | None,
    overwrite: bool,
    skip_bad: bool,
    max_skipped: float,
    progress: bool,
    block: int,
    part: Any,
    on_shard: Callable[[Path], None] | None,
    staged_for: str | None = None,
) -> PackSummary:
    """The pack into a local folder (``dest``, or the staging folder of a URL pack: ``staged_for``)."""
    opts = ImageOptions(image_mode, max_side, quality, check)
    shard_bytes = parse_size(shard_size)
    workers = os.cpu_count() or 1 if workers is None else int(workers)
    params = {
        "format": format,
        "image_mode": image_mode,
        "max_side": max_side,
        "quality": quality,
        "check": check,
        "shard_size": shard_bytes,
        "schema": src.schema.to_json(),
        "fingerprint": src.fingerprint(),
        "version": __version__,
        "block": block,
    }
    fmt = format_named(format)
    arrays = fmt.arrays and isinstance(src, ArraySource) and all(f.fixed_size for f in src.schema)
    span = (0, len(src))
    if part is not None:
        i, n = parse_part(part)
        unit = part_unit(src, format, shard_bytes, block)
        span = part_span(len(src), unit, i, n)
        if span[0] == span[1] and len(src):
            warnings.warn(
                f"fastload pack --part {i}/{n}: this part holds no sample: the source's {len(src)} samples fill "
                f"{-(-len(src) // unit)} unit(s) of {unit} (a part packs whole blocks, or a shard's rows of "
                f"fixed-size arrays), fewer than the {n} parts; split into fewer parts or pass a smaller "
                f"block",
                UserWarning,
                stacklevel=4,
            )
        params["part"] = {"index": i, "parts": n, "samples": list(span)}
        dest = dest / "parts" / str(i)
    label = staged_for or str(dest)  # what the user named: the URL, not the staging folder
    t0 = time.perf_counter()
    with ExitStack() as held:
        with _writing(dest):
            held.enter_context(writer_lock(dest, label))  # one writer per folder (_lock.py), before it is looked at
            state = prepare_dest(dest, overwrite, params, staged_for)
            if state is not None and state.get("complete"):
                m = read_manifest(dest)
                return PackSummary(
                    str(dest),
                    format,
                    m.num_samples,
                    m.skipped,
                    sum(s.bytes for s in m.shards),
                    len(m.shards),
                    time.perf_counter() - t0,
                    m.num_samples,
                )
            if arrays:
                writer = fmt.array_sink(dest, src, params, shard_bytes, state, span, on_shard, staged_for is not None)
                start = writer.next_sample
                writer.run(progress, label)
                manifest = writer.finish()
                return PackSummary(
                    str(dest),
                    format,
                    manifest.num_samples,
                    [],
                    writer.total_bytes(),
                    len(manifest.shards),
                    time.perf_counter() - t0,
                    start - span[0],
                )
            writer = sink_for(dest, src, params, shard_bytes, state, span, on_shard, staged_for is not None)
        start = writer.next_sample
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(
                total=span[1] - span[0], initial=start - span[0], unit="sample", desc=f"pack {label}", smoothing=0.1
            )
        samples = _encoded(src, opts, start, workers, span[1])
        limit = _SkipLimit(src, span, max_skipped, len(writer.state["skipped"]))
        reencoded = 0
        try:
            with _writing(dest):
                for i, encoded, error, note in samples:
                    if note is not None:
                        if not reencoded:
                            _warn_reencoded(src.describe(i), note)
                        reencoded += 1
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
        return PackSummary(
            str(dest),
            format,
            manifest.num_samples,
            manifest.skipped,
            writer.total_bytes(),
            len(manifest.shards),
            time.perf_counter() - t0,
            start - span[0],
            reencoded=reencoded,
        )


def _warn_reencoded(sample: str, note: str) -> None:
    """Once per pack: pixels changed by a JPEG re-encode nobody asked for (``fields/image.py`` says why)."""
    warnings.warn(
        f"fastload.pack re-encoded pixels as JPEG: {sample}: the image was {note}. Every such image of "
        f"this pack is re-encoded alike (warned once; the summary counts them). To store exact pixels, pass "
        f"image_mode='raw' (--image-mode raw; larger files); to store the source's own JPEG bytes, give them "
        f"as they are (a file path, bytes, a Hugging Face image column, a PIL image as Image.open returned "
        f"it)",
        UserWarning,
        stacklevel=2,
    )


def _hint(error: str) -> str:
    """What to do about a failed sample. A schema mismatch fails every sample alike: skipping would pack an
    empty dataset, so the hint is to fix the data or the schema, never ``skip_bad``."""
    if error.startswith("SchemaError:"):
        return (
            " (every sample like this one fails alike, so skipping is no fix: make the data and the schema "
            "agree, converting the data or declaring the field with schema=..., or change the options the "
            "error names)"
        )
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
        raise SourceError(
            f"skip_bad would skip {what} (skipped {self.skipped} so far), so the dataset would be "
            f"{'empty' if self.skipped >= self.total else 'missing much of its data'}; first "
            f"failures: {shown}. Fix the source, or raise max_skipped= (--max-skipped) if that many "
            f"bad samples are expected"
        )


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
        hint = (
            "the disk is full or a file size limit was reached" if full else "is the disk full, read-only or failing?"
        )
        raise FastloadError(
            f"cannot write the dataset at {dest}: {what} ({hint}). Nothing incomplete is marked "
            f"as finished: free some space and run the same pack again to resume where it "
            f"stopped"
        ) from e
