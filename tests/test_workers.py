"""The generic path (fastload/_generic/workers.py): shared-memory workers checked against torch's DataLoader (its slots:
test_shm.py; shutdown, Ctrl-C and leaks: test_shutdown.py), and its messages in torch's words."""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import Dataset, IterableDataset, get_worker_info

import fastload
from fastload._generic.workers import WorkerIterator

from workers_common import Samples, Slow, both, same

pytestmark = pytest.mark.timeout(60)


# -- datasets (module level, so that spawn can pickle them) -----------------------------------------
class Augmented(Dataset):
    """Random augmentations drawn in __getitem__ from every RNG a worker seeds."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return torch.rand(3), torch.randint(0, 100, (2,)), random.random(), np.random.rand(), i


class WhoAmI(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        info = get_worker_info()
        return {"id": info.id, "n": info.num_workers, "seed": info.seed, "pid": os.getpid(),
                "same_ds": info.dataset is self, "i": i}


class Sharded(IterableDataset):
    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        lo = wid * (self.n // nw + 3)  # uneven shards: the workers end at different times
        hi = self.n if wid == nw - 1 else min(self.n, lo + self.n // nw + 3)
        for i in range(lo, hi):
            yield torch.tensor([i, i * i]), f"s{i}"


class Failing(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        if i == 9:
            raise ValueError("bad sample marker-1234")
        return torch.zeros(2)


class Pids(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return os.getpid(), torch.full((4,), i)


@dataclasses.dataclass
class Custom:
    images: torch.Tensor
    labels: torch.Tensor
    names: list


def custom_collate(samples):
    xs, ys = zip(*[(torch.as_tensor(s[0]), s[1]) for s in samples])
    return Custom(torch.stack(xs).permute(0, 2, 1), torch.tensor(ys), [f"n{y}" for y in ys])


class InitRecorder:  # a worker_init_fn that leaves a file per call
    def __init__(self, path):
        self.path = path

    def __call__(self, wid):
        info = get_worker_info()
        Path(self.path, f"{wid}-{os.getpid()}").write_text(f"{info.id} {info.num_workers} {info.seed}")


def failing_init(wid):
    raise RuntimeError(f"init failed in {wid}")


# -- results match torch ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["tuple", "dict", "nested", "numpy", "scalars", "bool_complex"])
def test_same_batches_and_structures_as_torch(kind):
    t, f = both(Samples(kind), batch_size=4, shuffle=True, num_workers=2)
    assert len(t) == len(f) == 6
    assert same(t, f)


def test_random_augmentations_match_torch_seeding():
    for workers in (1, 2):
        t, f = both(Augmented(), seed=123, batch_size=5, shuffle=True, num_workers=workers)
        assert same(t, f)
    # the default generator too (seeded after construction)
    runs = []
    for cls in (TorchLoader, fastload.DataLoader):
        loader = cls(Augmented(), batch_size=4, shuffle=True, num_workers=2)
        torch.manual_seed(7)
        runs.append(list(loader))
    assert same(*runs)
    # persistent workers keep their RNG streams across epochs, as torch's do
    runs = []
    for cls in (TorchLoader, fastload.DataLoader):
        g = torch.Generator()
        loader = cls(Augmented(), batch_size=5, shuffle=True, num_workers=2, persistent_workers=True, generator=g)
        g.manual_seed(1)
        runs.append([list(loader) for _ in range(3)])
        del loader
    assert same(*runs)


def test_worker_info_and_init_fn(tmp_path):
    t, f = both(WhoAmI(), seed=5, batch_size=3, num_workers=2, worker_init_fn=InitRecorder(str(tmp_path)))
    for a, b in zip(t, f):  # same worker ids and seeds as torch, batch for batch
        assert same(a["id"], b["id"]) and same(a["seed"], b["seed"]) and same(a["i"], b["i"])
    ours = {int(x) for b in f for x in b["pid"]}
    calls = [p.name.split("-") for p in tmp_path.iterdir() if int(p.name.split("-")[1]) in ours]
    assert sorted(int(w) for w, _ in calls) == [0, 1]  # once per worker
    for wid, pid in calls:
        i, n, seed = Path(tmp_path, f"{wid}-{pid}").read_text().split()
        assert (int(i), int(n)) == (int(wid), 2)
        seeds = {int(s) for b in f for s, w in zip(b["seed"], b["id"]) if int(w) == int(wid)}
        assert seeds == {int(seed)}
    assert all(bool(b["same_ds"].all()) for b in f) and {int(n) for b in f for n in b["n"]} == {2}


@pytest.mark.parametrize("drop_last", [False, True])
def test_iterable_dataset_sharding_like_torch(drop_last):
    t, f = both(Sharded(29), batch_size=4, num_workers=2, drop_last=drop_last)
    assert same(t, f)  # same batches, in the same order
    samples = sorted(int(v) for b in f for v in b[0][:, 0])
    if not drop_last:
        assert samples == list(range(29))


def test_batch_size_none_and_custom_collate():
    t, f = both(Samples("tuple", 9), batch_size=None, num_workers=2)
    assert same(t, f) and len(f) == 9
    t, f = both(Samples("tuple", 10), batch_size=4, num_workers=2, collate_fn=custom_collate)
    assert same(t, f) and isinstance(f[0], Custom)
    assert all(a.images.stride() == b.images.stride() for a, b in zip(t, f))  # a permuted layout survives


def test_in_order_false_gives_the_same_samples():
    loader = fastload.DataLoader(Samples("tuple", 40), batch_size=4, shuffle=True, num_workers=2, in_order=False)
    got = sorted(int(i) for _, idx in loader for i in idx)
    assert got == list(range(40))


def test_spawn_context():
    t, f = both(Samples("dict", 8), batch_size=4, num_workers=1, multiprocessing_context="spawn")
    assert same(t, f)


@pytest.mark.filterwarnings("ignore:'pin_memory' argument")
def test_fallbacks_to_torch():
    ds = Samples("tuple", 8)
    it = iter(fastload.DataLoader(ds, batch_size=4, num_workers=0)).inner  # inner: past the batch counter
    assert isinstance(it, torch.utils.data.dataloader._SingleProcessDataLoaderIter)
    it = iter(fastload.DataLoader(ds, batch_size=4, num_workers=1, pin_memory=True)).inner
    assert isinstance(it, torch.utils.data.dataloader._MultiProcessingDataLoaderIter)
    assert isinstance(iter(fastload.DataLoader(ds, batch_size=4, num_workers=1)).inner, WorkerIterator)


# -- errors ----------------------------------------------------------------------------------------
def test_dataset_exception_carries_worker_traceback():
    loader = fastload.DataLoader(Failing(), batch_size=4, num_workers=2)
    it = iter(loader)
    next(it), next(it)
    with pytest.raises(ValueError, match="Caught ValueError in DataLoader worker process 0") as e:
        next(it)
    text = str(e.value)
    assert "bad sample marker-1234" in text and "__getitem__" in text and "Original Traceback" in text
    assert next(it).shape == (4, 2)  # like torch, the iterator goes on with the next batch
    del it


def test_worker_init_fn_exception():
    with pytest.raises(RuntimeError, match="init failed in"):
        list(fastload.DataLoader(Samples("tuple", 8), batch_size=4, num_workers=2, worker_init_fn=failing_init))
    gc.collect()
    assert multiprocessing.active_children() == []


def test_timeout():
    loader = fastload.DataLoader(Slow(1.0, n=8, first_only=True), batch_size=4, num_workers=1, timeout=0.2)
    it = iter(loader)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after 0.2 seconds") as e:
        next(it)
    assert time.monotonic() - t0 < 0.9
    # the stuck worker is named, with its pid, so that one can look at it
    assert f"batch 0 from fastload worker 0 (pid {it._workers[0].pid})" in str(e.value)
    del it, e  # the traceback holds the iterator
    gc.collect()
    assert multiprocessing.active_children() == []


# -- epochs ----------------------------------------------------------------------------------------
def test_iterate_again_after_break():
    for persistent in (False, True):
        loader = fastload.DataLoader(Samples("tuple", 40), batch_size=4, num_workers=2, persistent_workers=persistent)
        for k, _ in enumerate(loader):
            if k == 1:
                break
        epoch = [int(i) for _, idx in loader for i in idx]
        assert epoch == list(range(40))
        del loader
        gc.collect()
        assert multiprocessing.active_children() == []


def test_persistent_workers_keep_their_processes():
    loader = fastload.DataLoader(Pids(), batch_size=3, num_workers=2, persistent_workers=True)
    epochs = [list(loader) for _ in range(3)]
    pids = [{int(p) for b in e for p in b[0]} for e in epochs]
    assert len(pids[0]) == 2 and pids[0] == pids[1] == pids[2]
    assert all(same([b[1] for b in e], [b[1] for b in epochs[0]]) for e in epochs)
    assert {p.pid for p in multiprocessing.active_children()} == pids[0]
    del loader, epochs
    gc.collect()
    assert multiprocessing.active_children() == []


def test_construction_does_not_consume_torch_randomness():
    # the generic path must leave the default generator exactly where torch's loader would
    tds = torch.utils.data.TensorDataset(torch.arange(40))
    torch.manual_seed(0)
    ours = [b[0].tolist() for b in fastload.DataLoader(tds, batch_size=8, shuffle=True, num_workers=2)]
    torch.manual_seed(0)
    theirs = [b[0].tolist() for b in torch.utils.data.DataLoader(tds, batch_size=8, shuffle=True, num_workers=2)]
    assert ours == theirs

# -- the generic path's messages in torch's words: tools and tests match on them ---------------------
ROOT = Path(__file__).resolve().parent.parent


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
    loader = loader_cls(Slow(0.02, n=400), batch_size=2, num_workers=2)
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


@pytest.mark.timeout(90)  # killed workers and descriptor limits: slower than the rest
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


@pytest.mark.timeout(90)  # killed workers and descriptor limits: slower than the rest
def test_worker_exit_code_message_is_torchs():
    with pytest.raises(RuntimeError, match=r"^DataLoader worker \(pid \d+\) exited unexpectedly with exit code 3\. "
                                           r"Details are lost due to multiprocessing\. Rerunning with num_workers=0 "
                                           r"may give better error trace\."):
        list(fastload.DataLoader(ExitsInWorker(), batch_size=2, num_workers=2))


@pytest.mark.timeout(90)  # killed workers and descriptor limits: slower than the rest
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


@pytest.mark.timeout(90)  # killed workers and descriptor limits: slower than the rest
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
