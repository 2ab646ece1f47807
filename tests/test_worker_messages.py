"""The generic path's messages in torch's words (fastload/_workers.py): tools and tests match on them."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

import fastload

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parent.parent


class Slow(Dataset):
    def __len__(self):
        return 400

    def __getitem__(self, i):
        time.sleep(0.02)
        return torch.tensor([i])


class ExitsInWorker(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            os._exit(3)
        return i


class Unsharded(IterableDataset):
    """Every worker yields all samples, so the loader yields more batches than len() said (torch warns)."""

    def __len__(self):
        return 6

    def __iter__(self):
        return iter(range(6))


def killed_message(loader_cls, sig) -> str:
    loader = loader_cls(Slow(), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    workers = getattr(it, "_workers", None)
    os.kill(workers[0].pid, sig)
    try:
        for _ in range(300):
            next(it)
    except RuntimeError as e:
        msgs = []
        while e is not None:  # torch raises "exited unexpectedly" from the signal handler's message
            msgs.append(str(e))
            e = e.__cause__
        return " | ".join(msgs)
    finally:
        del it
        gc.collect()
    raise AssertionError("no error after the worker was killed")


@pytest.mark.parametrize("sig, text", [(signal.SIGKILL, "Killed"), (signal.SIGBUS, "Bus error")])
def test_killed_worker_message_is_torchs(sig, text):
    theirs = killed_message(torch.utils.data.DataLoader, sig)
    ours = killed_message(fastload.DataLoader, sig)
    torch_line = next(m for m in theirs.split(" | ") if "is killed by signal" in m)
    pid_free = torch_line.split(") ", 1)[1]  # "is killed by signal: Killed. ..."
    assert f"is killed by signal: {text}." in pid_free
    assert ours.startswith("DataLoader worker (pid ") and pid_free.strip() in ours
    if sig == signal.SIGBUS:
        assert "out of shared memory. Please try to raise your shared memory limit." in ours


def test_worker_exit_code_message_is_torchs():
    with pytest.raises(RuntimeError, match=r"^DataLoader worker \(pid \d+\) exited unexpectedly with exit code 3\. "
                                           r"Details are lost due to multiprocessing\. Rerunning with num_workers=0 "
                                           r"may give better error trace\."):
        list(fastload.DataLoader(ExitsInWorker(), batch_size=2, num_workers=2))


def test_iterable_dataset_length_warning_is_torchs():
    ds = Unsharded()

    def messages(loader_cls):
        loader = loader_cls(ds, batch_size=1, num_workers=2)
        len(loader)  # 6; both workers yield all 6 samples: batches 7 .. 12 warn
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            list(loader)
        return [str(w.message) for w in record if "Length of IterableDataset" in str(w.message)]

    theirs, ours = messages(torch.utils.data.DataLoader), messages(fastload.DataLoader)
    assert len(theirs) == 6 and ours == theirs  # same wording, same counts


FD_SCRIPT = """
import os, resource, sys, torch, fastload
from torch.utils.data import Dataset
class DS(Dataset):
    def __len__(self): return 400
    def __getitem__(self, i): return torch.zeros(1000)
def low_limit(worker_id):  # the worker runs out first
    n = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (n + 3, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
where = sys.argv[1]
dl = fastload.DataLoader(DS(), batch_size=2, num_workers=2, worker_init_fn=low_limit if where == "worker" else None)
it = iter(dl)
if where == "main":  # this process runs out first: the kernel drops the descriptors it is sent
    n = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (n + 12, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
try:
    for b in it:
        held.append(b)  # every held batch keeps its slot's descriptor open
except RuntimeError as e:
    print("ERROR:", e)
"""


@pytest.mark.parametrize("where", ["main", "worker"])
def test_running_out_of_descriptors_gives_torchs_advice(tmp_path, where):
    script = tmp_path / "fds.py"
    script.write_text(textwrap.dedent(FD_SCRIPT))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(script), where], capture_output=True, text=True, timeout=80, env=env)
    assert out.returncode == 0, out.stderr
    assert "ERROR: Too many open files. Communication with the workers is no longer possible. Please increase the " \
           "limit using `ulimit -n` in the shell" in out.stdout
    assert "ancdata" not in out.stdout + out.stderr and "Traceback" not in out.stderr
