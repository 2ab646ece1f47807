"""Soak: many epochs over a small dataset on every loader path, sampling this process after each epoch.

    python bench/soak.py                      # 50 epochs per path, photos-like JPEG dataset built in a temp dir
    python bench/soak.py --epochs 200 --csv soak.csv

Paths: the fast path over shards and over LMDB (native decode threads), and the generic path (worker
processes writing into shared-memory slots), its workers started per epoch and persistent. After each epoch: this process's resident memory (RSS), the PSS
and USS of the whole process tree (this process and every worker, from /proc/PID/smaps_rollup: see
bench/memory_bench.py), open descriptors, OS threads, child processes and this process's /dev/shm entries.
The run passes when, after the first epoch, RSS stays within 5% of its smallest value, the tree's PSS of
anonymous and shared memory (Pss_Anon + Pss_Shmem: what the tree allocates; the file-backed rest, shared
libraries and mapped shards, is clean page cache, and its PSS share moves whenever *other* processes on the
machine map the same libraries) at no later epoch end exceeds epoch 1's by more than ``PSS_TOLERANCE`` (2% of
it, and at least 2 MiB, the noise of an allocator), and descriptors, threads, children and /dev/shm entries do not change; it exits 1 naming the
path and figure otherwise. ``--leak`` keeps every batch (a leak put in on purpose: the run must fail).
"""

from __future__ import annotations

import argparse
import csv
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import numpy as np  # noqa: E402
import torch  # noqa: E402

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402
from memory_bench import tree  # noqa: E402

TOLERANCE = 0.05  # RSS of this process: spread after epoch 1
PSS_TOLERANCE = (0.02, 2 * 2**20)  # tree PSS: growth over epoch 1's end allowed, (fraction, at least bytes)


def pss_allowance(first: float) -> float:
    """Bytes the tree's anonymous + shared-memory PSS may exceed ``first`` (its value at the end of epoch 1) by at
    later epoch ends."""
    return max(PSS_TOLERANCE[0] * first, PSS_TOLERANCE[1])


def sample() -> dict:
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    kids = set()
    for task in os.listdir("/proc/self/task"):
        try:
            kids.update(Path(f"/proc/self/task/{task}/children").read_text().split())
        except OSError:
            pass
    shm = [n for n in os.listdir("/dev/shm") if str(os.getpid()) in n or "fastload" in n]
    t = tree(os.getpid())
    return {"rss_mb": rss / 2**20, "pss_mb": t["pss"] / 2**20, "uss_mb": t["uss"] / 2**20,
            "owned_mb": (t["anon"] + t["shmem"]) / 2**20,
            "fds": len(os.listdir("/proc/self/fd")),
            "threads": len(os.listdir("/proc/self/task")), "children": len(kids), "shm": len(shm)}


class Pictures(torch.utils.data.Dataset):
    """Any dataset (the generic path): decoded uint8 pictures and labels."""

    def __init__(self, n: int = 256, side: int = 64):
        rng = np.random.default_rng(0)
        self.images = rng.integers(0, 256, (n, 3, side, side), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i):
        return torch.from_numpy(self.images[i]).float().div(255), i % 10


def build(root: Path, n: int, formats: tuple = ("shards", "lmdb")) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(n):
        d = root / "src" / f"class_{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        h, w = (int(x) for x in rng.integers(96, 200, 2))
        small = rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
        Image.fromarray(small).resize((w, h), Image.BILINEAR).save(d / f"{i:04d}.jpg", quality=85)
    if "shards" in formats:
        fastload.pack(root / "src", root / "shards", shard_size="64K", workers=0)
    if "lmdb" in formats:
        fastload.pack(root / "src", root / "lmdb", format="lmdb", workers=0)


def loader_for(path: str, root: Path, workers: int, batch: int):
    if path in ("generic", "generic-persistent"):  # persistent: the workers' memory is in every epoch-end sample
        return fastload.DataLoader(Pictures(), batch_size=batch, shuffle=True, num_workers=workers,
                                   persistent_workers=path == "generic-persistent")
    ds = fastload.open(root / path.split("-")[1],
                       transforms={"image": [T.RandomResizedCrop(64), T.RandomHorizontalFlip()]})
    return fastload.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, seed=0)


def soak(path: str, root: Path, epochs: int, workers: int, batch: int, rows: list,
         keep: list | None = None) -> list[str]:
    """``epochs`` epochs of ``path``'s loader, sampled after each (appended to ``rows``); what was not flat.
    ``keep``: every batch is appended to it (a leak put in on purpose)."""
    loader = loader_for(path, root, workers, batch)
    series = []
    t0 = time.perf_counter()
    for epoch in range(epochs):
        n = 0
        for images, labels in loader:
            n += len(labels)
            if keep is not None:
                keep.append(images)
        del images, labels
        gc.collect()
        s = sample()
        s.update(path=path, epoch=epoch, samples=n, seconds=round(time.perf_counter() - t0, 3))
        series.append(s)
        rows.append(s)
    del loader
    gc.collect()
    return verdict(path, series)


def verdict(path: str, series: list[dict]) -> list[str]:
    """What was not flat after the first epoch in ``series`` (one sample per epoch end), printed in one line."""
    rest = series[1:]
    rss = [s["rss_mb"] for s in rest]
    lo, hi = min(rss), max(rss)
    problems = []
    if hi > lo * (1 + TOLERANCE):
        problems.append(f"{path}: RSS grew from {lo:.1f} to {hi:.1f} MB ({(hi / lo - 1) * 100:.1f}%) after epoch 1")
    first = series[0]
    pss_hi = max(s["pss_mb"] for s in rest)
    owned_hi = max(s["owned_mb"] for s in rest)
    allowed = pss_allowance(first["owned_mb"] * 2**20) / 2**20
    if owned_hi - first["owned_mb"] > allowed:
        problems.append(f"{path}: the process tree's PSS grew: its anonymous + shared memory from "
                        f"{first['owned_mb']:.1f} MiB at the end of epoch 1 to {owned_hi:.1f} MiB "
                        f"(+{owned_hi - first['owned_mb']:.1f} MiB; {allowed:.1f} MiB allowed)")
    for key in ("fds", "threads", "children", "shm"):
        values = sorted({s[key] for s in rest})
        if len(values) > 1:
            problems.append(f"{path}: {key} changed after epoch 1: {values}")
    print(f"{path:12s} {len(series)} epochs x {first['samples']} samples in {series[-1]['seconds']:.1f} s | "
          f"RSS MB: epoch 1 {first['rss_mb']:.1f}, then {lo:.1f}..{hi:.1f} ({(hi / lo - 1) * 100:.2f}% spread), "
          f"last {rss[-1]:.1f} | tree PSS MiB: epoch 1 {first['pss_mb']:.1f}, max after {pss_hi:.1f}, last "
          f"{rest[-1]['pss_mb']:.1f} (USS {rest[-1]['uss_mb']:.1f}); anon + shmem: epoch 1 {first['owned_mb']:.1f}, "
          f"max after {owned_hi:.1f} | "
          f"fds {first['fds']} -> {sorted({s['fds'] for s in rest})} | "
          f"threads {first['threads']} -> {sorted({s['threads'] for s in rest})} | "
          f"children {sorted({s['children'] for s in rest})} | shm {sorted({s['shm'] for s in rest})}", flush=True)
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--samples", type=int, default=256, help="JPEGs in the packed dataset")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--paths", default="fast-shards,fast-lmdb,generic,generic-persistent")
    ap.add_argument("--csv", default=None, help="write every sample to this CSV file")
    ap.add_argument("--leak", action="store_true", help="keep every batch (a leak on purpose: the run must fail)")
    a = ap.parse_args(argv)
    rows: list = []
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="fastload-soak-") as tmp:
        root = Path(tmp)
        build(root, a.samples)
        print(f"soak: {a.epochs} epochs per path, {a.samples} samples, num_workers={a.workers}, "
              f"batch_size={a.batch_size}, pid {os.getpid()}", flush=True)
        for path in a.paths.split(","):
            problems += soak(path, root, a.epochs, a.workers, a.batch_size, rows, keep=[] if a.leak else None)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    for p in problems:
        print("NOT FLAT:", p)
    print("soak: flat" if not problems else f"soak: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
