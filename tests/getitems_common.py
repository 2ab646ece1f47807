"""What the ``__getitems__`` tests (test_getitems*.py) share: the transforms their datasets are opened with and the
comparison of a row or batch with ``ds[i]``'s (or ``default_collate``'s) exactly."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import default_collate

from fastload import transforms as T

DETERMINISTIC = {"image": [T.Resize((20, 30))]}
RANDOM = {"image": [T.RandomResizedCrop(16), T.RandomHorizontalFlip()]}
EVERY_KIND = {"image": [T.Resize((24, 20)), T.ToDtype(torch.float32, scale=True), T.Normalize([0.5] * 3, [0.2] * 3)],
              "tokens": T.Pad(6, value=-1)}


def assert_same_sample(a, b, strides: bool = True) -> None:
    """``a`` is exactly ``b``: the same structure and types, and for tensors and numpy arrays the same shape, dtype
    and values (and, with ``strides``, a tensor's strides: a row must be laid out as ds[i]'s)."""
    assert type(a) is type(b), f"{type(a).__name__} where {type(b).__name__} was expected"
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same_sample(a[k], b[k], strides)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_sample(x, y, strides)
    elif isinstance(a, torch.Tensor):
        assert (a.shape, a.dtype) == (b.shape, b.dtype)
        if strides:
            assert a.stride() == b.stride()
        assert torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    else:
        assert a == b


def expected_batches(ds, batch_size: int) -> list:
    """``default_collate`` of ``ds[i]``'s rows, batch by batch, in order: what torch's loader gives unshuffled."""
    n = len(ds)
    return [default_collate([ds[i] for i in range(s, min(n, s + batch_size))]) for s in range(0, n, batch_size)]
