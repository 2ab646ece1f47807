"""``decoder="nvjpeg"``: torchvision's batched GPU JPEG decoder executing fastload's plans.

Per batch: ``torchvision.io.decode_jpeg(list, device="cuda")`` decodes every image with nvJPEG in one
call; the images are padded into one tensor and cropped, resized (PIL's antialiased triangle filter,
as the native core) and flipped as batched matrix products (``_resample.py``), then written into the
caller's CUDA buffer: no per-sample Python over the batch on the GPU side.

Streams. The work runs on the decoder's own stream, which first waits on the caller's current stream
(the output buffer was allocated there and its memory may still be used by kernels queued on it: rule 3
of fastload/_ring.py) and is synchronised before :meth:`NvjpegDecoder.decode` returns, so the batch is
complete for whoever copies it next. ``decode`` runs in the loader's producer thread, never the loop's.

Failures. nvJPEG refuses a whole batch when one image is corrupt; the decoder then decodes the batch
one image at a time to find the bad ones (only for batches that hold one), reports each as
``(k, message)`` and zeroes it, as the native ``decode_batch`` does. A crop outside its image fails its
sample only.

Agreement, on the CPU with PIL decoding standing in for nvJPEG (tests/test_nvjpeg_cpu.py, 5 plan seeds over
test_dali.py's samples), mean absolute difference per sample: <= 0.21 gray levels against the native
decoder without DCT scaling (tolerance 1.0), <= 3.02 against the Batcher's DCT-scaled native decode
(tests/cuda uses 4.0, the DALI decoder's bound). On a GPU nvJPEG's IDCT may add its own small error.

Needs a CUDA build of torchvision, imported when the decoder is made. ``decode_fn`` replaces
torchvision's decoder (tests run the whole class on the CPU with PIL decoding).
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ._resample import crop_resize_flip

INSTALL_HINT = ("decoder='nvjpeg' needs torchvision built with CUDA (pip install torchvision); decoder='dali' "
                "or the default native decoder work without it")


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


class NvjpegDecoder:
    def __init__(self, batch_size: int, out_hw: tuple[int, int], *, device: torch.device,
                 decode_fn: Callable[[list], list] | None = None):
        dev = torch.device(device) if device is not None else None
        if decode_fn is None:
            if dev is None or dev.type != "cuda":
                raise ValueError("decoder='nvjpeg' decodes on the GPU: pass device='cuda'")
            if dev.index is None:  # torch.device('cuda') != torch.device('cuda:0'): compare indexed devices
                dev = torch.device("cuda", torch.cuda.current_device())
            decode_fn = _torchvision_decoder(dev)
        self._decode = decode_fn
        self.batch_size, self.out_hw, self.device = batch_size, tuple(out_hw), dev
        self._stream = torch.cuda.Stream(device=dev) if dev is not None and dev.type == "cuda" else None
        self._lock = threading.Lock()

    def _check_out(self, out: torch.Tensor, n: int) -> None:
        expected = (n,) + self.out_hw + (3,)
        if tuple(out.shape) != expected or out.dtype != torch.uint8 or out.device != self.device:
            raise ValueError(f"out should be a uint8 {self.device} tensor of shape {expected}, got "
                             f"{out.dtype} {out.device} {tuple(out.shape)}")

    def _decode_each(self, datas: list, failures: dict) -> list:
        images = []
        for k, d in enumerate(datas):  # only for a batch nvJPEG refused: find the bad images
            try:
                images.append(self._decode([d])[0])
            except RuntimeError as e:
                failures[k] = f"nvjpeg could not decode the image: {e}"
                images.append(None)
        return images

    def decode(self, blobs: Sequence[Any], crops: np.ndarray, flips: np.ndarray, out: torch.Tensor) -> list[tuple[int, str]]:
        """Decode ``blobs[k]``, crop ``crops[k]`` (top, left, height, width), resize to ``out_hw``, mirror
        where ``flips[k]``, into ``out[k]`` (uint8 NHWC on this decoder's device); returns failures.
        ``blobs``: bytes-like objects, a list or an ``ImageSources`` (the interface of ``decoders/_base.py``)."""
        n = len(blobs)
        self._check_out(out, n)
        if n == 0:
            return []
        crops = np.asarray(crops, dtype=np.int64).reshape(n, 4)
        datas = [torch.frombuffer(bytearray(b), dtype=torch.uint8) if len(b) else torch.empty(0, dtype=torch.uint8)
                 for b in blobs]
        failures: dict[int, str] = {k: "empty image data" for k, d in enumerate(datas) if d.numel() == 0}
        with self._lock, (torch.cuda.stream(self._stream) if self._stream is not None else _null()):
            if self._stream is not None:
                self._stream.wait_stream(torch.cuda.current_stream(self.device))  # rule 3: after out's allocation
            try:
                images = self._decode([d for d in datas]) if not failures else None
            except RuntimeError:
                images = None
            if images is None:
                images = self._decode_each(datas, failures)
            hw = np.array([[0, 0] if im is None else list(im.shape[1:]) for im in images], dtype=np.int64)
            top, left, h, w = crops.T
            outside = (top < 0) | (left < 0) | (h < 1) | (w < 1) | (top + h > hw[:, 0]) | (left + w > hw[:, 1])
            for k in np.flatnonzero(outside).tolist():
                if k not in failures:
                    failures[k] = (f"crop (top, left, height, width)={tuple(crops[k].tolist())} lies outside the "
                                   f"{hw[k, 0]}x{hw[k, 1]} image")
            good = [k for k in range(n) if k not in failures]
            if good:
                with warnings.catch_warnings():  # strided nested tensors are 'prototype'; padding is all we use
                    warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")
                    padded = torch.nested.as_nested_tensor([images[k] for k in good]).to_padded_tensor(0)
                idx = torch.as_tensor(good, dtype=torch.int64)
                res = torch.empty((len(good),) + self.out_hw + (3,), dtype=torch.uint8, device=out.device)
                crop_resize_flip(padded, torch.from_numpy(crops[good]), torch.from_numpy(np.asarray(flips)[good]),
                                 self.out_hw, res)
                if len(good) == n:
                    out.copy_(res)
                else:
                    out.index_copy_(0, idx.to(out.device), res)
            if failures:
                out[torch.as_tensor(sorted(failures), dtype=torch.int64, device=out.device)] = 0
            if self._stream is not None:
                self._stream.synchronize()  # complete before the prefetcher's stream copies it (producer thread)
        return sorted(failures.items())

    def close(self) -> None:
        self._stream = None


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
