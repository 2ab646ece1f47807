"""What every image decoder takes and gives: ``decode(sources, crops, flips, out) -> [(k, message)]``.

``sources`` holds one batch's encoded images of one field (``ImageSources``, or for the GPU decoders any
sequence of bytes-like objects); ``crops`` are the planned boxes ``(n, 4)`` (top, left, height, width in
source pixels) and ``flips`` ``(n,)`` the planned mirrors (``transforms.ImagePipeline.plan``); ``out`` the
uint8 ``(n, H, W, 3)`` rows to write, on the decoder's device. Failed samples are reported as
``(position, message)``, sorted, and zeroed; the others are written as if none failed. Positions are
relative to ``sources``: a decoder given ``sources[k:]`` and ``out[k:]`` reports ``(0, ...)`` for sample k.

``ImageSources`` serves both kinds of reader without per-sample Python where it matters: the native
decoder takes ``located()``, the whole batch's (regions, region, offset, length) for one native call;
the GPU decoders iterate it as a sequence of zero-copy views, one per sample.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import numpy as np

from ..formats._layout import IMAGE_JPEG


class ImageDecoder(Protocol):
    def decode(self, sources: Any, crops: np.ndarray, flips: np.ndarray, out: Any) -> list[tuple[int, str]]: ...

    def close(self) -> None: ...


class ImageSources:
    """One batch's encoded images of one image field, positions ``0 .. n-1``.

    ``meta``: ``(n, 3)`` int64, each sample's stored height, width and encoding (``IMAGE_JPEG`` or raw).
    ``located()``: ``(regions, region, offset, length)`` for the native calls (computed on first use).
    ``sources[k]`` / iteration: sample k's bytes; ``sources[lo:hi]``: those samples, sharing ``located()``.
    """

    __slots__ = ("meta", "_locate", "_blob", "_located")

    def __init__(self, meta: np.ndarray, locate: Callable[[], tuple], blob: Callable[[int], Any]):
        self.meta = meta
        self._locate = locate
        self._blob = blob
        self._located: tuple | None = None

    @classmethod
    def of(cls, reader: Any, at: Any, field: str) -> "ImageSources":
        """Field ``field`` of the batch ``at`` located by ``reader`` (a ``formats.reader.PackedReader``)."""
        meta = reader.take(at, field, "meta").astype(np.int64)
        return cls(meta, lambda: reader.blob_sources(at, field), lambda k: reader.blob(at, field, k))

    @classmethod
    def from_bytes(cls, blobs: Sequence[Any], sizes: Any, encodings: Any = IMAGE_JPEG) -> "ImageSources":
        """Encoded images held in memory: ``sizes`` ``(n, 2)`` their heights and widths."""
        n = len(blobs)
        meta = np.zeros((n, 3), np.int64)
        if n:
            meta[:, :2] = sizes
            meta[:, 2] = encodings
        blobs = list(blobs)
        located = (blobs, np.arange(n, dtype=np.int64), np.zeros(n, np.int64),
                   np.array([len(b) for b in blobs], np.int64))
        return cls(meta, lambda: located, blobs.__getitem__)

    def __len__(self) -> int:
        return len(self.meta)

    def located(self) -> tuple[list, np.ndarray, np.ndarray, np.ndarray]:
        """Where each sample's bytes lie: ``(regions, region, offset, length)`` (``PackedReader.blob_sources``)."""
        if self._located is None:
            self._located = self._locate()
        return self._located

    def __getitem__(self, k: int | slice) -> Any:
        n = len(self.meta)
        if isinstance(k, slice):
            lo, hi, step = k.indices(n)
            if step != 1:
                raise ValueError(f"ImageSources slices must be contiguous, got step {step}")
            hi = max(lo, hi)

            def locate() -> tuple:
                regions, region, offset, length = self.located()
                return regions, region[lo:hi], offset[lo:hi], length[lo:hi]

            blob = self._blob
            return ImageSources(self.meta[lo:hi], locate, lambda j: blob(lo + j))
        k = int(k)
        if not -n <= k < n:
            raise IndexError(f"sample {k} out of range for {n} images")
        return self._blob(k % n)

    def __iter__(self):
        return (self._blob(k) for k in range(len(self.meta)))
