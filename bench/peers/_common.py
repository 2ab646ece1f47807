"""The measurement harness every peer runner shares (standard library + numpy; torch only when asked).

A runner gets a *spec* (JSON written by ``bench/suite.py``)::

    {"peer": "torch-simd", "case": "photos" | "overlap" | "raw" | "tiny" | "varlen" | "pack",
     "config": {...peer options, e.g. "num_workers": 2...},
     "data": {"photos": DIR, "raw": DIR, ...,            # the generated sources (see suite.py)
              "packed": PATH},                           # this peer's own packed copy, if it has one
     "batch_size": 64, "repeat": 3, "min_time": 0.5, "seed": 0,
     "compute": null | {"n": 512, "k": 6}}               # overlap: k float32 (n x n) matmuls per batch

and returns what :func:`measure_loader` (or :func:`measure_pack`) returns. Measures:

* **samples/s**: samples of every timed repetition over its wall time; a repetition runs whole epochs until
  ``min_time`` has passed (so a 20 ms epoch is timed over many epochs), or ``max_time`` seconds of batches
  when an epoch takes longer. Median of ``repeat`` repetitions, after one warm-up epoch (or ``max_time``).
  The repetitions are consecutive windows of one continuous stream of epochs (no restart between them).
* **CPU s/sample**: user + system CPU of the runner *and all its descendants* (worker processes), from
  ``/proc/<pid>/stat`` (utime + stime + the reaped children's cutime + cstime), over the same repetitions.
* **peak RSS**: the largest sum of RSS over the process tree, sampled every 50 ms from the loader's
  construction on (shared pages are counted once per process that maps them, as top would add them up);
  also the peak of the tree's summed PSS (shared pages split between the processes that map them).
* **first batch s**: from building the loader (dataset object included) to the first batch in hand.
* **overlap** (``compute`` given): the main thread runs ``k`` single-threaded float32 matmuls per batch
  (the GIL is released inside); the result is the loop time per batch over the compute-only time per
  batch measured in the same process, before the loader exists.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from typing import Any, Callable, Iterable

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


# ------------------------------------------------------------------------------- process tree

def _stat(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return data.rsplit(b")", 1)[1].split()  # fields from 'state' on (field 3 of proc(5))


def tree_pids(root: int | None = None) -> list[int]:
    """``root`` (default: this process) and all its live descendants."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            f = _stat(int(name))
            if f is not None:
                children.setdefault(int(f[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def tree_cpu(root: int | None = None) -> float:
    """CPU seconds (user + system) used so far by ``root`` and its descendants, the reaped ones included."""
    total = 0
    for pid in tree_pids(root):
        f = _stat(pid)
        if f is not None:  # utime stime cutime cstime are fields 14-17 of proc(5)
            total += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
    return total / _TICK


def _rss(pids: Iterable[int]) -> int:
    """Summed RSS in bytes over ``pids``, from ``/proc/PID/statm``: the kernel's counters, O(1) per process."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as fh:
                total += int(fh.read().split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            continue
    return total


def _pss(pids: Iterable[int]) -> int:
    """Summed PSS in bytes over ``pids``. ``smaps_rollup`` walks every page table of the process (20-30 ms
    for a loader with a few GB mapped, holding its mmap lock), so it is read rarely."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
                for line in fh:
                    if line.startswith(b"Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError, IndexError):
            continue
    return total


class PeakMemory:
    """Samples the process tree's summed RSS every ``interval`` seconds in a daemon thread, and its summed
    PSS every ``pss_interval`` seconds and at the end (PSS costs the measured processes time: see ``_pss``).
    Sampling a 3-process tree this way costs well under 1% of a core."""

    def __init__(self, interval: float = 0.05, pss_interval: float = 2.0):
        self.interval, self.pss_interval = interval, pss_interval
        self.peak_rss = self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="peak-memory", daemon=True)

    def _loop(self) -> None:
        last_pss = last_tree = time.monotonic()
        pids = tree_pids()
        while True:
            now = time.monotonic()
            if now - last_tree >= 0.5:  # listing /proc costs ~1-2 ms: the tree is re-read twice a second
                pids, last_tree = tree_pids(), now
            pss = now - last_pss >= self.pss_interval
            self.sample(pids, pss=pss)
            if pss:
                last_pss = now
            if self._stop.wait(self.interval):
                return

    def sample(self, pids: list[int] | None = None, pss: bool = True) -> None:
        pids = tree_pids() if pids is None else pids
        self.peak_rss = max(self.peak_rss, _rss(pids))
        if pss:
            self.peak_pss = max(self.peak_pss, _pss(pids))

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


# ------------------------------------------------------------------------------- compute step

def make_compute(compute: dict | None) -> Callable[[], None] | None:
    """The overlap case's training step: ``k`` float32 (n x n) matmuls on one intra-op thread."""
    if not compute:
        return None
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    n, k = int(compute["n"]), int(compute["k"])
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    c = torch.empty(n, n)

    def step() -> None:
        for _ in range(k):
            torch.mm(a, b, out=c)

    return step


def compute_only_seconds(step: Callable[[], None], batches: int, repeat: int) -> float:
    """Median wall seconds per step over ``repeat`` runs of ``batches`` steps (after one warm-up step)."""
    step()
    per = []
    for _ in range(max(1, repeat)):
        t = time.perf_counter()
        for _ in range(batches):
            step()
        per.append((time.perf_counter() - t) / batches)
    return statistics.median(per)


# ------------------------------------------------------------------------------- loaders

_EPOCH_END = object()


def measure_loader(make_loader: Callable[[], Any], epoch: Callable[[Any, int], Iterable],
                   count: Callable[[Any], int], spec: dict, close: Callable[[Any], None] | None = None) -> dict:
    """Time a loader: warm-up epoch (first batch timed from ``make_loader()``), then ``repeat`` repetitions.

    ``epoch(loader, e)`` iterates epoch ``e``'s batches; ``count(batch)`` returns the batch's sample count
    (and touches the batch). With ``spec["compute"]`` the compute step runs after every batch.

    The loader runs as one continuous stream of epochs, as in training; the warm-up and the repetitions are
    consecutive windows of it. A window ends at the first epoch end after ``min_time`` seconds, or after
    ``max_time`` seconds mid-epoch (a slow loader's window is then ``max_time`` seconds of batches, and the
    next window goes on with the same epoch: no iterator is restarted for the measurement).
    """
    repeat, min_time = int(spec.get("repeat", 3)), float(spec.get("min_time", 0.5))
    max_time = float(spec.get("max_time", math.inf))
    step = make_compute(spec.get("compute"))
    result: dict[str, Any] = {}
    if step:  # the compute-only baseline, before any loader thread or worker exists
        result["compute_ms_per_batch"] = compute_only_seconds(step, 30, repeat) * 1e3

    def stream(loader):
        e = 0
        while True:
            yield from epoch(loader, e)
            yield _EPOCH_END
            e += 1

    def window(batches, first_window: bool = False) -> dict:
        """Consume one window; returns its samples, batches, wall and tree CPU seconds."""
        c0, w0 = tree_cpu(), time.perf_counter()
        n = nb = 0
        for batch in batches:
            if batch is _EPOCH_END:
                if first_window or time.perf_counter() - w0 >= min_time:
                    break
                continue
            n += count(batch)
            nb += 1
            del batch
            if step:
                step()
            if time.perf_counter() - w0 >= max_time:
                result["partial_epochs"] = True
                break
        return {"samples": n, "batches": nb, "wall_s": time.perf_counter() - w0, "cpu_s": tree_cpu() - c0}

    with PeakMemory() as mem:
        t0 = time.perf_counter()
        loader = make_loader()
        batches = stream(loader)
        first = next(batches)
        result["first_batch_s"] = time.perf_counter() - t0
        n = count(first)
        del first
        if step:
            step()
        warm = window(batches, first_window=True)
        if not result.get("partial_epochs"):
            result["samples_per_epoch"] = n + warm["samples"]
            result["batches_per_epoch"] = 1 + warm["batches"]
        reps = [window(batches) for _ in range(repeat)]
        batches.close()
        del batches
        if close is not None:
            close(loader)
    del loader
    result["reps"] = reps
    result["samples_per_s"] = statistics.median(r["samples"] / r["wall_s"] for r in reps)
    result["cpu_s_per_sample"] = statistics.median(r["cpu_s"] / r["samples"] for r in reps)
    result["peak_rss_mib"] = mem.peak_rss / 2**20
    result["peak_pss_mib"] = mem.peak_pss / 2**20
    if step:
        per_batch = statistics.median(r["wall_s"] / r["batches"] for r in reps)
        result["loop_ms_per_batch"] = per_batch * 1e3
        result["loop_over_compute"] = result["loop_ms_per_batch"] / result["compute_ms_per_batch"]
    return result


# ------------------------------------------------------------------------------- packing

def measure_pack(pack_once: Callable[[str], dict | None], out: str, spec: dict) -> dict:
    """Run ``pack_once(out)`` up to ``repeat`` times (``out`` removed before each), median wall and CPU time.

    Repetitions stop early once ``max_seconds`` have been spent (at least one run): a 30 s pack is measured
    once. The last run's output stays in ``out`` (the loader cases read it). ``pack_once`` may return extra
    fields (e.g. a note); the output's size on disk is measured here.
    """
    repeat, budget = int(spec.get("repeat", 3)), float(spec.get("max_seconds", math.inf))
    times, cpus, extra = [], [], {}
    with PeakMemory() as mem:
        while len(times) < max(1, repeat) and (not times or sum(times) < budget):
            _remove(out)
            c0, t0 = tree_cpu(), time.perf_counter()
            extra = pack_once(out) or {}
            times.append(time.perf_counter() - t0)
            cpus.append(tree_cpu() - c0)
    return {"seconds": statistics.median(times), "cpu_s": statistics.median(cpus), "all_seconds": times,
            "output_bytes": disk_bytes(out), "peak_rss_mib": mem.peak_rss / 2**20,
            "peak_pss_mib": mem.peak_pss / 2**20, **extra}


def _remove(path: str) -> None:
    import shutil

    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def disk_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for dirpath, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    return total


# ------------------------------------------------------------------------------- sources

def load_arrays(directory: str, mmap: bool = True) -> dict:
    """The generated array dataset in ``directory`` (``*.npy``), memory-mapped by default."""
    import numpy as np

    return {name[:-4]: np.load(os.path.join(directory, name), mmap_mode="r" if mmap else None)
            for name in sorted(os.listdir(directory)) if name.endswith(".npy")}


def image_files(root: str) -> tuple[list[str], list[int], list[str]]:
    """ImageFolder listing (torchvision's order): (paths, labels, classes)."""
    classes = sorted(d.name for d in os.scandir(root) if d.is_dir())
    paths, labels = [], []
    for label, cls in enumerate(classes):
        for name in sorted(os.listdir(os.path.join(root, cls))):
            if name.lower().endswith((".jpg", ".jpeg")):
                paths.append(os.path.join(root, cls, name))
                labels.append(label)
    return paths, labels, classes


def shards_for(n_samples: int, workers: int = 2, per_worker: int = 4) -> int:
    """Shard count for sharded formats: enough that every worker gets several (8 for 2 workers)."""
    return max(1, min(n_samples, workers * per_worker))


# ------------------------------------------------------------------------------- crops

def rrc_params(width: int, height: int, rng, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` (top, left, h, w), for venvs without torchvision."""
    import math

    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def import_torchvision():
    """``torchvision``, or None. PyPI's torchvision wheel is the CUDA build: with the CPU torch its compiled
    ops do not register and ``import torchvision`` fails registering their meta kernels. Its PIL transforms
    and ``ImageFolder`` use none of them, so the import is retried without ``_meta_registrations``."""
    import sys
    import types
    import warnings

    try:
        import torchvision

        return torchvision
    except Exception:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
    sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchvision
            from torchvision import datasets, transforms  # noqa: F401
        return torchvision
    except Exception:
        return None


def pil_train_transform(size: int = 224, use_torchvision: bool = True):
    """The torch user's JPEG training transform on PIL images, returning a uint8 (3, H, W) tensor:
    torchvision's ``Compose([RandomResizedCrop(size), RandomHorizontalFlip(), PILToTensor()])`` when
    torchvision imports (and ``use_torchvision``), else the same algorithm written out (crop, BILINEAR
    resize, flip). Returns (transform, description)."""
    tv = import_torchvision() if use_torchvision else None
    if tv is not None:
        from torchvision import transforms as TV

        return (TV.Compose([TV.RandomResizedCrop(size), TV.RandomHorizontalFlip(), TV.PILToTensor()]),
                f"torchvision {tv.__version__} transforms")
    import random

    import numpy as np
    import torch
    from PIL import Image

    def transform(img):
        top, left, h, w = rrc_params(img.width, img.height, random)
        img = img.resize((size, size), Image.BILINEAR, box=(left, top, left + w, top + h))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1)

    return transform, "torchvision's RandomResizedCrop algorithm written out with PIL"


def pad_collate(max_len: int):
    """Collate (tokens, label) samples into (B, max_len) int32 zero-padded tokens, lengths, labels."""
    import torch

    def collate(samples):
        tokens = torch.zeros(len(samples), max_len, dtype=torch.int32)
        lengths = torch.empty(len(samples), dtype=torch.int64)
        labels = torch.empty(len(samples), dtype=torch.int64)
        for j, (t, y) in enumerate(samples):
            t = torch.as_tensor(t)
            tokens[j, :len(t)] = t
            lengths[j] = len(t)
            labels[j] = int(y)
        return tokens, lengths, labels

    return collate


def versions(*modules: str) -> dict:
    import importlib

    out = {}
    for m in modules:
        try:
            out[m] = getattr(importlib.import_module(m), "__version__", "?")
        except Exception as e:  # pragma: no cover - reported, not fatal
            out[m] = f"unavailable ({type(e).__name__})"
    return out
