"""Image fields of a batch: which decoder runs the plans, and the call that fills the slot's rows.

Every decoder is one interface (``decoders/_base.py``): ``decode(sources, crops, flips, out)`` executes
the same plans (``transforms.ImagePipeline.plan``: a crop box and a flip per sample, from the batch's
RNG) into uint8 NHWC rows and reports failures per sample as ``(k, message)``. ``ImageDecoding.fill``
plans the batch, wraps its encoded images as ``ImageSources`` and makes that one call:

  native   ``decoders/native.py``: ``_C.decode_batch``, libjpeg-turbo (DCT-scaled, cropped) + resize +
           flip in native threads, GIL released, into the (pinned) host slot
  dali     NVIDIA DALI (decoders/dali.py), on the GPU with device='cuda', else its CPU-only mode
  nvjpeg   torchvision's nvJPEG + batched crop/resize/flip (decoders/nvjpeg.py), GPU only
  auto     with device='cuda' and a GPU decoder installed: ``decoders/hybrid.HybridDecoder``, native
           threads and the GPU decoder sharing each batch in the ratio of their measured rates; else native

GPU-side decoders write into a device buffer of the slot; the hybrid's CPU share is decoded into pinned
host rows of its own and copied into the same device buffer, on a side stream, before the batch is
handed on (the copy completes before ``fill`` returns, so the host rows may be refilled next batch).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import _ring
from ._ring import warn_once
from ._schema import Field
from .decoders._base import ImageSources
from .decoders.native import NativeDecoder
from .formats._layout import IMAGE_JPEG

DECODERS = ("native", "dali", "nvjpeg", "auto")


def _installed_gpu_decoder() -> tuple[str | None, list[str]]:
    """'dali' or 'nvjpeg' when its package imports and is usable (DALI first: it uses the GPU's hardware
    JPEG decoder). Any failure counts, not only ImportError: a torchvision built for another torch raises
    RuntimeError at import, a DALI below the floor is refused; each one that is installed but unusable is
    named in a warning, so decoder='auto' never silently loses a decoder the user installed."""
    broken = []
    for name, probe in (("dali", _probe_dali), ("nvjpeg", _probe_nvjpeg)):
        try:
            probe()
            return name, broken
        except ModuleNotFoundError:
            continue
        except Exception as e:  # noqa: BLE001  (whatever a broken install raises; named in the warning)
            broken.append(f"{name}: {type(e).__name__}: {e}")
    return None, broken


def _probe_dali() -> None:
    from .decoders.dali import _import_dali

    _import_dali(strict=True)


def _probe_nvjpeg() -> None:
    from .decoders.nvjpeg import _import_torchvision

    _import_torchvision()


class ImageDecoding:
    """Runs one loader's image plans with the decoder it asked for (see the module docstring)."""

    def __init__(self, decoder: str, device: torch.device | None, batch_size: int, num_threads: int):
        if decoder not in DECODERS:
            raise ValueError(f"decoder={decoder!r} should be one of {', '.join(map(repr, DECODERS))}")
        on_gpu = device is not None and device.type == "cuda"
        if decoder == "nvjpeg" and not on_gpu:
            raise ValueError("decoder='nvjpeg' decodes on the GPU: pass device='cuda' (or use decoder='native')")
        self.decoder = decoder
        self.gpu = decoder if decoder in ("dali", "nvjpeg") else None
        self.hybrid = None
        if decoder == "auto" and on_gpu:
            self.gpu, broken = _installed_gpu_decoder()
            if broken:
                warn_once("auto-broken", "fastload: decoder='auto' could not use an installed GPU decoder ("
                                         + "; ".join(broken) + "); images are decoded by CPU threads only")
            elif self.gpu is None:
                warn_once("auto-decoder", "fastload: decoder='auto' found no GPU JPEG decoder (pip install "
                                          "nvidia-dali-cuda130, or a CUDA torchvision for nvJPEG); images are "
                                          "decoded by CPU threads only")
            else:
                from .decoders.hybrid import HybridSplit

                self.hybrid = HybridSplit()
        # GPU decoders write straight into device buffers; DALI's CPU-only mode into the host slot
        self.device = device if self.gpu is not None and on_gpu else None
        self.batch_size = batch_size
        self.num_threads = num_threads
        self.native = NativeDecoder()
        self._streams = None
        self._decoders: dict[str, Any] = {}  # per image field, made on its first batch (GPU ones need its size)

    def bind_device(self) -> None:
        """Called at each iteration's start in the training thread: ``'cuda'`` becomes the device current
        there (a loader built before ``torch.cuda.set_device(local_rank)`` decodes on the rank's GPU; the
        producer thread's current device is not the training thread's)."""
        if self.device is not None and self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())

    @property
    def streams(self):
        """The streams backend of the device rows (``_ring.streams_for``), whose side stream is the rows'
        own: they are allocated and fixed up there, not on the training loop's stream, so a decoder never
        waits for the loop's queued work. Each GPU decoder forks a stream of its own from it."""
        if self._streams is None:
            self._streams = _ring.streams_for(self.device).fork("rows")
        return self._streams

    def buffers(self, name: str, shape: tuple, host_empty) -> dict[str, torch.Tensor]:
        """The slot buffers an image field needs: host rows, or device rows for the GPU decoders (allocated
        on the rows' stream; the decoder fences them on their first use)."""
        if self.device is None:
            return {name: host_empty(shape, torch.uint8)}
        with self.streams.side_context():
            return {name: self.streams.empty(shape, torch.uint8, False)}

    def move_rows(self, rows: torch.Tensor, dst: list[int], src: list[int]) -> None:
        """``rows[dst] = rows[src]`` on device rows (``on_error='skip'`` fix-ups), on a stream of our own,
        complete when this returns: on the producer thread's default stream it was unordered with the
        prefetcher's copy unless the training loop also ran on that stream."""
        s = self.streams
        with s.side_context():
            s.launch(lambda: rows.index_copy_(0, torch.as_tensor(dst, device=rows.device),
                                              rows.index_select(0, torch.as_tensor(src, device=rows.device))),
                     reads=(rows,), writes=(rows,), what="on_error fix-up")
            s.synchronize(s.side)

    def close(self) -> None:
        for dec in self._decoders.values():
            dec.close()
        self._decoders = {}
        if self.hybrid is not None:
            self.hybrid.close()

    # -- filling -------------------------------------------------------------------------------------
    def fill(self, pool, pipeline, f: Field, slot, reader, at, rng) -> list[tuple[int, str]]:
        """Decode the batch's images of field ``f`` (``at``: the batch located by ``reader``, a
        ``formats.reader.PackedReader``) into ``slot``. Returns the failures ``[(position, message)]``."""
        sources = ImageSources.of(reader, at, f.name)
        plan = pipeline.plan(sources.meta[:, 0], sources.meta[:, 1], rng)
        rows = (slot.arrays if self.device is None else slot.tensors)[f.name][:len(sources)]
        self.native.pool = pool  # the batcher's, which autotuning and persistent workers swap
        dec = self._decoders.get(f.name)
        if dec is None:
            dec = self._decoders[f.name] = self._decoder((int(rows.shape[1]), int(rows.shape[2])))
        if self.device is not None and f.name not in slot.fenced:
            with self.streams.side_context():  # the rows' first use: after their allocation stream's work
                dec.fence(slot.tensors[f.name])
            slot.fenced.add(f.name)
        return dec.decode(sources, plan.crops, plan.flips, rows)

    def _decoder(self, out_hw: tuple[int, int]) -> Any:
        """The decoder of an image field whose rows are ``out_hw``: native, a GPU decoder, or both."""
        if self.gpu is None:
            return self.native
        from .decoders.hybrid import HybridDecoder

        try:
            if self.gpu == "nvjpeg":
                from .decoders.nvjpeg import NvjpegDecoder

                gpu = NvjpegDecoder(self.batch_size, out_hw, device=self.device,
                                    streams=self.streams.fork("nvjpeg"))
            else:
                from .decoders.dali import DaliDecoder

                gpu = DaliDecoder(self.batch_size, out_hw, device_id=None if self.device is None else
                                  self.device.index, num_threads=max(1, self.num_threads), seed=0)
        except ImportError as e:
            if self.hybrid is None:  # decoder='nvjpeg'/'dali' asked for it: the error says what is missing
                raise
            # decoder='auto': the GPU decoder imported but cannot decode here (a torchvision without
            # nvJPEG); the rows are on the device already, so native threads decode everything into them
            warn_once("auto-unusable", f"fastload: decoder='auto' cannot use {self.gpu!r} ({e}); images are "
                                       f"decoded by CPU threads only")
            self.hybrid.cpu_only = True
            return HybridDecoder(self.native, None, self.hybrid, self.batch_size, self.streams.fork("hybrid copy"))
        gpu = JpegOnly(gpu, self.decoder)
        if self.hybrid is None:
            return gpu
        return HybridDecoder(self.native, gpu, self.hybrid, self.batch_size, self.streams.fork("hybrid copy"))


class JpegOnly:
    """A GPU decoder (or DALI's CPU-only mode) over ``ImageSources``: raw images fail with a hint."""

    def __init__(self, decoder: Any, option: str):
        self.decoder, self.option = decoder, option

    def decode(self, sources: ImageSources, crops: np.ndarray, flips: np.ndarray, out: Any) -> list[tuple[int, str]]:
        failures = self.decoder.decode(sources, crops, flips, out)
        raw = np.flatnonzero(sources.meta[:, 2] != IMAGE_JPEG)
        if not raw.size:
            return failures
        bad = {j for j, _ in failures}
        return sorted(failures + [(j, f"a raw (not JPEG) image: decoder={self.option!r} decodes JPEG only on the "
                                      f"GPU; use decoder='native'") for j in raw.tolist() if j not in bad])

    def fence(self, out: Any) -> None:
        self.decoder.fence(out)

    def close(self) -> None:
        self.decoder.close()

