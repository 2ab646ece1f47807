"""fastload/fast/device.py: the device prefetcher's ring logic, run with the null (CPU) backend; CUDA itself: tests/cuda/."""

from __future__ import annotations

import pytest
import torch

import fastload
from fastload import transforms as T

from conftest import make_image_folder


def batches(n=6, b=4):
    for k in range(n):
        yield [torch.full((b, 3, 2, 2), k, dtype=torch.uint8).contiguous(memory_format=torch.channels_last),
               torch.arange(b) + 10 * k, "tag", {"x": torch.ones(2) * k}]


def test_structure_values_and_layout_survive():
    out = list(fastload.to_device(batches(), "cpu"))
    assert len(out) == 6
    for k, (img, lab, tag, d) in enumerate(out):
        assert (img == k).all() and img.is_contiguous(memory_format=torch.channels_last)
        assert lab.tolist() == [10 * k + i for i in range(4)] and tag == "tag" and (d["x"] == k).all()


def test_held_batches_are_never_overwritten_and_dropped_ones_are_reused():
    held = list(fastload.to_device(batches(20), "cpu", depth=2))
    assert all((b[0] == k).all() for k, b in enumerate(held))  # every slot still intact
    pf = fastload.to_device(batches(50), "cpu", depth=2)
    for b in pf:
        del b
    assert len(pf.ring) <= 4  # a loop that drops each batch cycles through a small ring


def test_transforms_run_on_the_named_entry_only():
    pipe = [T.ToDtype(torch.float32, scale=True), T.Normalize([0.5] * 3, [0.5] * 3)]
    out = list(fastload.to_device(batches(3), "cpu", transforms={0: pipe}))
    for k, (img, lab, _, _) in enumerate(out):
        assert img.dtype == torch.float32 and torch.allclose(img, torch.full_like(img, (k / 255 - 0.5) / 0.5))
        assert lab.dtype == torch.int64


def test_to_device_wraps_a_torch_loader_and_keeps_len():
    tds = torch.utils.data.TensorDataset(torch.arange(20))
    pf = fastload.to_device(torch.utils.data.DataLoader(tds, batch_size=6), "cpu")
    assert len(pf) == 4 and torch.cat([b[0] for b in pf]).tolist() == list(range(20))


def test_bad_devices():
    with pytest.raises(ValueError, match="depth"):
        fastload.to_device([], "cpu", depth=0)
    with pytest.raises(ValueError, match="prefetches to 'cuda'"):
        fastload.to_device([], "meta")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            fastload.to_device([], "cuda")


def test_loader_device_argument_without_cuda(tmp_path):
    make_image_folder(tmp_path / "src", classes=2, per_class=2)
    fastload.pack(tmp_path / "src", tmp_path / "ds", workers=0)
    ds = fastload.open(tmp_path / "ds", transforms={"image": [T.Resize((8, 8))]})
    assert next(iter(fastload.DataLoader(ds, batch_size=2, device="cpu")))[0].device.type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            fastload.DataLoader(ds, batch_size=2, device="cuda")


def test_gpu_decoders_say_what_they_need(tmp_path):
    make_image_folder(tmp_path / "src", classes=1, per_class=2)
    fastload.pack(tmp_path / "src", tmp_path / "ds", workers=0)
    ds = fastload.open(tmp_path / "ds", transforms={"image": [T.Resize((8, 8))]})
    with pytest.raises(ValueError, match="device='cuda'"):
        fastload.DataLoader(ds, batch_size=2, decoder="nvjpeg")
    with pytest.raises(ValueError, match="should be one of 'native', 'exact', 'dali', 'nvjpeg', 'auto'"):
        fastload.DataLoader(ds, batch_size=2, decoder="opencv")


def test_the_ring_shrinks_after_a_pass_that_needed_fewer_slots():
    """A pass that held every batch grows the ring; the next pass drops each batch and needs a few
    slots: the pass after it starts without the others (device memory, ~190 MB a slot at batch 256)."""
    d = fastload.to_device(list(batches(12)), "cpu", depth=2)
    held = list(d)
    assert len(d.ring) >= 12
    del held
    for b in d:
        del b
    for b in d:
        del b
    assert len(d.ring) <= 4
    out = list(d)  # and it grows again when a pass needs it
    assert len(d.ring) >= 12 and all((b[0] == k).all() for k, b in enumerate(out))
