"""What the worker tests share (test_workers.py, test_shm.py, test_shutdown.py): datasets defined at module
level, so that spawned workers and the Ctrl-C test's subprocess can import them."""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset


class Slow(Dataset):
    def __init__(self, delay: float, n: int = 64, first_only: bool = False):
        self.delay, self.n, self.first_only = delay, n, first_only

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not self.first_only or i == 0:
            time.sleep(self.delay)
        return torch.full((8,), i), i
