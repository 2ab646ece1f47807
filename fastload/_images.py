"""Image fields of a batch: which decoder runs the plans, and the call that fills the slot's rows.

Every decoder executes the same plans (``transforms.ImagePipeline.plan``: a crop box and a flip per
sample, from the batch's RNG) into uint8 NHWC rows, and reports failures per sample as ``(k, message)``:

  native   ``_C.decode_batch``: libjpeg-turbo (DCT-scaled, cropped) + resize + flip in native threads,
           GIL released, into the (pinned) host slot
  dali     NVIDIA DALI (decoders/dali.py), on the GPU with device='cuda', else its CPU-only mode
  nvjpeg   torchvision's nvJPEG + batched crop/resize/flip (decoders/nvjpeg.py), GPU only
  auto     with device='cuda' and a GPU decoder installed: native threads and the GPU decoder share
           each batch in the ratio of their measured rates (decoders/hybrid.py); otherwise native

GPU-side decoders write into a device buffer of the slot; the hybrid's CPU share is decoded into pinned
host rows and copied into the same device buffer, on the GPU decoder's stream, before the batch is
handed on (the copy completes before ``fill`` returns, so the host rows may be refilled next batch).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._native import native
from ._ring import warn_once
from ._schema import Field
from .formats._layout import IMAGE_JPEG

DECODERS = ("native", "dali", "nvjpeg", "auto")


def _installed_gpu_decoder() -> str | None:
    """'dali' or 'nvjpeg' when its package imports (DALI first: it uses the GPU's hardware JPEG decoder)."""
    try:
        import nvidia.dali  # noqa: F401

        return "dali"
    except ImportError:
        pass
    try:
        import torchvision.io  # noqa: F401

        return "nvjpeg"
    except ImportError:
        return None


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
            self.gpu = _installed_gpu_decoder()
            if self.gpu is None:
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
        self._gpu_decoders: dict[str, Any] = {}
        self._copy_stream = None

    def buffers(self, name: str, shape: tuple, host_empty) -> dict[str, torch.Tensor]:
        """The slot buffers an image field needs: host rows, device rows, or both for the hybrid."""
        if self.device is None:
            return {name: host_empty(shape, torch.uint8)}
        out = {name: torch.empty(shape, dtype=torch.uint8, device=self.device)}
        if self.hybrid is not None:
            out[name + ":host"] = host_empty(shape, torch.uint8)  # the CPU share, copied in by fill()
        return out

    def close(self) -> None:
        for dec in self._gpu_decoders.values():
            dec.close()
        self._gpu_decoders = {}
        if self.hybrid is not None:
            self.hybrid.close()

    # -- filling -------------------------------------------------------------------------------------
    def fill(self, pool, pipeline, f: Field, slot, reader, at, rng) -> list[tuple[int, str]]:
        """Decode the batch's images of field ``f`` (``at``: the batch located by ``reader``, a
        ``formats.reader.PackedReader``) into ``slot``. Returns the failures ``[(position, message)]``."""
        n = len(at)
        meta = reader.take(at, f.name, "meta").astype(np.int64)
        plan = pipeline.plan(meta[:, 0], meta[:, 1], rng)
        out = slot.tensors[f.name][:n]
        if self.gpu is None:
            return self._native(pool, meta, reader.blob_sources(at, f.name), plan, slot.arrays[f.name], 0, n)
        if self.hybrid is None:
            return self._on_gpu(f, reader, at, meta, plan, out, 0, n)
        host = slot.tensors[f.name + ":host"]

        sources = reader.blob_sources(at, f.name)

        def cpu(k: int) -> list:
            fails = self._native(pool, meta, sources, plan, slot.arrays[f.name + ":host"], 0, k)
            self._upload(out[:k], host[:k])
            return fails

        return self.hybrid.run(n, cpu, lambda k: self._on_gpu(f, reader, at, meta, plan, out[k:n], k, n))

    @staticmethod
    def _native(pool, meta, sources, plan, out: np.ndarray, lo: int, hi: int) -> list:
        regions, region, offset, length = sources
        sl = slice(lo, hi)
        return native().decode_batch(
            pool, regions, region[sl], offset[sl], length[sl], meta[sl, 2].astype(np.uint8),
            np.ascontiguousarray(meta[sl, :2], dtype=np.int32), np.ascontiguousarray(plan.crops[sl], dtype=np.int32),
            np.ascontiguousarray(plan.flips[sl], dtype=np.uint8), out[:hi - lo])

    def _upload(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """The hybrid's CPU rows (pinned) into the device batch; complete when this returns, so the host
        rows may be refilled by the next batch (ring rule 2) and the prefetcher reads finished rows."""
        if dst.device.type != "cuda":
            dst.copy_(src)
            return
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(device=dst.device)
        s = self._copy_stream
        s.wait_stream(torch.cuda.current_stream(dst.device))  # ring rule 3: after dst's allocation stream
        with torch.cuda.stream(s):
            dst.copy_(src, non_blocking=True)
        s.synchronize()  # the producer thread waits, never the training loop

    def _decoder(self, f: Field, out_hw: tuple[int, int]):
        dec = self._gpu_decoders.get(f.name)
        if dec is None:
            if self.gpu == "nvjpeg":
                from .decoders.nvjpeg import NvjpegDecoder

                dec = NvjpegDecoder(self.batch_size, out_hw, device=self.device)
            else:
                from .decoders.dali import DaliDecoder

                dec = DaliDecoder(self.batch_size, out_hw, device_id=None if self.device is None else
                                  (self.device.index or 0), num_threads=max(1, self.num_threads), seed=0)
            self._gpu_decoders[f.name] = dec
        return dec

    def _on_gpu(self, f: Field, reader, at, meta: np.ndarray, plan, out, lo: int, hi: int) -> list:
        """Samples ``[lo, hi)`` by the GPU decoder (or DALI's CPU-only mode) into ``out`` (their rows);
        failures are relative to ``lo``. JPEG only: raw images fail with a hint."""
        blobs = [reader.blob(at, f.name, p) for p in range(lo, hi)]
        dec = self._decoder(f, (int(out.shape[1]), int(out.shape[2])))  # out: (n, H, W, 3) rows
        failures = dec.decode(blobs, plan.crops[lo:hi], plan.flips[lo:hi], out)
        bad = {j for j, _ in failures}
        raw = [(j, f"a raw (not JPEG) image: decoder={self.decoder!r} decodes JPEG only on the GPU; use "
                   f"decoder='native'") for j in range(hi - lo) if meta[lo + j, 2] != IMAGE_JPEG and j not in bad]
        return sorted(failures + raw)
