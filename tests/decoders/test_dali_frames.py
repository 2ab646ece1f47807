"""decoder='dali' with a resize followed by a crop (``Plan.frames``), in DALI's CPU-only mode: it decodes the box the
resize reads and resamples the output's window of it as a region of interest (``fn.resize``'s fractional
``roi_start``/``roi_end``, read with the pixels around it, as PIL's whole resize reads them), so it agrees with
the native decoder's exact result as closely as DALI's resampling does elsewhere (measured: max 1 level, mean
0.14-0.19 per sample on tests/eval_exact_common.py's pictures), where the rounded source box is off by a sub-pixel
shift (mean 1.8-5.7 levels). Not yet run on a GPU (the mixed decoder takes the same graph)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from decoders.conftest import HAVE_DALI
from eval_exact_common import SIZES, fractional, picture
from fastload import transforms as T
from fastload._native import native
from fastload.decoders._base import ImageSources

pytestmark = pytest.mark.skipif(not HAVE_DALI, reason="needs NVIDIA DALI (pip install 'torch-fastload[dali]')")

MAX, MEAN = 2, 0.5  # DALI's float weights vs the native int16 ones, per sample


def jpegs() -> list[bytes]:
    out = []
    for k, (h, w) in enumerate(SIZES):
        buf = io.BytesIO()
        Image.fromarray(picture(h, w, k)).save(buf, format="JPEG", quality=92)
        out.append(buf.getvalue())
    return out


@pytest.mark.parametrize("size,crop", [(160, 129), (256, 224)])
def test_dali_resamples_the_window_of_the_whole_resize(size, crop):
    from fastload.decoders.dali import DaliDecoder

    blobs = jpegs()
    hs, ws = np.array([s[0] for s in SIZES]), np.array([s[1] for s in SIZES])
    p = T.ImagePipeline([T.Resize(size), T.CenterCrop(crop)]).plan(hs, ws, np.random.default_rng(0))
    assert p.frames is not None
    src = ImageSources.from_bytes(blobs, np.stack([hs, ws], axis=1))
    dec = DaliDecoder(len(blobs), (crop, crop))
    try:
        out = torch.zeros((len(blobs), crop, crop, 3), dtype=torch.uint8)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # DALI executes the frames: nothing to warn about
            assert dec.decode(src, p, out) == []
        rounded = torch.zeros_like(out)
        assert dec.decode(src, T.Plan(p.crops, p.flips, p.out_hw), rounded) == []  # what it ran before
    finally:
        dec.close()
    for k, b in enumerate(blobs):
        exact = native().decode_crop_resize(b, None, (crop, crop), False, False, 0, frame=p.frame_of(k)).astype(int)
        d = np.abs(out[k].numpy() - exact)
        assert d.max() <= MAX and d.mean() <= MEAN, (SIZES[k], d.max(), d.mean())
        if fractional(*SIZES[k], size, crop):  # the rounded box is visibly off: the bound above can fail
            assert np.abs(rounded[k].numpy() - exact).mean() > 2 * MEAN, SIZES[k]
