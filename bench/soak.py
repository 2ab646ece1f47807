"""Soak: many epochs over a small dataset on every loader path, sampling this process after each epoch.

    python bench/soak.py                      # 50 epochs per path, photos-like JPEG dataset built in a temp dir
    python bench/soak.py --epochs 200 --csv soak.csv

Paths: the fast path over shards and over LMDB (native decode threads), and the generic path (worker
processes writing into shared-memory slots). After each epoch: resident memory (RSS), open descriptors,
OS threads, child processes and this process's /dev/shm entries. The run passes when, after the first
epoch, RSS stays within 5% of its smallest value and descriptors, threads, children and /dev/shm entries do
not change; it exits 1 naming the path and figure otherwise.
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
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402

TOLERANCE = 0.05


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
    return {"rss_mb": rss / 2**20, "fds": len(os.listdir("/proc/self/fd")),
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


def build(root: Path, n: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(n):
        d = root / "src" / f"class_{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        h, w = (int(x) for x in rng.integers(96, 200, 2))
        small = rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
        Image.fromarray(small).resize((w, h), Image.BILINEAR).save(d / f"{i:04d}.jpg", quality=85)
    fastload.pack(root / "src", root / "shards", shard_size="64K", workers=0)
    fastload.pack(root / "src", root / "lmdb", format="lmdb", workers=0)


def loader_for(path: str, root: Path, workers: int, batch: int):
    if path == "generic":
        return fastload.DataLoader(Pictures(), batch_size=batch, shuffle=True, num_workers=workers)
    ds = fastload.open(root / path.split("-")[1],
                       transforms={"image": [T.RandomResizedCrop(64), T.RandomHorizontalFlip()]})
    return fastload.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, seed=0)


def soak(path: str, root: Path, epochs: int, workers: int, batch: int, rows: list) -> list[str]:
    loader = loader_for(path, root, workers, batch)
    series = []
    t0 = time.perf_counter()
    for epoch in range(epochs):
        n = 0
        for images, labels in loader:
            n += len(labels)
        del images, labels
        gc.collect()
        s = sample()
        s.update(path=path, epoch=epoch, samples=n, seconds=round(time.perf_counter() - t0, 3))
        series.append(s)
        rows.append(s)
    del loader
    gc.collect()
    rest = series[1:]
    rss = [s["rss_mb"] for s in rest]
    lo, hi = min(rss), max(rss)
    problems = []
    if hi > lo * (1 + TOLERANCE):
        problems.append(f"{path}: RSS grew from {lo:.1f} to {hi:.1f} MB ({(hi / lo - 1) * 100:.1f}%) after epoch 1")
    for key in ("fds", "threads", "children", "shm"):
        values = sorted({s[key] for s in rest})
        if len(values) > 1:
            problems.append(f"{path}: {key} changed after epoch 1: {values}")
    first = series[0]
    print(f"{path:12s} {epochs} epochs x {first['samples']} samples in {series[-1]['seconds']:.1f} s | "
          f"RSS MB: epoch 1 {first['rss_mb']:.1f}, then {lo:.1f}..{hi:.1f} ({(hi / lo - 1) * 100:.2f}% spread), "
          f"last {rss[-1]:.1f} | fds {first['fds']} -> {sorted({s['fds'] for s in rest})} | "
          f"threads {first['threads']} -> {sorted({s['threads'] for s in rest})} | "
          f"children {sorted({s['children'] for s in rest})} | shm {sorted({s['shm'] for s in rest})}", flush=True)
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--samples", type=int, default=256, help="JPEGs in the packed dataset")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--paths", default="fast-shards,fast-lmdb,generic")
    ap.add_argument("--csv", default=None, help="write every sample to this CSV file")
    a = ap.parse_args(argv)
    rows: list = []
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="fastload-soak-") as tmp:
        root = Path(tmp)
        build(root, a.samples)
        print(f"soak: {a.epochs} epochs per path, {a.samples} samples, num_workers={a.workers}, "
              f"batch_size={a.batch_size}, pid {os.getpid()}", flush=True)
        for path in a.paths.split(","):
            problems += soak(path, root, a.epochs, a.workers, a.batch_size, rows)
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
