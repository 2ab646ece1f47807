"""The batched torch engine's pixels do not depend on the caller's precision settings (issue 19, row 7).

On a GPU, convolutions and matmuls follow global flags (cuDNN's TF32, on by default on Ampere and later;
``torch.set_float32_matmul_precision``), and an enclosing ``torch.autocast`` runs them in float16/bfloat16.
The engine runs in the GPU decoders' threads and, at ``num_workers=0`` or for a fill in the training
thread, inside the user's training step. Two checks that need no GPU:

- under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (the CPU's autocast lowers convolutions as CUDA's
  does) every operation gives the same bytes as without;
- no operation the engine dispatches is one that TF32 or matmul precision governs (convolutions, matmuls):
  those flags only act on a GPU, so this is the check the CPU can make for them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from augment_common import H, W, smooth_tiles, to_batch
from fastload._augment.engine_torch import run_torch
from fastload._augment.plan import BILINEAR, NEAREST, PlanBuilder

N = 6
# The aten ops whose float32 arithmetic global flags change on a GPU (TF32 / matmul precision / autocast).
GOVERNED = ("convolution", "cudnn", "mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "einsum")


def _plan(op: str):
    b = PlanBuilder(np.tile([H, W], (N, 1)))
    rows = np.arange(N)
    if op == "gaussian_blur":
        b.add(op, rows, ksize=np.array([[3, 3], [9, 5]] * (N // 2)), sigma=np.linspace(0.3, 2.0, 2 * N).reshape(N, 2))
    elif op == "sharpness":
        b.add(op, rows, factor=np.linspace(0.0, 2.0, N))
    else:  # an affine: a small rotation about the centre
        t = np.deg2rad(np.linspace(-20, 20, N))
        m = np.zeros((N, 2, 3))
        m[:, 0, 0], m[:, 0, 1], m[:, 1, 0], m[:, 1, 1] = np.cos(t), -np.sin(t), np.sin(t), np.cos(t)
        m[:, 0, 2] = W / 2 - m[:, 0, 0] * W / 2 - m[:, 0, 1] * H / 2
        m[:, 1, 2] = H / 2 - m[:, 1, 0] * W / 2 - m[:, 1, 1] * H / 2
        b.affine(rows, m, BILINEAR if op == "affine_bilinear" else NEAREST, np.full((N, 3), 7.0))
    return b.finish()


OPS = ["gaussian_blur", "sharpness", "affine_bilinear", "affine_nearest"]


@pytest.mark.parametrize("op", OPS)
def test_an_enclosing_autocast_does_not_change_the_pixels(op):
    tiles = to_batch(smooth_tiles(N))
    plan = _plan(op)
    plain = run_torch(tiles, plan)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = run_torch(tiles, plan)
    assert under.dtype == plain.dtype == torch.uint8
    assert torch.equal(under, plain), f"{op}: {int((under.int() - plain.int()).abs().max())} levels apart"


class Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("op", OPS)
def test_no_operation_that_tf32_or_matmul_precision_governs(op):
    tiles = to_batch(smooth_tiles(N))
    plan = _plan(op)
    with Recorder() as rec:
        run_torch(tiles, plan)
    governed = [o for o in rec.ops if any(f"aten.{g}" in o or f"aten._{g}" in o for g in GOVERNED)]
    assert rec.ops and not governed, f"{op} dispatches {sorted(set(governed))}"
