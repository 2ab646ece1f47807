"""pack/_encode_pool.py: encoding on worker processes; a worker killed mid-pack is a clear error, never a
hang, and the pack resumes to the same bytes."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch

import fastload
from fastload import FastloadError

from conftest import dir_bytes


class SlowSamples(torch.utils.data.Dataset):
    def __len__(self):
        return 300

    def __getitem__(self, i):
        time.sleep(0.002)
        return {"x": np.full(16, i, np.float32), "name": f"s{i}"}


def test_pack_worker_killed_is_an_error_not_a_hang(tmp_path):
    dest = tmp_path / "out"
    threads = threading.active_count()
    killed = []

    def killer():
        deadline = time.time() + 20
        while time.time() < deadline and not killed:
            kids = multiprocessing.active_children()
            if kids and dest.exists() and len(list(dest.glob("shard-*.fls"))) >= 1:
                os.kill(kids[0].pid, signal.SIGKILL)
                killed.append(kids[0].pid)
            time.sleep(0.01)

    t = threading.Thread(target=killer)
    t.start()
    try:
        with pytest.raises(FastloadError, match=r"pack worker process died unexpectedly .*SIGKILL.*resume"):
            fastload.pack(SlowSamples(), dest, workers=2, shard_size="4K")
    finally:
        t.join()
    assert killed
    assert multiprocessing.active_children() == []
    assert threading.active_count() == threads
    fastload.pack(SlowSamples(), dest, workers=2, shard_size="4K")
    fastload.pack(SlowSamples(), tmp_path / "ref", workers=2, shard_size="4K")
    assert dir_bytes(dest) == dir_bytes(tmp_path / "ref")
