"""What every image decoder takes and gives: ``decode(sources, plan, out) -> [(k, message)]``, and what the
registry (``decoders/__init__.py``) knows of each decoder: a :class:`DecoderKind`.

``sources`` holds one batch's encoded images of one field (``ImageSources``, or for the GPU decoders any
sequence of bytes-like objects); ``plan`` is the batch's ``fastload.transforms.Plan`` for that field, made by
``transforms.ImagePipeline.plan`` (per sample: ``plan.crops`` the box (top, left, height, width in source
pixels), ``plan.flips`` the mirror, ``plan.out_hw`` the output size; ``plan.augment`` issue 21's
augmentation: the native decoder runs it fused with decoding, the GPU decoders with the batched torch engine
on their rows (:func:`check_augment` refuses what they cannot run), a decoder that cannot run it refuses it
with :func:`geometry_only`); ``out`` the uint8
``(n, H, W, 3)`` rows to write, on the decoder's device. Failed samples are reported as ``(position,
message)``, sorted, and zeroed; the others are written as if none failed. Positions are relative to
``sources``: a decoder given ``sources[k:]``, ``plan.take(k, n)`` and ``out[k:]`` reports ``(0, ...)`` for sample k.

``ImageSources`` is plain data serving both kinds of decoder without per-sample Python where it matters:
the native decoder hands its ``regions, region, offset, length`` (the whole batch) to one native call; the
GPU decoders iterate it as a sequence of zero-copy views, one per sample, computed from the same arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from ..formats._layout import IMAGE_JPEG


class ImageDecoder(Protocol):
    def decode(self, sources: Any, plan: Any, out: Any) -> list[tuple[int, str]]: ...

    def fence(self, out: Any) -> None: ...  # GPU decoders: ``out`` is new (see decoders/nvjpeg.py)

    # GPU decoders: every stream that writes the rows waits (on the device) on ``event``, the rows' latest
    # hand-over, before this decoder's next writes (see ``ImageDecoding.fill``)
    def after(self, event: Any) -> None: ...

    # GPU decoders: the event after the latest decode's last write of ``out``; readers wait on it on the
    # device (None, or no such method: complete when decode returns)
    def ready_event(self) -> Any: ...

    # optional: give back memory cached and not used now (DALI's pools), keeping what the next batch needs; at a
    # non-persistent loader's epoch end, in a thread of its own (it may synchronise the device)
    def release_unused(self) -> None: ...

    def close(self) -> None: ...


@dataclass
class DecoderContext:
    """What a decoder is made from, for one image field of one loader (``DecoderKind.make``)."""

    option: str  # the loader's ``decoder=`` (named in messages)
    batch_size: int
    out_hw: tuple[int, int]  # the field's rows: (H, W)
    device: Any  # torch.device of the rows, or None: the host slot
    num_threads: int
    native: Any  # the loader's NativeDecoder (its pool is the batcher's, set before each batch)
    fork_stream: Callable[[str], Any]  # a stream of the rows' streams backend (``_ring``) for the decoder's work
    field: str = ""  # the image field (decoder='auto' keeps each field's GPU half on or off on its own)


class DecoderSetupError(RuntimeError):
    """A decoder could not set itself up here (DALI's pipeline), at ``make`` or when ``decode`` has to set up again
    (DALI rebuilds its pipeline after a failed batch): no sample's fault. ``decoder='auto'`` then decodes with
    CPU threads instead, with a warning; a decoder asked for by name raises it."""


def _usable() -> None:
    """A decoder with nothing to install is always usable."""


@dataclass(frozen=True)
class DecoderKind:
    """One registered decoder (``decoders/__init__.py`` lists them): what a new decoder module provides as ``KIND``.

    ``make(ctx)`` returns the decoder of one image field (``decode``/``fence``/``close``, :class:`ImageDecoder`);
    it raises ImportError with an install hint when its package cannot be used, and any error naming the decoder and
    the reason when its set-up fails here (DALI's pipeline: ``dali.DaliBuildError``); ``'auto'`` pairs the next
    usable GPU decoder instead, or none, with a warning.
    ``probe()`` raises ModuleNotFoundError when the decoder's package is not installed (``decoder='auto'``
    moves on quietly) and any other exception when it is installed but unusable (named in a warning).
    ``gpu``: with ``device='cuda'`` it writes into device rows (without, into the host slot).
    ``needs_gpu``: it refuses a loader without ``device='cuda'``.
    ``pairs``: ``decoder='auto'`` may pair it with native threads (tried in registry order, first usable wins).
    ``choose(on_gpu)``: for a decoder that stands for another (``'auto'``): the kind that will run.
    ``augments``: it executes a plan's augmentation (vertical flips, affine maps, pixel operations, padded crop
    windows: ``Plan.augment``); a loader whose pipeline has one refuses a decoder without it when it is made, and
    ``'auto'`` then decodes with native threads only (saying so), instead of failing at the first batch.
    ``refuses``: ``(name, why)`` for what of the augmentation it still cannot run although it ``augments``, by the
    names ``_batcher.beyond_geometry`` gives (e.g. :data:`PADDED_CROP`); refused (or avoided by ``'auto'``) the
    same way. :meth:`refusal` says why a pipeline cannot run on it.
    """

    name: str
    make: Callable[[DecoderContext], Any]
    probe: Callable[[], None] = _usable
    gpu: bool = False
    needs_gpu: bool = False
    pairs: bool = False
    augments: bool = False
    choose: Callable[[bool], "DecoderKind"] | None = None
    split: Any = None  # the hybrid's HybridSplit (decoders/hybrid.py), shared by the loader's image fields
    refuses: tuple[tuple[str, str], ...] = ()

    def refusal(self, augmented: Sequence[str]) -> str | None:
        """Why this decoder cannot run a pipeline that plans ``augmented`` beyond crop, resize and horizontal flip
        (names, ``_batcher.beyond_geometry``), or None when it can."""
        if not augmented:
            return None
        if not self.augments:
            return (
                f"executes crop, resize and horizontal flip only, and the image pipeline also has "
                f"{', '.join(augmented)}"
            )
        why = [f"{name} ({reason})" for name, reason in self.refuses if name in augmented]
        return f"cannot run {'; '.join(why)}" if why else None


# What _batcher.beyond_geometry calls a crop-plan resize that is not bilinear (Resize/RandomResizedCrop with
# interpolation 'bicubic' or 'random', csrc/resize.cc): the GPU decoders' resizes are not PIL's bicubic, so they
# refuse it (their ``refuses``), and 'auto' decodes with native threads instead.
BICUBIC_RESIZE = "bicubic resize"
BICUBIC_REASON = "its resize is not PIL's antialiased bicubic; the native decoder resizes so"

# What _batcher.beyond_geometry calls a padded RandomCrop (a decoder's ``refuses`` could name it; every decoder
# that ``augments`` assembles padded windows now: the GPU ones with ``engine_torch.assemble_rows``).
PADDED_CROP = "RandomCrop with padding"

# What _batcher.beyond_geometry puts in the name of a transform fastload does not know: it runs per sample on the
# decoded rows on the host (``_augment/fallback.py``), after the decoder, so a decoder writing device rows cannot run
# it, whatever else of the augmentation it runs (``host_rows_refusal``).
PER_SAMPLE = "(a transform run per sample"
# ... and in the name of an erasing with noise after ToDtype/Normalize (``_augment/noise_erasing.py``): the fill stage
# writes it into the normalized rows on the host, so it needs host rows too.
HOST_FLOATS = "(on the host's normalized rows)"


def host_rows_refusal(augmented: Sequence[str]) -> str | None:
    """Why a decoder that writes its rows on the device cannot run a pipeline planning ``augmented`` (names,
    ``_batcher.beyond_geometry``): the transforms in it that run per sample on host rows; None when there is none."""
    names = [name for name in augmented if PER_SAMPLE in name or HOST_FLOATS in name]
    if not names:
        return None
    return (
        f"cannot run {', '.join(names)}: such a transform runs on the decoded rows on the host, and this decoder "
        f"writes them on the device"
    )


def geometry_only(plan: Any, n: int, who: str) -> None:
    """Refuse a plan a crop/resize/flip decoder cannot execute: one of another length, or one with issue 21's
    augmentation (vertical flips, affine maps, pixel operations, one channel) attached."""
    if plan.n != n:
        raise ValueError(f"the plan has {plan.n} samples but {n} images were given")
    aug = plan.augment
    if aug is None:
        return
    g = aug.geometry
    extra = [what for what, rows in (("vertical flips", g.vflip), ("affine transforms", g.has_affine)) if np.any(rows)]
    if aug.steps:
        extra.append("pixel operations (" + ", ".join(dict.fromkeys(step.op for step in aug.steps)) + ")")
    if g.pad is not None and np.any(g.pad.active):
        extra.append("padded crop windows (RandomCrop with padding)")
    if aug.channels != 3:
        extra.append(f"{aug.channels}-channel output")
    if extra:
        raise NotImplementedError(
            f"the {who} decoder executes crop, resize and horizontal flip only; this plan "
            f"also has {' and '.join(extra)}"
        )


def warn_frames(who: str) -> None:
    """Said once per decoder kind that cannot resample a region of interest: it resamples a resize-then-crop's
    rounded source box (``Plan.crops``), not the window of the whole resize (``Plan.frames``) that the native
    decoder resamples exactly and DALI's ``fn.resize`` with ``roi_start``/``roi_end``."""
    from .._ring import warn_once

    warn_once(
        f"frames-{who}",
        f"the {who} decoder resamples a resize followed by a crop (e.g. Resize(256), CenterCrop(224)) from the "
        f"crop's source box rounded to whole source pixels: where torchvision's crop starts between two source "
        f"pixels its pixels are shifted by up to half a source pixel (decoder='exact' computes torchvision's "
        f"pixels, decoder='native' too but on JPEGs it decodes DCT-scaled)",
    )


def check_augment(plan: Any, n: int, who: str) -> None:
    """What a decoder running ``plan.augment`` with the batched torch engine on its rows cannot run: a plan of
    another length, a bicubic resize (``plan.interp``), one channel. (Padded crop windows it runs:
    ``_staging.decode_sizes`` and ``augment_queued``.)"""
    if plan.n != n:
        raise ValueError(f"the plan has {plan.n} samples but {n} images were given")
    if getattr(plan, "interp", None) is not None and np.any(plan.interp):
        raise NotImplementedError(f"the {who} decoder cannot run a {BICUBIC_RESIZE} ({BICUBIC_REASON})")
    aug = plan.augment
    if aug is None:
        return
    if aug.channels != 3:
        raise NotImplementedError(
            f"the {who} decoder writes 3-channel rows; Grayscale(num_output_channels=1) is not "
            f"supported in a loader (use num_output_channels=3)"
        )


class JpegOnly:
    """A decoder that reads JPEG only (the GPU decoders, DALI's CPU-only mode) over ``ImageSources``: raw images
    fail with a hint to use the native decoder."""

    def __init__(self, decoder: Any, option: str):
        self.decoder, self.option = decoder, option

    def decode(self, sources: "ImageSources", plan: Any, out: Any) -> list[tuple[int, str]]:
        failures = self.decoder.decode(sources, plan, out)
        raw = np.flatnonzero(sources.meta[:, 2] != IMAGE_JPEG)
        if not raw.size:
            return failures
        bad = {j for j, _ in failures}
        return sorted(
            failures
            + [
                (
                    j,
                    f"a raw (not JPEG) image: decoder={self.option!r} decodes JPEG only on the "
                    f"GPU; use decoder='native'",
                )
                for j in raw.tolist()
                if j not in bad
            ]
        )

    def fence(self, out: Any) -> None:
        self.decoder.fence(out)

    def after(self, event: Any) -> None:
        self.decoder.after(event)

    def ready_event(self) -> Any:
        return self.decoder.ready_event()

    def release_unused(self) -> None:
        release = getattr(self.decoder, "release_unused", None)
        if release is not None:
            release()

    def close(self) -> None:
        self.decoder.close()


class ImageSources:
    """One batch's encoded images of one image field, positions ``0 .. n-1``: plain data, gathered by one reader
    call per batch (``PackedReader.image_sources``); a decoder only reads its attributes, never the reader.

    ``meta``: ``(n, 3)`` int64, each sample's stored height, width and encoding (``IMAGE_JPEG`` or raw).
    ``n``: the number of samples (an attribute: the native path reads it without a call).
    ``regions``, ``region``, ``offset``, ``length``: where sample k's bytes lie,
    ``regions[region[k]][offset[k]:offset[k] + length[k]]``, as the native calls take them (they bounds-check).
    ``sources[k]`` / iteration: sample k's bytes, a zero-copy view computed from those (the GPU decoders);
    ``sources[lo:hi]``: those samples, sharing ``regions``.
    """

    __slots__ = ("length", "meta", "n", "offset", "region", "regions")

    def __init__(self, meta: np.ndarray, regions: list, region: np.ndarray, offset: np.ndarray, length: np.ndarray):
        self.meta, self.n = meta, len(meta)
        self.regions, self.region, self.offset, self.length = regions, region, offset, length

    @classmethod
    def from_bytes(cls, blobs: Sequence[Any], sizes: Any, encodings: Any = IMAGE_JPEG) -> "ImageSources":
        """Encoded images held in memory: ``sizes`` ``(n, 2)`` their heights and widths."""
        n = len(blobs)
        meta = np.zeros((n, 3), np.int64)
        if n:
            meta[:, :2] = sizes
            meta[:, 2] = encodings
        return cls(
            meta,
            list(blobs),
            np.arange(n, dtype=np.int64),
            np.zeros(n, np.int64),
            np.array([len(b) for b in blobs], np.int64),
        )

    def __len__(self) -> int:
        return self.n

    def view(self, k: int) -> Any:
        """Sample k's bytes: its whole region (an LMDB value, an in-memory blob) or a view of it (a shard's
        mapped file, whose offsets were checked when it was opened)."""
        buf = self.regions[int(self.region[k])]
        start, size = int(self.offset[k]), int(self.length[k])
        if start == 0 and size == len(buf):
            return buf
        return memoryview(buf)[start : start + size]

    def __getitem__(self, k: int | slice) -> Any:
        n = self.n
        if isinstance(k, slice):
            lo, hi, step = k.indices(n)
            if step != 1:
                raise ValueError(f"ImageSources slices must be contiguous, got step {step}")
            hi = max(lo, hi)
            return ImageSources(
                self.meta[lo:hi], self.regions, self.region[lo:hi], self.offset[lo:hi], self.length[lo:hi]
            )
        k = int(k)
        if not -n <= k < n:
            raise IndexError(f"sample {k} out of range for {n} images")
        return self.view(k % n)

    def __iter__(self):
        return iter([self.view(k) for k in range(self.n)])  # one call, not one generator step per sample
