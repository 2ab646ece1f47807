"""``decoder="dali"``: NVIDIA DALI executes fastload's plans (crop box, output size, flip per sample).

One DALI pipeline per decoder, built once for ``batch_size`` samples and run once per batch::

    external_source (JPEG bytes, crop anchor, crop shape, flip)
      ▸ fn.decoders.image_slice  ROI decode of the planned box, RGB, EXIF orientation ignored
      ▸ fn.resize                to out_hw, linear, antialiased (a triangle filter like PIL/native)
      ▸ fn.flip                  horizontal, per sample
      ▸ copy_to_external         into the caller's ``out`` (what DALI's ``feed_ndarray`` does)

The crop boxes come from :meth:`fastload.transforms.ImagePipeline.plan`, never from DALI's own random
crop RNG, so every decoder executes the same plan for a given (dataset, seed, transforms).

Devices. ``device_id=None`` is DALI's CPU-only mode (libjpeg-turbo through nvImageCodec, no CUDA
needed, what ``make test`` runs). ``device_id=k`` decodes with ``device="mixed"`` (nvJPEG, the A100+
hardware decoder where present; ``jpeg_fancy_upsampling`` on, so chroma is upsampled like the CPU
path) and resizes and flips on GPU ``k``; ``out`` must then be a CUDA tensor on that device.

Copies. DALI owns its output buffers and cannot write into a caller's memory, so the result reaches
``out`` by exactly one copy (device to device on the GPU). The input bytes are handed to DALI as
zero-copy numpy views of the shard memory; DALI copies them once into its own buffers
(``no_copy=False``): with ``no_copy=True`` DALI keeps references to the last batch's inputs, which
would keep the shard's mmap exported and make it impossible to close.

Streams. On the GPU the decoder's stream comes from the slot ring's streams backend (``fork``; tests/
sim_streams.py runs it on a simulated GPU with a fake pipeline). ``run(stream)`` returns outputs on that
stream (DALI's asynchronous outputs, kept referenced until the event after the copies that read them has
completed), the copy into ``out`` and the zeroing of failed rows are queued there too, and ``decode`` returns
without waiting for any of it: it records an event after the last write (``ready_event``), which whoever
reads ``out`` waits on on the device (``_images.ImageDecoding`` hands it on with the batch). A new row
buffer is fenced once (``fence``: the stream waits on the stream that allocated it).

Augmentation. A plan with issue 21's augmentation (``plan.augment``) runs with the batched torch engine
(``_augment/engine_torch.py``) on the rows after the copy into ``out``: on the GPU queued on the decoder's
stream before the ready event (its columns through pinned staging), in CPU-only mode on the host rows at once.
DALI applied the crops, sizes and horizontal flips (``flips=False``); failed rows are zeroed after it. A padded
RandomCrop window (``_augment/padding.py``): its box is resized to its own size (``Padding.decode_hw``, a per-sample
``size`` input of ``fn.resize``), not flipped, and ``fn.pad`` places it at the top left of a full row; the engine
then assembles the window there (``engine_torch.assemble_rows``), as the native decoder does. That graph
(``_padded``) is built on the first batch of a pipeline with a padded RandomCrop and kept for all its batches (a
batch without a padded window has every sample's size ``out_hw``); other pipelines keep the plain one.

Failures. A sample DALI cannot decode makes DALI raise for the whole batch and leaves the pipeline
unusable ("Current pipeline object is no longer valid"). Cheap checks run first (empty blob, no JPEG
signature, crop box with a negative corner or an empty side) and fail only their sample. If DALI
still raises, the decoder rebuilds the pipeline (about 10 ms on CPU) and decodes that batch again
sample by sample, rebuilding after each failure: good samples are kept, each bad one is reported as
``(k, message)`` with DALI's message and zeroed, as the native ``decode_batch`` does. A corrupt
sample therefore costs one extra pass over its batch, nothing for the other batches.

Agreement with the native decoder (``fastload._C.decode_batch`` on the same plans), mean absolute
difference in gray levels over all pixels of a sample, measured on 60 synthetic photos x 5 plan
seeds x 2 output sizes (16-400 px sides; baseline 4:2:0, 4:4:4, 4:2:2, progressive, grayscale,
CMYK; RandomResizedCrop + flip) plus tests/native/native_common.py CROPS (whole image down to 1x1, up-
and downscaling):

  CPU-only mode vs native, ``dct_scaling=False``        measured <= 0.42 (mean 0.17)   tolerance 1.0
  CPU-only mode vs native as the Batcher runs it        measured <= 3.04 (mean 0.35)   tolerance 4.0
    (DCT-scaled decoding, the native default; the native DCT path is itself up to 3.0 from its
    exact decode on 4:2:2 images shrunk a lot, so this bound measures native's approximation)
  GPU (mixed) vs CPU-only mode                          not measured yet               tolerance 3.0

Single pixels differ by at most 1 at 224x224 outputs and up to 10 where a large crop shrinks to a
few dozen pixels, in the outermost rows and columns: the two resamplers treat the part of a wide
antialiasing filter that hangs past the crop edge differently.

Both CPU-mode decoders use libjpeg-turbo's ISLOW IDCT with fancy upsampling, so the decoded pixels
are the same; the remaining difference is resampling (DALI: float weights, native: int16 fixed point;
edges as above). Shapes and dtypes are identical: ``(n, H, W, 3)`` uint8, NHWC.

Limits: JPEG only (raw-RGB samples stay on the native path); one caller at a time (a lock
serialises :meth:`DaliDecoder.decode`); build the decoder in the process that uses it (DALI
pipelines do not survive ``fork``).
"""

from __future__ import annotations

import ctypes
import re
import threading
from typing import Any, Sequence

import numpy as np
import torch

from .._install import pip_extra
from .._native import is_jpeg
from .._ring import streams_for
from .._augment.engine_torch import assemble_rows, augment_rows, padding_columns
from ._base import (
    BICUBIC_REASON,
    BICUBIC_RESIZE,
    DecoderContext,
    DecoderKind,
    DecoderSetupError,
    JpegOnly,
    check_augment,
)
from ._staging import Uploads, augment_queued, beyond_flips, decode_sizes

__all__ = ["DaliBuildError", "DaliDecoder", "INSTALL_HINT"]

INSTALL_HINT = f"decoder='dali' needs NVIDIA DALI: {pip_extra('dali')} (or pip install nvidia-dali-cuda130)"


MIN_VERSION = (1, 44)  # exec_dynamic (no longer experimental) and Pipeline.run(cuda_stream, /, **inputs)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


def _import_dali(strict: bool = False) -> tuple[Any, Any, Any]:
    """(fn, types, pipeline_def) from DALI, or ImportError with the install hint (any failure to import,
    not only ImportError, or a DALI below ``MIN_VERSION``). ``strict``: a missing DALI stays
    ModuleNotFoundError (decoder='auto' moves on without a warning)."""
    try:
        import nvidia.dali as dali
        from nvidia.dali import fn, pipeline_def, types
    except ModuleNotFoundError as e:
        if strict:
            raise
        raise ImportError(INSTALL_HINT) from e
    except Exception as e:  # noqa: BLE001  (a broken install raises anything at import)
        raise ImportError(f"{INSTALL_HINT}; importing DALI failed: {type(e).__name__}: {e}") from e
    version = getattr(dali, "__version__", "0")
    if _version(version) < MIN_VERSION:
        raise ImportError(
            f"DALI {version} is too old for decoder='dali': fastload needs DALI >= "
            f"{'.'.join(map(str, MIN_VERSION))} (its dynamic executor and run(cuda_stream)); "
            f"{INSTALL_HINT}"
        )
    return fn, types, pipeline_def


def _positive(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{what}={value!r} should be a positive int")
    return int(value)


class DaliBuildError(DecoderSetupError):
    """DALI imported but could not build its pipeline here (no GPU it can use, a DALI that does not match the
    driver, out of memory...): no sample's fault, so ``decode`` never reports it as failed samples."""


def _dali_text(err: BaseException) -> str:
    """DALI's error text without the pipeline traceback and C++ context lines."""
    text = str(err)
    if "encountered:" in text:
        text = text.split("encountered:", 1)[1]
    lines = [ln.strip() for ln in text.splitlines()]
    keep = [
        ln for ln in lines if ln and not ln.startswith("C++ context") and "pipeline object is no longer valid" not in ln
    ]
    return " ".join(keep).strip() or type(err).__name__


def _frame_rois(frames: np.ndarray, out_hw: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """``Plan.frames`` as DALI runs them: the boxes to decode (int32 (n, 4), the box each resize reads), and each
    sample's region of interest in its box, float32 (n, 4) (start y, start x, end y, end x): the output window of the
    box's whole resize in source pixels, fractional where the crop starts between two of them."""
    f = frames.astype(np.float64)
    sy, sx = f[:, 2] / f[:, 4], f[:, 3] / f[:, 5]  # source pixels per resized pixel
    oh, ow = out_hw
    rois = np.stack([f[:, 6] * sy, f[:, 7] * sx, (f[:, 6] + oh) * sy, (f[:, 7] + ow) * sx], axis=1)
    return frames[:, :4].astype(np.int32), rois.astype(np.float32)


def _dali_message(err: BaseException) -> str:
    msg = _dali_text(err)
    msg = re.sub(r"Failed to decode sample #\d+\s*:?\s*$", "the JPEG data is corrupt or truncated", msg)
    return f"DALI could not decode the image: {msg}"


class DaliDecoder:
    """Decode, crop, resize and flip batches of JPEGs with NVIDIA DALI into a caller's buffer.

    ``batch_size`` is the largest batch :meth:`decode` accepts (smaller ones are fine);
    ``out_hw`` the (H, W) every sample comes out as; ``device_id`` None for DALI's CPU-only mode or
    a CUDA device index; ``num_threads`` DALI's CPU worker threads; ``seed`` DALI's pipeline seed
    (nothing random runs inside DALI: fastload plans the crops and flips).
    """

    def __init__(
        self,
        batch_size: int,
        out_hw: tuple[int, int],
        *,
        device_id: int | None = None,
        num_threads: int = 1,
        seed: int = 0,
        streams: Any = None,
    ) -> None:
        self.batch_size = _positive(batch_size, "batch_size")
        try:
            h, w = out_hw
        except (TypeError, ValueError):
            raise ValueError(f"out_hw={out_hw!r} should be (height, width)") from None
        self.out_hw = (_positive(h, "out_hw height"), _positive(w, "out_hw width"))
        if device_id is not None and (isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0):
            raise ValueError(
                f"device_id={device_id!r} should be None (DALI's CPU-only mode) or a CUDA device index >= 0"
            )
        self.device_id = device_id
        self.num_threads = _positive(num_threads, "num_threads")
        self.seed = int(seed)
        self._fn, self._types, self._pipeline_def = _import_dali()
        self._lock = threading.Lock()
        self._closed = False
        self._held: list = []  # this batch's DALI outputs (and pipelines that raised), read by queued copies
        self._kept: list = []  # [(earlier batches' held objects, the event after their copies)]
        self.streams = None  # the ring's streams backend with the decoder's stream (GPU mode)
        self.ready = None  # the event after the latest decode's last write (GPU mode)
        self._uploads = None  # pinned staging of the augmentation's columns (GPU mode, decoders/_staging.py)
        if device_id is not None:
            if streams is None:
                if not torch.cuda.is_available() or device_id >= torch.cuda.device_count():
                    raise ValueError(
                        f"device_id={device_id} but torch sees "
                        f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} CUDA "
                        f"device(s); pass device_id=None for DALI's CPU-only mode"
                    )
                streams = streams_for(torch.device("cuda", device_id)).fork("dali")
            self.streams = streams
        self._pipe = None
        self._padded = False  # whether _build makes (and self._pipe is) the graph with per-sample sizes
        self._framed = False  # ... the graph with per-sample regions of interest (Plan.frames)
        self._make_pipe()  # now, in the thread that makes the decoder: a DALI that cannot run here says so at once

    def __repr__(self) -> str:
        return (
            f"DaliDecoder(batch_size={self.batch_size}, out_hw={self.out_hw}, device_id={self.device_id}, "
            f"num_threads={self.num_threads})"
        )

    # -- pipeline --------------------------------------------------------------------------------
    def _build(self) -> None:
        """The pipeline; with ``self._padded`` a per-sample ``size`` (each box's own, <= ``out_hw``) and ``fn.pad``
        to ``out_hw`` (bottom and right, zeros), for the padded crop windows; with ``self._framed`` a per-sample
        region of interest of the decoded slice (``roi_start``, ``roi_end``: absolute, fractional), for a resize
        followed by a crop (``Plan.frames``)."""
        fn, types = self._fn, self._types
        padded, framed = self._padded, self._framed
        mixed = self.device_id is not None
        decode_kw = {"device": "mixed", "jpeg_fancy_upsampling": True} if mixed else {"device": "cpu"}
        out_h, out_w = self.out_hw

        # DALI's default (dynamic) executor, one batch in flight (prefetch_queue_depth=1, so run() takes the
        # inputs): on the GPU run() returns outputs bound to our stream ("asynchronous outputs", which the
        # legacy synchronous executor refuses: the H100 run failed every batch with exec_async=False); decode()
        # queues its copy there and hands the rows on with an event, without waiting for the stream.
        @self._pipeline_def(
            batch_size=self.batch_size,
            num_threads=self.num_threads,
            device_id=self.device_id,
            seed=self.seed,
            exec_dynamic=True,
            prefetch_queue_depth=1,
        )
        def graph():
            data = fn.external_source(name="data", dtype=types.UINT8, ndim=1, no_copy=False)
            anchor = fn.external_source(name="anchor", dtype=types.INT32, ndim=1)  # top, left
            shape = fn.external_source(name="shape", dtype=types.INT32, ndim=1)  # height, width
            flip = fn.external_source(name="flip", dtype=types.INT32, ndim=0)
            img = fn.decoders.image_slice(
                data, anchor, shape, axis_names="HW", output_type=types.RGB, adjust_orientation=False, **decode_kw
            )
            size = fn.external_source(name="size", dtype=types.FLOAT, ndim=1) if padded else [out_h, out_w]
            roi: dict = {}
            if framed:  # the window of the slice's whole resize: its source box, fractional (DALI reads around it)
                roi = {
                    "roi_start": fn.external_source(name="roi_start", dtype=types.FLOAT, ndim=1),
                    "roi_end": fn.external_source(name="roi_end", dtype=types.FLOAT, ndim=1),
                    "roi_relative": False,
                }
            img = fn.resize(img, size=size, interp_type=types.INTERP_LINEAR, antialias=True, **roi)
            img = fn.flip(img, horizontal=flip)
            return fn.pad(img, axis_names="HW", shape=[out_h, out_w], fill_value=0) if padded else img

        pipe = graph()
        pipe.build()
        self._pipe = pipe

    def _make_pipe(self) -> None:
        """``_build``, its failure a ``DaliBuildError`` that says where DALI could not run and why."""
        try:
            self._build()
        except Exception as e:  # noqa: BLE001  (whatever DALI raises: named in the error)
            where = "in its CPU-only mode" if self.device_id is None else f"on cuda:{self.device_id}"
            raise DaliBuildError(
                f"DALI could not build its decoding pipeline {where}: {type(e).__name__}: {_dali_text(e)}"
            ) from e

    def _run(
        self,
        data: list,
        crops: np.ndarray,
        flips: np.ndarray,
        sizes: np.ndarray | None = None,
        rois: np.ndarray | None = None,
    ) -> Any:
        """Run the pipeline on one batch (``sizes``: each sample's resized size, with padded windows; ``rois``: each
        sample's region of interest in its slice, (start y, start x, end y, end x), with ``Plan.frames``)."""
        if self._pipe is None or self._padded != (sizes is not None) or self._framed != (rois is not None):
            if self._pipe is not None:  # its earlier outputs may still be read by copies queued on our stream
                self._held.append(self._pipe)
            self._padded = sizes is not None
            self._framed = rois is not None
            self._make_pipe()
        extra = {} if sizes is None else {"size": sizes.astype(np.float32)}
        if rois is not None:
            extra["roi_start"] = np.ascontiguousarray(rois[:, :2], dtype=np.float32)
            extra["roi_end"] = np.ascontiguousarray(rois[:, 2:], dtype=np.float32)
        try:
            (images,) = self._pipe.run(
                self._side(),
                data=data,
                anchor=np.ascontiguousarray(crops[:, :2]),
                shape=np.ascontiguousarray(crops[:, 2:]),
                flip=flips.astype(np.int32),
                **extra,
            )
        except RuntimeError:
            self._held.append(self._pipe)  # its earlier outputs may still be read by copies queued on our stream
            self._pipe = None  # DALI invalidates a pipeline that raised; the next run rebuilds it
            raise
        self._held.append(images)  # read by the copy queued next: let go once that completed (a query)
        expected = [self.out_hw[0], self.out_hw[1], 3]
        shapes = images.shape()
        if len(shapes) != len(data) or any(list(s) != expected for s in shapes):
            raise RuntimeError(
                f"DALI returned shapes {shapes[:3]}... for {len(data)} samples, expected {len(data)} x {expected}"
            )
        return images

    def _side(self) -> Any:
        """The decoder's stream (None in CPU-only mode: DALI's outputs are then host-synchronous)."""
        return None if self.streams is None else self.streams.side

    def _copy_out(self, images: Any, out: torch.Tensor, positions: np.ndarray) -> None:
        """Copy DALI's samples into out[positions] (one copy; one call when positions is 0..n-1), queued on
        the decoder's stream after the run that made them (the run returned its outputs on that stream)."""
        sample_bytes = self.out_hw[0] * self.out_hw[1] * 3
        base = out.data_ptr()
        stream = _stream_handle(self._side())

        def copy(src: Any, ptr: int) -> None:
            if stream is None:
                src.copy_to_external(ctypes.c_void_p(ptr))
            else:
                src.copy_to_external(ctypes.c_void_p(ptr), stream, non_blocking=True)

        if len(positions) == out.shape[0]:  # positions are 0..n-1: the whole batch at once
            copy(images, base)
        else:
            for j, k in enumerate(positions.tolist()):
                copy(images[j], base + k * sample_bytes)

    def fence(self, out: torch.Tensor) -> None:
        """``out`` is new: it was allocated on this thread's current stream, whose queued kernels may still
        use its memory (the slot ring's rule 3, fastload/_ring.py); our stream writes only after them. Once
        per buffer; later batches wait only on the buffer's previous hand-over (``after``)."""
        s = self.streams
        if s is not None:
            s.wait(s.side, s.record(s.consumer()))
            s.record_stream(out, s.side)  # freed (the ring let go of it) only once our writes have run

    def after(self, event: Any) -> None:
        """Our next writes come after ``event`` (a row buffer's latest hand-over, as ``NvjpegDecoder.after``);
        a device-side wait (none in CPU-only mode: its rows are complete when decode returns)."""
        s = self.streams
        if s is not None:
            s.wait(s.side, event)

    def ready_event(self) -> Any:
        """The event after the latest ``decode``'s last write of its rows (None in CPU-only mode: complete)."""
        return self.ready

    def _let_go(self) -> None:
        """Drop the DALI outputs (and pipelines that raised) of earlier batches whose copies have completed:
        they are kept referenced until then, so DALI cannot hand their memory to a later run while a copy
        queued on our stream still reads it (we no longer wait for the stream)."""
        s = self.streams
        self._kept = [(objs, ev) for objs, ev in self._kept if s is not None and not s.done(ev)]

    # -- the decoder -----------------------------------------------------------------------------
    def _check_out(self, out: Any, n: int) -> torch.Tensor:
        t = torch.from_numpy(out) if isinstance(out, np.ndarray) else out
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"out: expected a uint8 torch tensor (or numpy array) of shape "
                f"({n}, {self.out_hw[0]}, {self.out_hw[1]}, 3), got {type(out).__name__}"
            )
        expected = (n, self.out_hw[0], self.out_hw[1], 3)
        if t.dtype != torch.uint8 or tuple(t.shape) != expected:
            raise ValueError(f"out: expected uint8 of shape {expected}, got {t.dtype} of shape {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"out: expected a contiguous (NHWC) buffer, got strides {t.stride()}")
        if self.device_id is None and t.device.type != "cpu":
            raise ValueError(
                f"out is on {t.device} but this DaliDecoder runs in DALI's CPU-only mode "
                f"(device_id=None); pass a CPU buffer or build it with device_id={t.device.index}"
            )
        if self.device_id is not None and (t.device.type != "cuda" or t.device.index != self.device_id):
            raise ValueError(
                f"out is on {t.device} but this DaliDecoder decodes on cuda:{self.device_id}; "
                f"pass a buffer on cuda:{self.device_id}"
            )
        return t

    def decode(self, blobs: Sequence[Any], plan: Any, out: Any) -> list[tuple[int, str]]:
        """Decode ``blobs[k]``, crop ``plan.crops[k]`` (top, left, height, width in source pixels), resize to
        ``out_hw``, mirror if ``plan.flips[k]``, into ``out[k]``; returns the failures ``[(k, message)]``.
        ``blobs``: bytes-like objects, a list or an ``ImageSources`` (the interface of ``decoders/_base.py``);
        ``plan``: a ``fastload.transforms.Plan`` of as many samples.

        ``out`` is a contiguous uint8 ``(n, H, W, 3)`` tensor (a numpy array works in CPU-only mode) on
        this decoder's device. Failed samples are zeroed; the others are written as if none failed.
        """
        n = len(blobs)
        check_augment(plan, n, "dali")
        crops = np.asarray(plan.crops)
        flips = np.asarray(plan.flips)
        if n > self.batch_size:
            raise ValueError(f"{n} samples but this DaliDecoder was built for batch_size={self.batch_size}")
        if crops.shape != (n, 4) or not np.issubdtype(crops.dtype, np.integer):
            raise ValueError(
                f"plan.crops: expected an integer array of shape ({n}, 4), got {crops.dtype} {crops.shape}"
            )
        if flips.shape != (n,):
            raise ValueError(f"plan.flips: expected shape ({n},), got {flips.shape}")
        t = self._check_out(out, n)
        if n == 0:
            return []
        if crops.min() < np.iinfo(np.int32).min or crops.max() > np.iinfo(np.int32).max:
            raise ValueError("plan.crops: values do not fit in int32")
        crops = crops.astype(np.int32)
        sizes, flips = decode_sizes(plan, self.out_hw)  # padded windows: their boxes, at their size, unflipped
        rois = None
        frames = getattr(plan, "frames", None)
        if frames is not None and sizes is None:  # a resize then a crop: the box it resizes, and the window in it
            crops, rois = _frame_rois(np.asarray(frames), self.out_hw)
        with self._lock:
            if self._closed:
                raise ValueError("this DaliDecoder is closed")
            self._let_go()
            data = [np.frombuffer(b, dtype=np.uint8) for b in blobs]  # views; DALI copies them
            failures: dict[int, str] = {}
            for k, d in enumerate(data):
                top, left, h, w = crops[k].tolist()
                if d.size == 0:
                    failures[k] = "empty image data"
                elif not is_jpeg(d):
                    failures[k] = f"not a JPEG (starts with {bytes(d[:4])!r}); the DALI decoder reads JPEG only"
                elif top < 0 or left < 0 or h < 1 or w < 1:
                    failures[k] = f"crop (top, left, height, width)={(top, left, h, w)} is not inside the image"
            good = np.array([k for k in range(n) if k not in failures], dtype=np.int64)
            if good.size:
                try:
                    images = self._run(
                        [data[k] for k in good.tolist()],
                        crops[good],
                        flips[good],
                        None if sizes is None else sizes[good],
                        None if rois is None else rois[good],
                    )
                    self._copy_out(images, t, good)
                except DaliBuildError:
                    raise
                except RuntimeError:
                    for k in good.tolist():  # find the bad samples; keep the good ones
                        try:
                            self._copy_out(
                                self._run(
                                    [data[k]],
                                    crops[k : k + 1],
                                    flips[k : k + 1],
                                    None if sizes is None else sizes[k : k + 1],
                                    None if rois is None else rois[k : k + 1],
                                ),
                                t,
                                np.array([k]),
                            )
                        except DaliBuildError:
                            raise
                        except RuntimeError as e:
                            failures[k] = _dali_message(e)
            s = self.streams
            aug = plan.augment
            if beyond_flips(aug) or sizes is not None:  # the torch engine on the rows, before failed rows are zeroed
                if s is None:  # CPU-only mode: DALI's outputs were copied synchronously into the host rows
                    if sizes is not None:
                        assemble_rows(t, [torch.from_numpy(a) for a in padding_columns(aug)])
                    if beyond_flips(aug):
                        augment_rows(t, aug, flips=False)
                else:
                    if self._uploads is None:
                        self._uploads = Uploads(s)
                    with s.side_context():
                        augment_queued(s, self._uploads, plan.augment, t, "dali augment")
            if failures:  # zeroed on our stream, after the copies (on the producer thread's default stream
                # the zeroing was unordered with the prefetcher's copy of these rows)
                with s.side_context() if s is not None else _Null():
                    for k in sorted(failures):
                        row = t[k]
                        if s is None:
                            row.zero_()
                        else:
                            s.launch(lambda row=row: row.zero_(), writes=(row,), what="dali zero failed")
            if s is not None:  # handed on with an event, never a host wait
                self.ready = s.record(s.side)
                self._kept.append((self._held, self.ready))
            self._held = []
        return sorted(failures.items())

    def release_unused(self) -> None:
        """DALI's memory pools give back the memory no pipeline uses now (``nvidia.dali.backend.ReleaseUnusedMemory``,
        e.g. the high water of an epoch's batches at a non-persistent loader's epoch end); the pipeline stays, so the
        next epoch does not build it again. It may synchronise the device: never in the training thread
        (``_images.ImageDecoding.end_epoch`` runs it in a thread of its own). Nothing to do in CPU-only mode, or with
        a DALI without that call. Not under the decoder's lock, on purpose: DALI documents the call as safe while
        pipelines run (its pools lock themselves), it touches none of this decoder's state, and under the lock the
        next epoch's first decode would wait for the device synchronisation it may do."""
        if self.device_id is None:
            return
        try:
            from nvidia.dali import backend
        except Exception:  # noqa: BLE001  (the sim's stand-in, or a DALI that imports differently: nothing cached)
            return
        release = getattr(backend, "ReleaseUnusedMemory", None)
        if release is not None:
            release()

    def close(self) -> None:
        """Release the DALI pipeline (and its GPU memory); decode() afterwards raises."""
        with self._lock:
            self._pipe = None
            self._closed = True
            self.streams = None


def probe() -> None:
    """ModuleNotFoundError when DALI is not installed; ImportError when it is but cannot be used (too old, broken)."""
    _import_dali(strict=True)


def _make(ctx: DecoderContext) -> JpegOnly:
    dev = ctx.device
    try:
        dec = DaliDecoder(
            ctx.batch_size,
            ctx.out_hw,
            device_id=None if dev is None else dev.index,
            num_threads=max(1, ctx.num_threads),
            seed=0,
            streams=None if dev is None else ctx.fork_stream("dali"),
        )
    except DaliBuildError as e:
        if ctx.option != "dali":  # decoder='auto' falls back and says why (decoders/hybrid.py)
            raise
        # asked for by name: the user's choice does not silently change
        raise DaliBuildError(
            f"decoder='dali': {e}; use decoder='native' (CPU threads) or 'auto' (CPU threads "
            f"with another GPU decoder where one works)"
        ) from e.__cause__
    return JpegOnly(dec, ctx.option)


# on the GPU with device='cuda', else DALI's CPU-only mode into the host slot
KIND = DecoderKind(
    "dali", make=_make, probe=probe, gpu=True, pairs=True, augments=True, refuses=((BICUBIC_RESIZE, BICUBIC_REASON),)
)


def _stream_handle(stream: Any) -> Any:
    """A stream as DALI's copy_to_external takes it: a cudaStream_t in a ctypes.c_void_p for torch's streams;
    any other backend's stream object as it is (tests/sim_streams.py's simulated ones)."""
    if stream is None:
        return None
    raw = getattr(stream, "cuda_stream", None)
    return stream if raw is None else ctypes.c_void_p(raw)


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
