"""fastload/_fill/images.py: the decoder is picked by name from the registry (tests/decoders/test_registry.py), and
``fill`` makes one ``decode(sources, plan, rows)`` call per image field and batch."""

from __future__ import annotations

import pytest
import torch

import fastload
from fastload import decoders
from fastload import transforms as T
from fastload._fill.images import ImageDecoding
from fastload.decoders._base import DecoderKind, geometry_only
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


def _register_crop_only(monkeypatch, name: str, made: list) -> DecoderKind:
    """A decoder kind that, like the GPU decoders, executes crop/resize/flip only (``augments`` False)."""
    import sys
    import types

    class CropOnly:  # refuses what it cannot run, as the GPU decoders do (decoders/_base.geometry_only)
        def __init__(self, ctx):
            made.append(ctx.option)
            self.native = ctx.native

        def decode(self, sources, plan, out):
            geometry_only(plan, sources.n, name)
            return self.native.decode(sources, plan, out)

        def close(self):
            pass

    def make(ctx):
        return CropOnly(ctx)

    module = types.ModuleType(f"fastload.decoders.{name}")
    module.KIND = DecoderKind(name, make=make)
    monkeypatch.setitem(sys.modules, f"fastload.decoders.{name}", module)
    monkeypatch.setitem(decoders.REGISTRY, name, f".{name}")
    return module.KIND


def test_a_decoder_that_cannot_augment_is_refused_when_the_loader_is_made(small_images, monkeypatch):
    """Asked for by name, a crop/resize/flip-only decoder (nvjpeg, DALI) is refused at construction, naming what
    it cannot run, instead of raising NotImplementedError at the first batch of a training run."""
    made: list = []
    _register_crop_only(monkeypatch, "croponly", made)
    ds = fastload.open(small_images, transforms={"image": [T.RandomResizedCrop(16), T.TrivialAugmentWide(),
                                                           T.RandomErasing(0.5)]})
    with pytest.raises(ValueError, match=r"decoder='croponly' executes crop, resize and horizontal flip only, and "
                                         r"the image pipeline also has TrivialAugmentWide, RandomErasing"):
        fastload.DataLoader(ds, batch_size=4, decoder="croponly")
    padded = fastload.open(small_images, transforms={"image": [T.RandomCrop(16, padding=4)]})
    with pytest.raises(ValueError, match="RandomCrop with padding"):
        fastload.DataLoader(padded, batch_size=4, decoder="croponly")
    plain = fastload.open(small_images, transforms={"image": [T.RandomResizedCrop(16)]})
    assert len(list(fastload.DataLoader(plain, batch_size=4, decoder="croponly"))) == 3 and made  # geometry: fine


def test_auto_falls_back_to_native_threads_for_augmented_pipelines_and_says_so(small_images, monkeypatch):
    """'auto' whose choice could not run the augmentation (a GPU decoder, alone or in the hybrid) decodes with
    native threads only, with one warning naming why, and gives the native decoder's batches."""
    made: list = []
    croponly = _register_crop_only(monkeypatch, "croponly", made)  # what 'auto' chooses with a GPU (stand-in)
    import sys
    import types
    module = types.ModuleType("fastload.decoders.autotest")
    module.KIND = DecoderKind("autotest", make=lambda ctx: None, choose=lambda on_gpu: croponly)
    monkeypatch.setitem(sys.modules, "fastload.decoders.autotest", module)
    monkeypatch.setitem(decoders.REGISTRY, "autotest", ".autotest")
    ds = fastload.open(small_images, transforms={"image": [T.RandomResizedCrop(16), T.TrivialAugmentWide()]})
    ref = [x.clone() for x, _ in fastload.DataLoader(ds, batch_size=4, seed=1, shuffle=True)]
    with pytest.warns(RuntimeWarning, match=r"decoder='autotest' decodes with native threads only \(not 'croponly'\)"
                                            r".*TrivialAugmentWide"):
        loader = fastload.DataLoader(ds, batch_size=4, seed=1, shuffle=True, decoder="autotest")
    got = [x.clone() for x, _ in loader]
    assert not made and len(got) == len(ref) == 3 and all(torch.equal(a, b) for a, b in zip(ref, got))
