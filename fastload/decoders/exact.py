"""``decoder="exact"``: the native decoder on CPU threads, every JPEG decoded at full size: PIL's pixels.

``decoder="native"`` (the default) decodes a JPEG that the plan shrinks 2x or more at 1/2, 1/4 or 1/8 of its size
(libjpeg-turbo's DCT scaling, ``choose_dct_denom`` in csrc/batch.cc): a quarter of the pixels or fewer to decode, but
pixels that differ from a full-size decode then resize (torchvision's and timm's: ``PIL.Image.open``, then
``Resize``) by up to tens of levels at edges. This kind is the same decoder with DCT scaling off
(``NativeDecoder(dct_scaling=False)``): everything else, crop boxes, ``Plan.frames``, the resize, the augmentation, is
the native decoder's, so an evaluation recipe (``Resize(short side)``, ``CenterCrop``) gives torchvision's pixels bit
for bit with Pillow-SIMD (tests/test_eval_exact_decoder.py). It runs wherever ``'native'`` runs on fastload's fast
path, ``device='cuda'`` included (decoded on the host, copied to the device as ``'native'``'s rows are). ``ds[i]`` and
``ds.__getitems__`` (torch's own loader, which refuses ``decoder='exact'``: ``_front/plan.py``) decode as ``'native'``.
"""

from __future__ import annotations

from ._base import DecoderContext, DecoderKind
from .native import NativeDecoder


def _make(ctx: DecoderContext) -> NativeDecoder:
    # the loader's own native decoder (the batcher hands it its pool before each batch), set to full size: each loader
    # has one (``ImageDecoding.native``) and all its image fields one kind, so no loader of another kind sees this
    ctx.native.dct_scaling = False
    return ctx.native


KIND = DecoderKind("exact", make=_make, augments=True)
