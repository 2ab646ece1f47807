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


KILLED_PACK = """
import os, sys, time
import numpy as np
import fastload

class Waiting:
    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i >= 8:
            print("waiting", flush=True)
            time.sleep(120)
        return np.full(4, i, np.float32), i

fastload.pack(Waiting(), sys.argv[1], workers=2)
"""


def test_a_killed_pack_s_worker_processes_end_with_it(tmp_path):
    # a pack killed with SIGKILL cannot end its workers: left alone they waited on their task queue (or in the
    # source) for ever, as orphans, each holding a copy of the source
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, PYTHONPATH=str(Path(fastload.__file__).parents[1]))
    proc = subprocess.Popen([sys.executable, "-c", KILLED_PACK, str(tmp_path / "ds")], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "waiting"  # a worker is inside the source now
        kids = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        assert len(kids) == 2, kids
    finally:
        proc.kill()
        proc.wait()
    deadline = time.time() + 10
    while time.time() < deadline and any(os.path.exists(f"/proc/{k}") for k in kids):
        time.sleep(0.05)
    def running(pid):  # a zombie is dead: its state in /proc/PID/stat, after the command's parenthesis, is Z
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    alive = [k for k in kids if running(k)]
    for k in alive:
        os.kill(k, signal.SIGKILL)
    assert alive == []


class BadThenStuck(torch.utils.data.Dataset):
    """Sample 20 cannot be loaded; sample 28 (the next chunk of 8, so another worker's) takes minutes. The schema
    is inferred from the first 8 samples."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 20:
            raise ValueError("sample 20 is unreadable")
        if i == 28:
            time.sleep(120)
        return {"x": np.full(4, i, np.float32)}


def test_a_failed_pack_ends_its_workers_even_under_a_sigterm_handler(tmp_path):
    """A handler for SIGTERM in the pack process (frameworks and test runners install them) is inherited by the
    forked workers: a worker stuck in a sample slept through the pack's SIGTERM and the pack waited on it."""
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        t0 = time.monotonic()
        with pytest.raises(FastloadError, match="sample 20 is unreadable"):
            fastload.pack(BadThenStuck(), tmp_path / "out", workers=2)
        took = time.monotonic() - t0
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert took < 60, f"the failed pack took {took:.0f} s: it waited on a worker stuck in a sample"
    assert multiprocessing.active_children() == []
