"""``decoder="nvjpeg"``: torchvision's batched GPU JPEG decoder, a lighter option than DALI.

``torchvision.io.decode_jpeg(list, device="cuda")`` decodes the batch with nvJPEG; each image is then
cropped to fastload's planned box, resized with antialiased bilinear interpolation
(``F.interpolate(..., antialias=True)``, the same triangle filter as PIL and the native core), flipped,
rounded to uint8 and written into the caller's CUDA buffer. Needs a CUDA build of torchvision; it is
imported only when the decoder is made.

Status: written against torchvision's documented API; it has not yet run on a GPU (tests in
tests/cuda/test_nvjpeg.py skip without CUDA and torchvision).
"""

from __future__ import annotations

import threading

import numpy as np
import torch


class NvjpegDecoder:
    def __init__(self, batch_size: int, out_hw: tuple[int, int], *, device: torch.device):
        try:
            import torchvision
            from torchvision.io import ImageReadMode, decode_jpeg
        except ImportError as e:
            raise ImportError("decoder='nvjpeg' needs torchvision built with CUDA (pip install torchvision); "
                              "decoder='dali' or the default native decoder work without it") from e
        del torchvision
        if device is None or torch.device(device).type != "cuda":
            raise ValueError("decoder='nvjpeg' decodes on the GPU: pass device='cuda'")
        self._decode, self._mode = decode_jpeg, ImageReadMode.RGB
        self.batch_size, self.out_hw, self.device = batch_size, tuple(out_hw), torch.device(device)
        self._lock = threading.Lock()

    def _one(self, data: torch.Tensor, crop, flip: bool) -> torch.Tensor:
        img = self._decode(data, mode=self._mode, device=self.device)
        return self._finish(img, crop, flip)

    def _finish(self, img: torch.Tensor, crop, flip: bool) -> torch.Tensor:
        top, left, h, w = (int(v) for v in crop)
        if top < 0 or left < 0 or top + h > img.shape[1] or left + w > img.shape[2] or h < 1 or w < 1:
            raise ValueError(f"crop {crop.tolist()} lies outside the {img.shape[1]}x{img.shape[2]} image")
        x = img[:, top:top + h, left:left + w][None].float()
        x = torch.nn.functional.interpolate(x, size=self.out_hw, mode="bilinear", antialias=True, align_corners=False)
        if flip:
            x = x.flip(-1)
        return x[0].round_().clamp_(0, 255).to(torch.uint8).permute(1, 2, 0)

    def decode(self, blobs: list, crops: np.ndarray, flips: np.ndarray, out: torch.Tensor) -> list[tuple[int, str]]:
        n = len(blobs)
        if out.shape != (n,) + self.out_hw + (3,) or out.dtype != torch.uint8 or out.device != self.device:
            raise ValueError(f"out should be a uint8 {self.device} tensor of shape {(n,) + self.out_hw + (3,)}, got "
                             f"{out.dtype} {out.device} {tuple(out.shape)}")
        datas = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
        failures = []
        with self._lock:
            try:
                images = self._decode(datas, mode=self._mode, device=self.device)
            except RuntimeError:
                images = None  # find the bad samples one by one
            for k in range(n):
                try:
                    res = self._finish(images[k], crops[k], bool(flips[k])) if images is not None else \
                        self._one(datas[k], crops[k], bool(flips[k]))
                    out[k].copy_(res)
                except (RuntimeError, ValueError) as e:
                    out[k].zero_()
                    failures.append((k, f"nvjpeg: {e}"))
        return failures

    def close(self) -> None:
        pass
