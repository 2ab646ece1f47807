"""GaussianBlur's torch kernel with several kernel sizes in one step reads nothing from host memory.

On a GPU every tensor the batched engine's kernels read is on the device; an index built on the host with
``torch.from_numpy(...).to('cuda')`` is a copy from pageable memory, which makes the host wait for the
stream first (issue 19, row 3). The simulated device (tests/sim_streams.py) sees copies only through the
streams backend, and its device tensors are CPU tensors, so a ``.to(device)`` there is no copy at all. This
test runs the kernel on CPU tensors instead under a dispatch mode that knows which storages are "on the
device": the inputs handed to the kernel and everything an op made. Any op reading another CPU tensor reads
host memory: on a GPU, a host-to-device copy of pageable memory.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from fastload._augment.engine_torch import Columns
from fastload._augment.filters import _blur_torch, _kernel1d_np


class HostReads(TorchDispatchMode):
    """Records ops that read a tensor whose storage is neither given as device memory nor made by an op."""

    def __init__(self, device_tensors):
        super().__init__()
        self.device = {t.untyped_storage().data_ptr() for t in device_tensors}
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in tree_flatten((args, kwargs or {}))[0]:
            if isinstance(t, torch.Tensor) and t.numel() > 0 and t.untyped_storage().data_ptr() not in self.device:
                self.reads.append(f"{func} reads a host {tuple(t.shape)} {t.dtype} tensor")
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.device.add(t.untyped_storage().data_ptr())
        return out


def _columns(ksize: np.ndarray, sigma: np.ndarray) -> Columns:
    cols = Columns({"ksize": torch.from_numpy(ksize.copy()), "sigma": torch.from_numpy(sigma.copy())})
    cols.host = {"ksize": ksize, "sigma": sigma}  # what the engine keeps on the host: the kernel sizes
    return cols


def _reference(tile: np.ndarray, kx: int, ky: int, sx: float, sy: float) -> np.ndarray:
    a = np.pad(tile.astype(np.float64), ((0, 0), (ky // 2, ky // 2), (kx // 2, kx // 2)), mode="reflect")
    k2 = np.outer(_kernel1d_np(ky, sy), _kernel1d_np(kx, sx))
    c, h, w = tile.shape
    out = np.zeros((c, h, w))
    for dy in range(ky):
        for dx in range(kx):
            out += k2[dy, dx] * a[:, dy:dy + h, dx:dx + w]
    return np.clip(np.rint(out), 0, 255)


@pytest.mark.parametrize("sizes", [[[3, 3]] * 7, [[3, 3], [9, 5], [5, 9], [3, 3], [9, 5], [7, 7], [3, 3]]])
def test_blur_reads_no_host_memory_with_any_number_of_kernel_sizes(sizes):
    """Fails with the rows of each kernel size copied from a numpy index (the previous code): index_select
    then reads a host tensor. Each sample is blurred with its own kernel size and sigma (per-sample reference)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (len(sizes), 3, 20, 24), dtype=torch.uint8, generator=g)
    ksize = np.array(sizes, dtype=np.int64)
    sigma = np.linspace(0.6, 2.4, 2 * len(sizes)).reshape(-1, 2)
    cols = _columns(ksize, sigma)
    with HostReads([x, cols["ksize"], cols["sigma"]]) as mode:
        y = _blur_torch(x, cols)
    assert not mode.reads, mode.reads
    for i, ((kx, ky), (sx, sy)) in enumerate(zip(ksize, sigma)):
        want = _reference(x[i].numpy(), int(kx), int(ky), float(sx), float(sy))
        assert np.abs(y[i].numpy().astype(int) - want).max() <= 1, i


def test_the_checker_sees_a_host_index():
    """The dispatch mode itself: an index made from numpy (torch lifts it into the graph: ``lift_fresh``) or
    made outside the mode, then read by an op, is reported; a tensor an op made is not."""
    x = torch.zeros(4, 3, 2, 2)
    with HostReads([x]) as mode:
        x.index_select(0, torch.from_numpy(np.array([0, 2])))
    assert mode.reads and all("(2,) torch.int64" in r for r in mode.reads), mode.reads
    index = torch.tensor([1, 3])
    with HostReads([x]) as mode:
        x.index_select(0, index)
    assert len(mode.reads) == 1 and "index_select" in mode.reads[0]
    with HostReads([x]) as mode:
        x.index_select(0, torch.arange(2, device=x.device) * 2)
    assert not mode.reads
