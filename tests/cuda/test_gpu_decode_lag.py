"""decoder='nvjpeg' with its stream lagging (issue 28's D1 on a GPU): torchvision's ``decode_jpeg(device='cuda')``
allocates its outputs on the current stream and writes them at once on a stream of its own. Called with the
decoder's working stream current, the second of two batches decoded back to back took the memory of the first
one's images while the first one's resampling was still queued behind the lag, and the first batch came out with
the second one's pixels. Two batches, decoded back to back behind ``torch.cuda._sleep`` on the decoder's stream,
must equal the same batches decoded one at a time on an idle GPU. tests/test_gpu_streams_sim.py shows the same on
the simulated GPU. Skipped without CUDA and torchvision."""

from __future__ import annotations

import numpy as np
import torch

from fastload.decoders.nvjpeg import NvjpegDecoder
from fastload.transforms import Plan

from gpu_common import NEEDS_CUDA_AND_TORCHVISION, lag
from conftest import jpeg_bytes  # noqa: E402 (gpu_common puts tests/ on sys.path)

pytestmark = NEEDS_CUDA_AND_TORCHVISION
DECODER = "nvjpeg"  # for gpu_verdicts: this test proves decoder="nvjpeg"

N = 4
H, W = 480, 640  # one size: the second batch's images fit exactly in the first one's freed blocks
OUT_HW = (96, 128)
LAG_MS = 300  # far longer than decoding a batch of four on the host takes


def batches() -> list[tuple[list[bytes], Plan]]:
    """Two batches of different pictures, each cropped whole and resized (a plan written by hand)."""
    out = []
    for b in range(2):
        blobs = [jpeg_bytes(H, W, seed=10 * b + k) for k in range(N)]
        crops = np.tile(np.array([0, 0, H, W], np.int32), (N, 1))
        out.append((blobs, Plan(crops, np.zeros(N, np.uint8), np.tile(np.array(OUT_HW, np.int32), (N, 1)))))
    return out


def decode(lagged: bool) -> list[torch.Tensor]:
    """Both batches through one decoder; ``lagged``: its stream sleeps first and the second batch is decoded right
    after the first, while the first one's work is still queued."""
    dev = torch.device("cuda", torch.cuda.current_device())
    dec = NvjpegDecoder(N, OUT_HW, device=dev)
    outs = []
    if lagged:
        with torch.cuda.stream(dec.streams.side):
            lag(LAG_MS)
    for blobs, plan in batches():
        out = torch.empty((N, *OUT_HW, 3), dtype=torch.uint8, device=dev)
        dec.fence(out)  # as _fill/images.py does with a new row buffer
        assert dec.decode(blobs, plan, out) == []
        outs.append(out)
        if not lagged:
            torch.cuda.synchronize()
    if lagged:  # the second batch was decoded while the lag still held the first one's work back
        assert not dec.ready_event().query(), f"decoding took longer than the {LAG_MS} ms lag"
    torch.cuda.synchronize()
    result = [o.cpu() for o in outs]
    dec.close()
    return result


def test_two_batches_decoded_back_to_back_behind_a_lagging_stream_keep_their_pixels():
    ref = decode(lagged=False)
    assert (ref[0].float() - ref[1].float()).abs().mean() > 10  # the batches differ: a mix-up would show
    got = decode(lagged=True)
    for k, (r, g) in enumerate(zip(ref, got)):
        diff = (r.float() - g.float()).abs().mean(dim=(1, 2, 3))
        assert diff.max() < 0.5, f"batch {k}: mean absolute difference per sample {diff.tolist()}"
