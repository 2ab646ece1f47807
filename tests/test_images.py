"""fastload/_images.py: the decoder is picked by name from the registry (tests/decoders/test_registry.py), and
``fill`` makes one ``decode(sources, plan, rows)`` call per image field and batch."""

from __future__ import annotations

import pytest
import torch

import fastload
from fastload import decoders
from fastload import transforms as T
from fastload._images import ImageDecoding
from fastload.decoders._base import DecoderKind
from fastload.decoders.native import NativeDecoder


def test_fill_makes_one_decode_call_per_image_field(small_images):
    ds = fastload.open(small_images, transforms={"image": [T.RandomResizedCrop(16), T.RandomHorizontalFlip()]})
    ref = [x.clone() for x, _ in fastload.DataLoader(ds, batch_size=5, seed=2)]
    calls = []

    class Recording(NativeDecoder):
        def decode(self, sources, plan, out):
            calls.append((len(sources), plan.crops.shape, plan.flips.shape, plan.out_hw.tolist()[:1], out.shape))
            return super().decode(sources, plan, out)

    loader = fastload.DataLoader(ds, batch_size=5, seed=2)
    images = ImageDecoding("native", None, 5, 0)
    images._decoders["image"] = Recording()
    loader._batcher.images = images
    got = [x.clone() for x, _ in loader]
    assert all(torch.equal(a, b) for a, b in zip(ref, got)) and len(got) == len(ref) == 3
    assert calls == [(5, (5, 4), (5,), [[16, 16]], (5, 16, 16, 3))] * 2 + [(2, (2, 4), (2,), [[16, 16]], (2, 16, 16, 3))]


def test_a_registered_decoder_is_made_through_its_kind(small_images, monkeypatch):
    """A new decoder is a module with a KIND plus one registry line: the loader makes it per image field from
    a context (sizes, device, threads, the native decoder) and calls it as any other."""
    import sys
    import types

    made = []

    class Mirror:
        """Native decoding, then every row mirrored: visibly not the native decoder."""

        def __init__(self, ctx):
            made.append((ctx.option, ctx.batch_size, ctx.out_hw, ctx.device))
            self.native = ctx.native

        def decode(self, sources, plan, out):
            fails = self.native.decode(sources, plan, out)
            out[:] = out.flip(2) if isinstance(out, torch.Tensor) else out[:, :, ::-1].copy()
            return fails

        def close(self):
            pass

    module = types.ModuleType("fastload.decoders.mirror")
    module.KIND = DecoderKind("mirror", make=Mirror)
    monkeypatch.setitem(sys.modules, "fastload.decoders.mirror", module)
    monkeypatch.setitem(decoders.REGISTRY, "mirror", ".mirror")
    ds = fastload.open(small_images, transforms={"image": [T.Resize((16, 16))]})
    ref = [x.clone() for x, _ in fastload.DataLoader(ds, batch_size=4)]
    got = [x.clone() for x, _ in fastload.DataLoader(ds, batch_size=4, decoder="mirror")]
    assert made == [("mirror", 4, (16, 16), None)]
    assert len(got) == len(ref) == 3 and all(torch.equal(a.flip(3), b) for a, b in zip(ref, got))


def test_a_gpu_only_decoder_without_a_gpu_is_refused():
    with pytest.raises(ValueError, match="decoder='nvjpeg' decodes on the GPU: pass device='cuda'"):
        ImageDecoding("nvjpeg", None, 4, 0)
