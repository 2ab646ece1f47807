"""decoder='auto' with a GPU: CPU threads and the GPU decoder share each batch (fastload/decoders/hybrid.py).

Without a GPU the GPU half is the nvjpeg decoder with PIL standing in for nvJPEG (tests/decoders/conftest.py),
writing into CPU "device" rows: the split, the concurrency, the rate tracking and the assembly of one
batch from two decoders are the same code that runs on a GPU."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch

import fastload
from fastload import transforms as T
from fastload._fill.images import ImageDecoding
from fastload import _C
from fastload.decoders._base import ImageSources
from fastload.decoders.hybrid import HybridDecoder, HybridSplit
from fastload.decoders.native import NativeDecoder
from fastload.decoders.nvjpeg import NvjpegDecoder
from conftest import packed_image_folder
from decoders.conftest import OUT_HW, SAMPLES, mad, pil_decode, plan, sizes


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return packed_image_folder(tmp_path_factory.mktemp("hybrid"), classes=3, per_class=16)


def hybrid_loader(ds, **kw):
    loader = fastload.DataLoader(ds, **kw)
    images = ImageDecoding("native", None, kw["batch_size"], kw.get("num_workers", 0))
    images.hybrid, images.device = HybridSplit(), torch.device("cpu")  # rows: slot.tensors
    out_hw = ds.pipelines["image"].output_size
    gpu = NvjpegDecoder(kw["batch_size"], out_hw, device="cpu", decode_fn=pil_decode)
    images._decoders["image"] = HybridDecoder(images.native, gpu, images.hybrid, kw["batch_size"])
    loader._batcher.images = images
    return loader, images.hybrid


@pytest.mark.parametrize("num_workers", [0, 2])
def test_hybrid_batches_match_the_native_decoders(photos, num_workers):
    ds = fastload.open(photos, transforms={"image": [T.RandomResizedCrop(32), T.RandomHorizontalFlip()]})
    kw = dict(batch_size=8, shuffle=True, seed=4, num_workers=num_workers)
    ref = [(x.clone(), y.clone()) for x, y in fastload.DataLoader(ds, **kw)]
    loader, split = hybrid_loader(ds, **kw)
    got = [(x.clone(), y.clone()) for x, y in loader]
    assert len(got) == len(ref) == 6
    for (rx, ry), (gx, gy) in zip(ref, got):
        assert torch.equal(ry, gy)
        a, b = rx.permute(0, 2, 3, 1).numpy(), gx.permute(0, 2, 3, 1).numpy()
        assert mad(a, b).max() < 4.0  # the nvjpeg decoder's bound vs the DCT-scaled native path
    assert 0.0 < split.cpu_share < 1.0 and split.cpu_rate and split.gpu_rate


def test_the_hybrid_of_two_native_decoders_is_the_native_decoder():
    blobs = list(SAMPLES)
    blobs[1], blobs[9] = b"", b"\xff\xd8\xff" + bytes(50)
    p = plan(SAMPLES, 4)
    ref = np.full((len(blobs), *OUT_HW, 3), 77, np.uint8)

    def sources():
        return ImageSources.from_bytes(blobs, sizes(SAMPLES))

    expected = NativeDecoder().decode(sources(), p, ref)
    assert [k for k, _ in expected] == [1, 9]
    split = HybridSplit(cpu_share=0.5)
    hybrid = HybridDecoder(NativeDecoder(), NativeDecoder(_C.Pool(2)), split, len(blobs))
    for _ in range(3):  # the cut moves with the measured rates; the pixels and failures do not
        out = torch.full((len(blobs), *OUT_HW, 3), 77, dtype=torch.uint8)
        assert hybrid.decode(sources(), p, out) == expected
        assert np.array_equal(out.numpy(), ref)
    assert split.cpu_rate and split.gpu_rate
    hybrid.close()
    split.close()


def test_split_follows_the_measured_rates():
    split = HybridSplit(smoothing=0.5)
    per_cpu, per_gpu = 0.002, 0.0005  # seconds per sample: the GPU side is 4x faster

    def cpu(k):
        time.sleep(k * per_cpu)
        return []

    def gpu(k):
        time.sleep((64 - k) * per_gpu)
        return []

    shares = []
    for _ in range(8):
        split.run(64, cpu, gpu)
        shares.append(split.cpu_share)
    assert 0.1 < shares[-1] < 0.32, shares  # 1/(1+4) = 0.2 balances the two halves
    k = split.split(64)
    assert abs(k * per_cpu - (64 - k) * per_gpu) < 0.03  # both halves now take about as long


def test_failures_of_both_halves_keep_their_batch_positions():
    split = HybridSplit(cpu_share=0.25)
    fails = split.run(8, lambda k: [(1, "cpu bad")], lambda k: [(0, "gpu bad"), (3, "gpu bad too")])
    assert fails == [(1, "cpu bad"), (2, "gpu bad"), (5, "gpu bad too")]


def test_a_gpu_half_that_raises_still_joins_the_cpu_half():
    split = HybridSplit()
    done = []

    def cpu(k):
        time.sleep(0.05)
        done.append(k)
        return []

    def gpu(k):
        raise RuntimeError("device lost")

    with pytest.raises(RuntimeError, match="device lost"):
        split.run(8, cpu, gpu)
    assert done == [4]  # the CPU half finished before run() raised: no thread writes into a reused slot


def test_auto_without_a_gpu_is_the_native_decoder(photos):
    ds = fastload.open(photos, transforms={"image": [T.RandomResizedCrop(32)]})
    a = [x.clone() for x, _ in fastload.DataLoader(ds, batch_size=8, seed=1, decoder="auto")]
    b = [x.clone() for x, _ in fastload.DataLoader(ds, batch_size=8, seed=1)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    np.testing.assert_equal(len(a), len(b))


# -- a GPU decoder that is installed but cannot be used ---------------------------------------------------
@pytest.fixture
def broken_torchvision(tmp_path, monkeypatch):
    """A torchvision that raises RuntimeError at import, as one built for another torch does."""
    import sys

    pkg = tmp_path / "torchvision"
    (pkg / "io").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    (pkg / "io" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(fastload._ring, "_warned", set())


@pytest.fixture
def old_dali(monkeypatch):
    import sys
    import types

    dali = types.ModuleType("nvidia.dali")
    dali.__version__ = "1.30.0"
    dali.fn, dali.types, dali.pipeline_def = object(), object(), object()
    monkeypatch.setitem(sys.modules, "nvidia.dali", dali)
    if "nvidia" in sys.modules:  # `import nvidia.dali as d` reads the package's attribute
        monkeypatch.setattr(sys.modules["nvidia"], "dali", dali, raising=False)


def test_auto_falls_back_to_native_with_a_warning_when_gpu_decoders_are_broken(broken_torchvision, old_dali):
    with pytest.warns(RuntimeWarning) as caught:
        images = ImageDecoding("auto", torch.device("cuda", 0), 8, 1)
    assert images.kind.name == "native" and images.hybrid is None and images.device is None
    text = " ".join(str(w.message) for w in caught)
    assert "nvjpeg: ImportError" in text and "torchvision::nms" in text
    assert "DALI 1.30.0 is too old" in text and ">= 1.44" in text


def test_auto_pairs_the_usable_gpu_decoder_when_another_is_broken(old_dali, monkeypatch):
    """DALI too old, torchvision usable: native threads share each batch with nvJPEG, and the warning names DALI
    and says so (it used to say 'CPU threads only' and then run nvJPEG alone, with no CPU share)."""
    from fastload.decoders import nvjpeg

    monkeypatch.setattr(nvjpeg, "probe", lambda: None)  # a torchvision that imports
    monkeypatch.setattr(nvjpeg, "KIND", dataclasses.replace(nvjpeg.KIND, probe=nvjpeg.probe))
    monkeypatch.setattr(fastload._ring, "_warned", set())
    with pytest.warns(RuntimeWarning) as caught:
        images = ImageDecoding("auto", torch.device("cuda", 0), 8, 1)
    text = " ".join(str(w.message) for w in caught)
    assert "DALI 1.30.0 is too old" in text and "CPU threads share each batch with 'nvjpeg' instead" in text
    assert "CPU threads only" not in text
    assert images.kind.name == "auto" and isinstance(images.hybrid, HybridSplit)
    assert images.device == torch.device("cuda", 0)


def test_nvjpeg_with_a_broken_torchvision_says_so(broken_torchvision):
    from fastload.decoders.nvjpeg import _torchvision_decoder

    with pytest.raises(ImportError, match="importing torchvision failed: RuntimeError"):
        _torchvision_decoder(torch.device("cuda", 0))


def test_a_torchvision_without_nvjpeg_is_found_out_when_the_decoder_is_made(monkeypatch):
    """It imports, and every GPU decode then fails: one probe decode when the decoder is made says so (NvjpegDecoder
    runs it with its output stream current: tests/test_gpu_streams_sim.py)."""
    from types import SimpleNamespace

    from fastload.decoders import nvjpeg

    def decode_jpeg(datas, mode, device):
        raise RuntimeError("torchvision.io.decode_jpeg: nvjpeg is not available in this build")

    monkeypatch.setattr(nvjpeg, "_import_torchvision", lambda: (SimpleNamespace(RGB="RGB"), decode_jpeg))
    with pytest.raises(ImportError, match="cannot decode JPEG on cuda:0.*nvjpeg is not available"):
        nvjpeg._check_decodes(nvjpeg._torchvision_decoder(torch.device("cuda", 0)), torch.device("cuda", 0))


def test_the_gpu_decoder_auto_pairs_instead_of_a_broken_one_runs_whatever_the_first_ran(monkeypatch):
    """When the GPU decoder 'auto' chose fails at set-up, the next registered one is paired only if it runs what the
    first one did (the loader refused or accepted the pipeline by the first one's kind), and only if it is usable:
    one that is installed but broken is named with its reason."""
    from fastload import decoders
    from fastload.decoders import hybrid, nvjpeg

    dali_kind = decoders.kind("dali")
    for augments, probe_error, paired in ((True, None, "nvjpeg"), (False, None, None),
                                          (True, RuntimeError("CUDA driver too old"), None)):
        def probe(error=probe_error):
            if error is not None:
                raise error

        monkeypatch.setattr(nvjpeg, "KIND", dataclasses.replace(nvjpeg.KIND, augments=augments, probe=probe))
        why: list = []
        found = hybrid._next_gpu_decoder(dali_kind, dali_kind, why)
        assert (found and found.name) == paired, (augments, probe_error)
        assert why == ([] if probe_error is None else ["'nvjpeg' (RuntimeError: CUDA driver too old)"])
