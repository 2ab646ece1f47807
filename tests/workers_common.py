"""What the tests of the generic path share (test_workers.py, test_shm.py, test_shutdown.py): datasets defined
at module level, so that spawned workers and the Ctrl-C test's subprocess can import them, a deep equality,
one epoch of torch's loader beside fastload's, and a count of the shared-memory slots mapped."""

from __future__ import annotations

import collections
import dataclasses
import time

import numpy as np
import torch
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import Dataset

import fastload

Point = collections.namedtuple("Point", "x y")


class Slow(Dataset):
    def __init__(self, delay: float, n: int = 64, first_only: bool = False):
        self.delay, self.n, self.first_only = delay, n, first_only

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not self.first_only or i == 0:
            time.sleep(self.delay)
        return torch.full((8,), i), i


class Samples(Dataset):
    def __init__(self, kind: str, n: int = 23):
        self.kind, self.n = kind, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = torch.arange(6, dtype=torch.float32).reshape(2, 3) + i
        if self.kind == "tuple":
            return x, i
        if self.kind == "dict":
            return {"x": x, "label": i, "weight": i / 7, "name": f"n{i}", "raw": bytes([i % 256])}
        if self.kind == "nested":
            return {"a": (x, [i, i * 2]), "b": {"c": x.to(torch.int16), "d": Point(i, float(i))}}
        if self.kind == "numpy":
            return np.full((4,), i, dtype=np.int32), np.float64(i) / 3, np.bool_(i % 2)
        if self.kind == "scalars":
            return i, float(i), True
        if self.kind == "bool_complex":
            return torch.tensor([i % 2 == 0, True]), torch.tensor([complex(i, 1)], dtype=torch.complex64)
        raise ValueError(self.kind)


def same(a, b) -> bool:
    """Deep equality that also checks container and tensor types and dtypes."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return a == b


def both(ds, seed: int = 0, **kw) -> tuple[list, list]:
    """One epoch of torch's DataLoader and of fastload's, each from the same generator state."""
    out = []
    for cls in (TorchLoader, fastload.DataLoader):
        g = torch.Generator()
        loader = cls(ds, generator=g, **kw)
        g.manual_seed(seed)  # after construction: the loaders must draw identically from here on
        out.append(list(loader))
    return out[0], out[1]


def memfd_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum("fastload-slot" in line for line in f)
