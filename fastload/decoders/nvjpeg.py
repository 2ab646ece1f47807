"""``decoder="nvjpeg"``: torchvision's batched GPU JPEG decoder executing fastload's plans.

Per batch: ``torchvision.io.decode_jpeg(list, device="cuda")`` decodes every image with nvJPEG in one
call; the images are padded (in chunks sized by pixels) and cropped, resized (PIL's antialiased triangle
filter, as the native core) and flipped as batched matrix products in float64 (``_resample.py``: the
pixels do not depend on TF32, matmul precision or autocast), then written into the caller's CUDA buffer.

Streams. The work runs on the decoder's own stream, reached through the slot ring's streams backend
(``_ring.CudaStreams``; tests/sim_streams.py runs the same calls on a simulated GPU). When a row buffer is
new, ``fence`` makes that stream wait on the stream it was allocated on (its memory may still be used by
kernels queued there: rule 3 of fastload/_ring.py); later batches need no wait, since a slot is refilled
only after the copy that read it completed. ``decode`` returns with the work queued, never waiting for it:
it records an event after its last write (``ready_event``) and whoever reads the rows waits on that event on
the device (``_images.ImageDecoding`` hands it on with the batch). The plan's arrays reach the device
through pinned staging (``_staging.Uploads``): a copy from pageable memory would wait for the stream.

torchvision's outputs. ``decode_jpeg(device='cuda')`` (torchvision/csrc/io/image/cuda/decode_jpegs_cuda.cpp)
allocates the decoded images on the caller's current stream but writes them on a stream of its own (one from
torch's pool), which waits for nothing of ours; it synchronises that stream on the host before returning and
makes the current stream wait on it. Memory freed on our stream while our queued kernels still read it (the
last batch's images, the resampling's temporaries, the plan's staged arrays) is at once reusable there, so
called on our stream, the library would overwrite it under those reads: silent wrong pixels, and
``record_stream(image, our stream)`` is a no-op on the stream that allocated it. So the call runs with a
stream of the decoder's own current (``outputs``), on which nothing but the library's allocations and its wait
happen: its allocator pool holds only earlier outputs, each recorded for our stream (freed only once our reads
of it ran); our stream waits on an event recorded there after the call (the library's writes, whatever its
version did); the stream is drawn distinct from every stream fastload holds or a loop uses (_ring.draw_stream:
torch's pool hands out aliases). tests/test_gpu_streams_sim.py shows the overwrite on the simulated GPU with a
library that does what torchvision does; tests/cuda/test_gpu_decode_lag.py on a GPU.

Augmentation. A plan with issue 21's augmentation (``plan.augment``: vertical flips, affine maps, pixel
operations) runs with the batched torch engine (``_augment/engine_torch.py``) on the rows, queued on the same
stream after the resampling (which applied the crops, sizes and horizontal flips) and before the ready event;
failed rows are zeroed after it. A padded RandomCrop window (``_augment/padding.py``) is resampled as its box at
its own size (``Padding.decode_hw``, unflipped) to the top left of its row, and assembled there by the engine
(``engine_torch.assemble_rows``) before the augmentation, as the native decoder does.

Failures. nvJPEG refuses a whole batch when one image is corrupt; the decoder then decodes the batch
one image at a time to find the bad ones (only for batches that hold one), reports each as
``(k, message)`` and zeroes it, as the native ``decode_batch`` does. A crop outside its image fails its
sample only.

Agreement, on the CPU with PIL decoding standing in for nvJPEG (tests/decoders/test_nvjpeg.py, 5 plan seeds over
tests/decoders/conftest.py's samples), mean absolute difference per sample: <= 0.21 gray levels against the native
decoder without DCT scaling (tolerance 1.0), <= 3.02 against the Batcher's DCT-scaled native decode
(tests/cuda uses 4.0, the DALI decoder's bound). On a GPU nvJPEG's IDCT may add its own small error.

Needs a CUDA build of torchvision, imported when the decoder is made. ``decode_fn`` replaces
torchvision's decoder (tests run the whole class on the CPU with PIL decoding).
"""

from __future__ import annotations

import io
import sys
import threading
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .._install import pil
from .._ring import streams_for
from ._base import BICUBIC_REASON, BICUBIC_RESIZE, DecoderContext, DecoderKind, JpegOnly, check_augment, warn_frames
from ._resample import MAX_PIXELS, resample
from ._staging import Uploads, augment_queued, decode_sizes

INSTALL_HINT = (
    "decoder='nvjpeg' needs torchvision built with CUDA (pip install torchvision); decoder='dali' "
    "or the default native decoder work without it"
)


def _import_torchvision() -> tuple[Any, Any]:
    """(ImageReadMode, decode_jpeg), or ImportError with the hint: a missing torchvision raises
    ModuleNotFoundError, one built for another torch RuntimeError (or anything) at import."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except ModuleNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ImportError(f"{INSTALL_HINT}; importing torchvision failed: {type(e).__name__}: {e}") from e
    return ImageReadMode, decode_jpeg


def _torchvision_decoder(device: torch.device) -> Callable[[list], list]:
    try:
        ImageReadMode, decode_jpeg = _import_torchvision()
    except ModuleNotFoundError as e:
        raise ImportError(INSTALL_HINT) from e

    def decode(datas: list) -> list:
        return decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)

    return decode


def _check_decodes(decode: Callable[[list], list], device: torch.device) -> None:
    """A torchvision built without nvJPEG imports fine and fails every GPU decode: find out now (called with the
    decoder's output stream current, as every call of the library: see the module docstring)."""
    try:
        decode([torch.frombuffer(bytearray(_tiny_jpeg()), dtype=torch.uint8)])
    except Exception as e:  # noqa: BLE001  (whatever torchvision raises: named in the error)
        raise ImportError(
            f"torchvision {getattr(sys.modules.get('torchvision'), '__version__', '')} cannot decode "
            f"JPEG on {device} ({type(e).__name__}: {e}); {INSTALL_HINT}"
        ) from e


def _tiny_jpeg() -> bytes:
    Image = pil("decoder='nvjpeg' (its probe JPEG)")  # torchvision depends on Pillow: there when nvJPEG is

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 40, 90)).save(buf, "JPEG")
    return buf.getvalue()


class NvjpegDecoder:
    def __init__(
        self,
        batch_size: int,
        out_hw: tuple[int, int],
        *,
        device: torch.device,
        decode_fn: Callable[[list], list] | None = None,
        streams: Any = None,
        max_pixels: int = MAX_PIXELS,
    ):
        dev = torch.device(device) if device is not None else None
        check = decode_fn is None
        if decode_fn is None:
            if dev is None or dev.type != "cuda":
                raise ValueError("decoder='nvjpeg' decodes on the GPU: pass device='cuda'")
            if dev.index is None:  # torch.device('cuda') != torch.device('cuda:0'): compare indexed devices
                dev = torch.device("cuda", torch.cuda.current_device())
            decode_fn = _torchvision_decoder(dev)
        self._decode = decode_fn
        self.batch_size, self.out_hw, self.device = batch_size, tuple(out_hw), dev
        self.max_pixels = max_pixels
        # the decoder's own stream, reached through the ring's backend (tests/sim_streams.py runs it late)
        self.streams = (
            streams
            if streams is not None
            else streams_for(dev if dev is not None else torch.device("cpu")).fork("nvjpeg")
        )
        # the stream current while the library runs: its outputs are allocated there (module docstring)
        self.outputs = self.streams.fork("nvjpeg outputs")
        self._uploads = Uploads(self.streams)
        self.ready = None
        self._lock = threading.Lock()
        if check:
            with self.outputs.side_context():
                _check_decodes(decode_fn, dev)

    def _check_out(self, out: torch.Tensor, n: int) -> None:
        expected = (n,) + self.out_hw + (3,)
        if tuple(out.shape) != expected or out.dtype != torch.uint8 or out.device != self.device:
            raise ValueError(
                f"out should be a uint8 {self.device} tensor of shape {expected}, got "
                f"{out.dtype} {out.device} {tuple(out.shape)}"
            )

    def _decode_each(self, datas: list, failures: dict) -> list:
        images = []
        for k, d in enumerate(datas):  # only for a batch nvJPEG refused: find the bad images
            try:
                images.append(self._decode([d])[0])
            except RuntimeError as e:
                failures[k] = f"nvjpeg could not decode the image: {e}"
                images.append(None)
        return images

    def fence(self, out: torch.Tensor) -> None:
        """``out`` was just allocated on the current stream (the loader's rows stream), whose queued kernels
        may still use its memory (rule 3 of fastload/_ring.py): this decoder's stream waits for them, once
        per buffer. Later batches wait only on the buffer's previous hand-over (``after``)."""
        s = self.streams
        s.wait(s.side, s.record(s.consumer()))
        s.record_stream(out, s.side)  # freed (the ring let go of it) only once our writes have run

    def after(self, event: Any) -> None:
        """Our next writes come after ``event`` (a row buffer's latest hand-over: a batch filled there and never
        read, whose fix-ups or copies may still be queued on other streams); a device-side wait."""
        self.streams.wait(self.streams.side, event)

    def decode(self, blobs: Sequence[Any], plan: Any, out: torch.Tensor) -> list[tuple[int, str]]:
        """Decode ``blobs[k]``, crop ``plan.crops[k]`` (top, left, height, width), resize to ``out_hw``, mirror
        where ``plan.flips[k]``, into ``out[k]`` (uint8 NHWC on this decoder's device); returns failures.
        ``blobs``: bytes-like objects, a list or an ``ImageSources`` (the interface of ``decoders/_base.py``);
        ``plan``: a ``fastload.transforms.Plan`` of as many samples.
        Queued on this decoder's stream when it returns: read ``out`` after waiting on ``ready_event()``."""
        n = len(blobs)
        check_augment(plan, n, "nvjpeg")
        if getattr(plan, "frames", None) is not None:  # its batched resampling takes whole-pixel boxes
            warn_frames("nvjpeg")
        self._check_out(out, n)
        if n == 0:
            return []
        crops = np.asarray(plan.crops, dtype=np.int64).reshape(n, 4)
        sizes, flips = decode_sizes(plan, self.out_hw)  # padded windows: their boxes, at their size, unflipped
        datas = [
            torch.frombuffer(bytearray(b), dtype=torch.uint8) if len(b) else torch.empty(0, dtype=torch.uint8)
            for b in blobs
        ]
        failures: dict[int, str] = {k: "empty image data" for k, d in enumerate(datas) if d.numel() == 0}
        s, lib = self.streams, self.outputs
        with self._lock, s.side_context():
            with lib.side_context():  # the library allocates its outputs on the current stream: this one
                try:
                    images = self._decode([d for d in datas]) if not failures else None
                except RuntimeError:
                    images = None
                if images is None:
                    images = self._decode_each(datas, failures)
            # our reads come after the library's writes (it made the output stream wait for its own stream), and
            # the outputs' memory is reused only after our reads of it ran (record_stream: another stream)
            s.wait(s.side, s.record(lib.side))
            for im in images:
                if im is not None:
                    s.record_stream(im, s.side)
            hw = np.array([[0, 0] if im is None else list(im.shape[1:]) for im in images], dtype=np.int64)
            top, left, h, w = crops.T
            outside = (top < 0) | (left < 0) | (h < 1) | (w < 1) | (top + h > hw[:, 0]) | (left + w > hw[:, 1])
            for k in np.flatnonzero(outside).tolist():
                if k not in failures:
                    failures[k] = (
                        f"crop (top, left, height, width)={tuple(crops[k].tolist())} lies outside the "
                        f"{hw[k, 0]}x{hw[k, 1]} image"
                    )
            good = [k for k in range(n) if k not in failures]
            bad = sorted(failures)
            # the plan's arrays reach the device through pinned staging: from pageable memory each copy
            # would make this thread wait for the stream's queued work
            crops_t, flips_t, good_t, bad_t, *sizes_t = self._uploads.put(
                crops[good], flips[good], good, bad, *([] if sizes is None else [sizes[good]])
            )
            sizes_t = sizes_t[0] if sizes_t else None
            if good:
                todo = [images[k] for k in good]

                def write(out=out, todo=todo, crops_t=crops_t, flips_t=flips_t, good_t=good_t, sizes_t=sizes_t):
                    if len(todo) == n:
                        resample(todo, crops_t, flips_t, self.out_hw, out, self.max_pixels, sizes_t)
                    else:
                        res = torch.empty((len(todo),) + self.out_hw + (3,), dtype=torch.uint8, device=out.device)
                        resample(todo, crops_t, flips_t, self.out_hw, res, self.max_pixels, sizes_t)
                        out.index_copy_(0, good_t, res)

                reads = (crops_t, flips_t, good_t, *todo) + (() if sizes_t is None else (sizes_t,))
                s.launch(write, reads=reads, writes=(out,), what="nvjpeg resample")
            augment_queued(s, self._uploads, plan.augment, out, "nvjpeg augment")
            if bad:  # after the augmentation, so that failed rows stay zero
                s.launch(
                    lambda out=out, bad_t=bad_t: out.index_fill_(0, bad_t, 0),
                    reads=(bad_t,),
                    writes=(out,),
                    what="nvjpeg zero failed",
                )
            del images
            # handed on with an event, not a host wait: whoever reads the rows waits on it on the device
            self.ready = s.record(s.side)
        return sorted(failures.items())

    def ready_event(self) -> Any:
        """The event after the latest ``decode``'s last write of its rows (on this decoder's stream)."""
        return self.ready

    def close(self) -> None:
        self.streams = self.outputs = None


def probe() -> None:
    """ModuleNotFoundError when torchvision is not installed; ImportError when it is but cannot be imported."""
    _import_torchvision()


def _make(ctx: DecoderContext) -> JpegOnly:
    return JpegOnly(
        NvjpegDecoder(ctx.batch_size, ctx.out_hw, device=ctx.device, streams=ctx.fork_stream("nvjpeg")), ctx.option
    )


KIND = DecoderKind(
    "nvjpeg",
    make=_make,
    probe=probe,
    gpu=True,
    needs_gpu=True,
    pairs=True,
    augments=True,
    refuses=((BICUBIC_RESIZE, BICUBIC_REASON),),
)
