"""ToDtype / Normalize: torchvision v2 semantics, fused, layout kept; on the CPU without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
from fastload import transforms as T

from conftest import make_image_folder

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def reference(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    y = x.to(torch.float64) / 255.0
    m = torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    s = torch.tensor(STD, dtype=torch.float64).view(1, 3, 1, 1)
    return ((y - m) / s).to(dtype)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-2), (torch.bfloat16, 6e-2)])
def test_fused_matches_reference(dtype, tol):
    x = torch.randint(0, 256, (4, 16, 16, 3), dtype=torch.uint8).permute(0, 3, 1, 2)
    pipe = T.ImagePipeline([T.ToDtype(dtype, scale=True), T.Normalize(MEAN, STD)]).tensor
    y = pipe.apply(x)
    assert y.dtype == dtype and y.is_contiguous(memory_format=torch.channels_last)
    assert (y.double() - reference(x, dtype).double()).abs().max() <= tol


def test_one_pass_kernel_and_torch_ops_agree_on_every_layout():
    """float32 from channels_last uint8 on the CPU takes the native one-pass kernel; other layouts and
    dtypes take torch's ops. Both fold to x * a + b, so they agree to a rounding step."""
    pipe = T.ImagePipeline([T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)]).tensor
    nhwc = torch.randint(0, 256, (3, 9, 11, 3), dtype=torch.uint8)
    fast = pipe.apply(nhwc.permute(0, 3, 1, 2))  # channels_last
    plain = pipe.apply(nhwc.permute(0, 3, 1, 2).contiguous())  # NCHW: torch's ops
    sliced = pipe.apply(nhwc.permute(0, 3, 1, 2)[:, :, 2:7, 1:9])  # a crop of a channels_last batch
    assert fast.is_contiguous(memory_format=torch.channels_last) and plain.is_contiguous()
    assert (fast - plain).abs().max() <= 1e-6 and (fast - reference(nhwc.permute(0, 3, 1, 2), torch.float32)).abs().max() < 1e-5
    assert (sliced - fast[:, :, 2:7, 1:9]).abs().max() <= 1e-6
    out = torch.empty(3, 3, 9, 11).to(memory_format=torch.channels_last)
    assert pipe.apply(nhwc.permute(0, 3, 1, 2), out) is out and torch.equal(out, fast)


def test_to_dtype_alone_and_declaration_errors():
    x = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    assert torch.equal(T.ImagePipeline([T.ToDtype(torch.float32)]).tensor.apply(x), x.float())
    with pytest.raises(ValueError, match="float batch"):
        T.ImagePipeline([T.Normalize(MEAN, STD)])
    with pytest.raises(ValueError, match="after every geometric"):
        T.ImagePipeline([T.ToDtype(torch.float32), T.RandomResizedCrop(8)])
    with pytest.raises(ValueError, match="zero"):
        T.Normalize([0.5], [0.0])


def test_loader_and_ds_apply_them_on_cpu(tmp_path):
    make_image_folder(tmp_path / "src", classes=2, per_class=4)
    fastload.pack(tmp_path / "src", tmp_path / "ds", workers=0)
    geo = [T.Resize((24, 20))]
    tail = [T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)]
    plain = fastload.open(tmp_path / "ds", transforms={"image": geo})
    normed = fastload.open(tmp_path / "ds", transforms={"image": geo + tail})
    (u8, _), (f32, labels) = next(iter(fastload.DataLoader(plain, batch_size=8))), \
        next(iter(fastload.DataLoader(normed, batch_size=8, num_workers=2)))
    assert f32.dtype == torch.float32 and f32.shape == (8, 3, 24, 20)
    assert f32.is_contiguous(memory_format=torch.channels_last)
    assert (f32 - reference(u8, torch.float32)).abs().max() < 1e-5
    assert (normed[3][0] - reference(plain[3][0][None], torch.float32)[0]).abs().max() < 1e-5


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 6e-2)])
def test_cpu_results_reuse_their_buffers_but_never_one_still_held(tmp_path, dtype, tol):
    """On the CPU, ToDtype/Normalize write into buffers the batcher reuses (a fresh float batch per step
    cost more in page faults than the arithmetic); a batch the caller still holds must keep its values."""
    make_image_folder(tmp_path / "src", classes=2, per_class=8)
    fastload.pack(tmp_path / "src", tmp_path / "ds", workers=0)
    geo = [T.RandomResizedCrop(16), T.RandomHorizontalFlip()]
    plain = fastload.open(tmp_path / "ds", transforms={"image": geo})
    normed = fastload.open(tmp_path / "ds", transforms={"image": geo + [T.ToDtype(dtype, scale=True),
                                                                         T.Normalize(MEAN, STD)]})
    kw = dict(batch_size=4, shuffle=True, seed=7, num_workers=2)
    for epoch in range(2):
        u8 = [b[0].clone() for b in fastload.DataLoader(plain, **kw)]
        held, copies, ptrs = [], [], set()
        for k, (images, _) in enumerate(fastload.DataLoader(normed, **kw)):
            ptrs.add(images.data_ptr())
            if k % 2 == 0:  # every other batch stays held to the end of the epoch
                held.append(images)
                copies.append(images.clone())
            assert images.dtype == dtype
            assert (images.double() - reference(u8[k], dtype).double()).abs().max() <= tol
            del images
        assert all(torch.equal(h, c) for h, c in zip(held, copies))  # nothing held was overwritten
        assert len(ptrs) < len(u8)  # the batches not held gave their buffers back


def test_normalize_constants_are_made_on_the_device_without_a_host_copy():
    """A copy of the constants from a pageable CPU tensor would make the first batch of a process wait
    for the GPU to drain; they are filled on the device ('meta' stands in for CUDA: no CPU tensor may be
    copied to it)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    copies = []

    class HostToDevice(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
            target = kwargs.get("device") or next((t.device for t in tensors if t.device.type != "cpu"), None)
            if target is not None and torch.device(target).type != "cpu" and \
                    any(t.device.type == "cpu" and t.dim() > 0 for t in tensors):
                copies.append(str(func))
            return func(*args, **kwargs)

    for dtype in (torch.float32, torch.float16):
        pipe = T.ImagePipeline([T.ToDtype(dtype, scale=True), T.Normalize(MEAN, STD)]).tensor
        with HostToDevice():
            a, b = pipe._constants(3, torch.device("meta"))
        assert not copies, copies
        assert a.device.type == b.device.type == "meta" and a.dtype == b.dtype == dtype
        assert a.shape == b.shape == (1, 3, 1, 1)
    cpu = T.ImagePipeline([T.ToDtype(torch.float16, scale=True), T.Normalize(MEAN, STD)]).tensor
    a, b = cpu._constants(3, torch.device("cpu"))  # the same values as the float32-then-cast rule
    want = torch.tensor([1 / 255 / s for s in STD], dtype=torch.float32).to(torch.float16)
    assert torch.equal(a.flatten(), want)


def test_the_pipelines_own_constants_are_made_per_stream(monkeypatch):
    """``apply`` without given constants (a caller running a pipeline on its own device tensors) keeps them on
    the pipeline per current stream: constants filled on one stream and read on another would need the
    reader to wait for the fills ('meta' stands in for CUDA, a counter for its current stream)."""
    from fastload._transforms import tensor as _tensor_transforms

    stream = ["s1"]
    monkeypatch.setattr(_tensor_transforms, "_current_stream", lambda device: stream[0])
    pipe = T.ImagePipeline([T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)]).tensor
    meta = torch.device("meta")
    first = pipe._constants(3, meta)
    assert pipe._constants(3, meta) is first  # made once per stream
    stream[0] = "s2"
    second = pipe._constants(3, meta)
    assert second is not first and all(a is not b for a, b in zip(first, second))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_constants_made_through_a_streams_backend_round_once_from_float32(dtype):
    """The device prefetcher's constants (fills through the streams backend, on its side stream) hold the
    float32 value rounded once to the output dtype, as the pipeline's own do."""
    from fastload._ring import HostStreams

    pipe = T.ImagePipeline([T.ToDtype(dtype, scale=True), T.Normalize(MEAN, STD)]).tensor
    a, b = pipe.constants(3, HostStreams(torch.device("cpu")))
    f32 = lambda v: torch.tensor(v, dtype=torch.float32).to(dtype)  # noqa: E731
    assert a.dtype == b.dtype == dtype and a.shape == b.shape == (1, 3, 1, 1)
    assert torch.equal(a.flatten(), f32([1 / 255 / s for s in STD]))
    assert torch.equal(b.flatten(), f32([-m / s for m, s in zip(MEAN, STD)]))
    assert all(torch.equal(x, y) for x, y in zip((a, b), pipe._constants(3, torch.device("cpu"))))


def test_cpu_results_are_allocated_once_not_every_epoch(tmp_path, monkeypatch):
    """The CPU ToDtype/Normalize buffers (``fast/collate.py``) are the loader's for its lifetime, as its slots are:
    was, each iteration made a new Collator and so a new ring of float batches (38 MB each at 64x3x224x224), fresh
    pages every epoch (FFCV's #365)."""
    from fastload.fast import collate

    made = []
    real_slot = collate.Slot
    monkeypatch.setattr(collate, "Slot", lambda tensors: made.append(1) or real_slot(tensors))
    make_image_folder(tmp_path / "src", classes=2, per_class=8)
    fastload.pack(tmp_path / "src", tmp_path / "ds", workers=0)
    ds = fastload.open(tmp_path / "ds", transforms={"image": [T.Resize((16, 16)), T.ToDtype(torch.float32, scale=True),
                                                              T.Normalize(MEAN, STD)]})
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=7)
    counts = []
    for _ in range(3):
        for images, _ in loader:
            del images
        counts.append(len(made))
    assert counts[0] > 0 and counts == [counts[0]] * 3, f"buffers made by the end of each epoch: {counts}"
