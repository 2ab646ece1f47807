"""Array benchmarks: raw uint8 images (3x224x224) and tiny records (<= 256 bytes), read from a packed
dataset by fastload vs torch's DataLoader over the same data in memory, against the memory-gather
ceiling (a numpy ``take`` of each batch's rows into a preallocated buffer, one copy per row: from the mapped
shards on 1 thread and on all cores, and from the arrays in process memory on 1 thread).
One run, medians over repetitions; random order everywhere.

    python bench/arrays_bench.py [--raw 4096] [--tiny 2000000] [--raw-batch 256] [--tiny-batch 4096]
                                 [--repeat 5] [--csv out.csv]
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastload  # noqa: E402
from _common import median_seconds, parser, write_csv  # noqa: E402


def median_rate(fn, n_samples: int, repeat: int) -> float:
    fn()  # warm-up: page cache, buffers, threads
    return n_samples / median_seconds(fn, repeat)


def drain(loader) -> None:
    for batch in loader:
        del batch


def ceiling(ds, batch: int, threads: int, seed: int = 0, arrays: dict | None = None):
    """numpy take of every batch's rows (random order) into one preallocated buffer per column, one copy per
    row: from the mapped columns of ``ds`` (the page cache, 4 KiB pages), or from ``arrays`` (the same columns
    in process memory, where numpy's large allocations are backed by transparent huge pages: the in-RAM
    ceiling the issue's figures use).

    ``np.take(..., out=)`` is given ``mode="clip"``: numpy buffers ``out`` under the default ``mode="raise"``
    (a second copy: 3.3x slower for 150 KB rows), and ``out[pos] = col.take(loc)`` allocates a fresh array per
    batch and copies twice (this function did that until 2026-11; bench/results/raw_tiny_profile.md compares the two)."""
    if arrays is not None:
        seg_cols = [[np.asarray(arrays[f.name]) for f in ds.schema]]
        starts = np.zeros(1, np.int64)
    else:
        seg_cols = []
        for seg in ds.reader.segments:
            seg.open()
            seg_cols.append([seg.columns[(f.name, "values")] for f in ds.schema])
        starts = ds.reader.starts
    order = np.random.default_rng(seed).permutation(len(ds))
    outs = [np.empty((batch,) + c.shape[1:], c.dtype) for c in seg_cols[0]]

    def gather(idx, lo, hi):
        sid = np.searchsorted(starts, idx, side="right") - 1 if len(starts) > 1 else None
        if sid is None or sid[0] == sid[-1] and (sid == sid[0]).all():  # one segment: straight into the slice
            s = 0 if sid is None else int(sid[0])
            loc = idx - starts[s]
            for col, out in zip(seg_cols[s], outs):
                np.take(col, loc, axis=0, out=out[lo:hi], mode="clip")  # the copy itself releases the GIL
            return
        for s in np.unique(sid):
            pos = np.flatnonzero(sid == s) + lo
            loc = idx[sid == s] - starts[s]
            for col, out in zip(seg_cols[s], outs):
                out[pos] = col.take(loc, axis=0)

    def run():
        for b0 in range(0, len(order) - batch + 1, batch):
            idx = order[b0:b0 + batch]
            if threads == 1:
                gather(idx, 0, batch)
                continue
            cuts = np.linspace(0, batch, threads + 1).astype(int)
            ths = [threading.Thread(target=gather, args=(idx[a:b], a, b)) for a, b in zip(cuts[:-1], cuts[1:])]
            for t in ths:
                t.start()
            for t in ths:
                t.join()

    return run


class BatchFetch(torch.utils.data.Dataset):
    """DataLoader's batched alternative: __getitem__ takes a list of indices (sampler=BatchSampler)."""

    def __init__(self, *tensors):
        self.tensors = tensors

    def __len__(self):
        return len(self.tensors[0])

    def __getitem__(self, idx):
        return tuple(t[idx] for t in self.tensors)


def case(name, arrays, packed, batch, repeat, cores, rows, tiny: bool):
    ds = fastload.open(packed)
    n = (len(ds) // batch) * batch
    res = {}
    for t in sorted({1, cores}):
        res[f"numpy take ceiling, {t} thread(s)"] = median_rate(ceiling(ds, batch, t), n, repeat)
    res["numpy take ceiling from RAM, 1 thread"] = median_rate(ceiling(ds, batch, 1, arrays=arrays), n, repeat)
    for w in sorted({0, 1, cores}):
        dl = fastload.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=w, drop_last=True, seed=0)
        res[f"fastload, num_workers={w}"] = median_rate(lambda: drain(dl), n, repeat)
    tensors = [torch.from_numpy(a) for a in arrays.values()]
    tds = torch.utils.data.TensorDataset(*tensors)
    for w in (0, cores):
        dl = torch.utils.data.DataLoader(tds, batch_size=batch, shuffle=True, num_workers=w, drop_last=True,
                                         persistent_workers=w > 0)
        label = f"torch DataLoader(TensorDataset), num_workers={w}"
        reps = repeat if not tiny or w else 1  # per-sample path on millions of rows: one timed pass
        res[label] = median_rate(lambda: drain(dl), n, reps)
    sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(tds), batch, drop_last=True)
    dl = torch.utils.data.DataLoader(BatchFetch(*tensors), sampler=sampler, batch_size=None)
    res["torch DataLoader, BatchSampler fetching whole batches"] = median_rate(lambda: drain(dl), n, repeat)
    best_fl = max(v for k, v in res.items() if k.startswith("fastload"))
    best_ceiling = max(v for k, v in res.items() if k.startswith("numpy"))
    print(f"\n### {name}\n\n| reader | samples/s | fastload best / this |\n|---|---:|---:|")
    for k, v in res.items():
        print(f"| {k} | {v:,.0f} | {best_fl / v:.2f}x |")
        rows.append((name, k, v))
    print(f"\nfastload best = {best_fl / best_ceiling:.0%} of the best gather ceiling")
    ram = res["numpy take ceiling from RAM, 1 thread"]
    torch0 = res["torch DataLoader(TensorDataset), num_workers=0"]
    for w in sorted({0, 1, cores}):
        fl = res[f"fastload, num_workers={w}"]
        print(f"fastload num_workers={w}: {fl / ram:.0%} of the in-RAM 1-thread ceiling, {fl / torch0:.2f}x torch's "
              f"DataLoader(TensorDataset) at num_workers=0")


def main() -> None:
    ap = parser(__doc__, repeat=5, csv=True)
    ap.add_argument("--raw", type=int, default=4096, help="raw 3x224x224 uint8 samples")
    ap.add_argument("--tiny", type=int, default=2_000_000, help="tiny records (48 int32 tokens + label)")
    ap.add_argument("--raw-batch", type=int, default=256)
    ap.add_argument("--tiny-batch", type=int, default=4096)
    ap.add_argument("--tiny-tokens", type=int, default=48, help="int32 tokens per tiny record (issue 32: 64)")
    args = ap.parse_args()
    if args.raw < args.raw_batch or args.tiny < args.tiny_batch:  # whole batches only (drop_last)
        ap.error(f"--raw {args.raw} / --tiny {args.tiny}: need at least one batch each "
                 f"({args.raw_batch} raw, {args.tiny_batch} tiny)")
    cores = os.cpu_count() or 1
    rng = np.random.default_rng(0)
    rows = []
    print(f"{cores} cores; random order; medians of {args.repeat}; load average {os.getloadavg()[0]:.1f} at the start")

    raw = {"image": rng.integers(0, 255, (args.raw, 3, 224, 224), dtype=np.uint8),
           "label": rng.integers(0, 1000, args.raw)}
    tiny = {"tokens": rng.integers(0, 50000, (args.tiny, args.tiny_tokens), dtype=np.int32),
            "label": rng.integers(0, 2, args.tiny)}
    for name, arrays, batch, is_tiny in ((f"raw uint8 3x224x224, batch {args.raw_batch}", raw, args.raw_batch, False),
                                         (f"tiny records ({4 * args.tiny_tokens + 8} bytes), batch {args.tiny_batch}",
                                          tiny, args.tiny_batch,
                                          True)):
        packed = args.data / ("arrays_raw" if not is_tiny else "arrays_tiny")
        shutil.rmtree(packed, ignore_errors=True)
        t = time.perf_counter()
        fastload.pack(arrays, packed)
        nbytes = sum(a.nbytes for a in arrays.values())
        print(f"\npacked {name.split(',')[0]}: {nbytes / 1e6:,.0f} MB in {time.perf_counter() - t:.2f} s")
        case(name, arrays, packed, batch, args.repeat, cores, rows, is_tiny)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    write_csv(args.csv, rows, ["case", "reader", "samples_per_s"])


if __name__ == "__main__":
    main()
