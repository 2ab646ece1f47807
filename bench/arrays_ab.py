"""Issue 32 (raw arrays, tiny records): fastload's fast path with and without its three per-batch savings, in one
process, rounds interleaved, against arrays_bench's in-RAM one-thread gather ceiling (and torch's DataLoader over a
TensorDataset at num_workers=0 for raw), medians of per-round ratios, wall and CPU time (every thread's).

"before" switches off, on the same code: group fills (``fast/group.py``: several cheap batches per fill), the next
epoch's shuffle prepared in a background thread (``Order.prepare``) and huge-page slots (``_ring.huge_empty``).
Wall ratios need a quiet machine; CPU ratios are less sensitive to other tenants (not immune).

    python bench/arrays_ab.py raw|tiny [--rounds 7] [--no-torch] [--data bench/data]
        raw: 1,024 x uint8 3x224x224 + int64 label, batch 64; tiny: 262,144 x int32[64] + int64 label, batch 1024
    python bench/arrays_ab.py raw --ceiling [--rounds 7] [--no-torch]

``--ceiling`` asks what the copy itself allows, in the same rounds as fastload (after) and torch's DataLoader: the
one-copy gather of every batch's rows (a fresh permutation per epoch, one preallocated numpy buffer per column,
numpy's huge pages) by ``np.take(..., mode="clip")`` and by the native ``_C.gather_rows`` (fastload's copy kernel:
streaming stores, one chunk per pool thread), each on 1 and 2 threads, from the arrays in process memory ("RAM")
and from the same mapped shard files fastload reads ("map"). numpy's 2 threads: the calling thread takes the first
half of a batch's rows while one persistent helper thread takes the second (``np.take`` releases the GIL).
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastload  # noqa: E402
import fastload._ring as ring_mod  # noqa: E402
from _common import parser  # noqa: E402
from arrays_bench import ceiling, drain  # noqa: E402
from fastload.fast import group as group_mod  # noqa: E402

CASES = {"raw": (1024, (3, 224, 224), np.uint8, 64), "tiny": (262_144, (64,), np.int32, 1024)}


def data(root: Path, case: str) -> Path:
    n, shape, dtype, _ = CASES[case]
    path = root / f"arrays_ab_{case}"
    if not (path / "manifest.json").exists():
        rng = np.random.default_rng(0)
        high = 255 if dtype == np.uint8 else 50_000
        fastload.pack({"x": rng.integers(0, high, (n,) + shape, dtype=dtype), "label": rng.integers(0, 1000, n)},
                      path)
    return path


def take_ceiling(cols: list, n: int, batch: int, threads: int):
    """np.take of each batch's rows of every column into one buffer per column, on ``threads`` (1 or 2)."""
    outs = [np.empty((batch,) + c.shape[1:], c.dtype) for c in cols]
    helper = ThreadPoolExecutor(1) if threads == 2 else None
    epoch = [0]

    def take(idx, lo, hi):
        for col, out in zip(cols, outs):
            np.take(col, idx[lo:hi], axis=0, out=out[lo:hi], mode="clip")

    def run():
        order = np.random.default_rng(epoch[0]).permutation(n)
        epoch[0] += 1
        half = batch // 2
        for b0 in range(0, n - batch + 1, batch):
            idx = order[b0:b0 + batch]
            if helper is None:
                take(idx, 0, batch)
            else:
                fut = helper.submit(take, idx, half, batch)
                take(idx, 0, half)
                fut.result()

    return run


def native_ceiling(cols: list, n: int, batch: int, threads: int):
    """fastload's native row gather (``_C.gather_rows``) of each batch's rows of every column into one buffer
    per column: ``threads`` 1 is ``Pool(0)`` (the calling thread, as at num_workers=0), 2 is ``Pool(2)`` (the
    batch cut in two chunks, as at num_workers=2; the calling thread waits)."""
    from fastload._native import native

    C = native()
    pool = C.Pool(0 if threads == 1 else threads)
    outs = [np.empty((batch,) + c.shape[1:], c.dtype) for c in cols]
    regions = [[np.asarray(c).reshape(-1).view(np.uint8)] for c in cols]
    row_bytes = [int(np.prod(c.shape[1:])) * c.dtype.itemsize for c in cols]
    zeros = np.zeros(batch, np.int64)
    epoch = [0]

    def run():
        order = np.random.default_rng(epoch[0]).permutation(n)
        epoch[0] += 1
        for b0 in range(0, n - batch + 1, batch):
            idx = order[b0:b0 + batch]
            for reg, rb, out in zip(regions, row_bytes, outs):
                C.gather_rows(pool, reg, zeros, idx * rb, rb, out)

    return run


def ceilings(ds, arrays: dict, batch: int) -> dict:
    """The copy-only rows of ``--ceiling``: {label: one epoch}."""
    (seg,) = ds.reader.segments  # one shard: its mapped columns are the fastload loader's sources
    mapped = [seg.columns[(f.name, "values")] for f in ds.schema]
    ram = [arrays[f.name] for f in ds.schema]
    fns = {}
    for where, cols in (("RAM", ram), ("map", mapped)):
        for threads in (1, 2):
            fns[f"ceiling: np.take, {where}, {threads} thread(s)"] = take_ceiling(cols, len(ds), batch, threads)
            fns[f"ceiling: native gather_rows, {where}, {threads} thread(s)"] = native_ceiling(
                cols, len(ds), batch, threads)
    return fns


def overlap_probe(col: np.ndarray, n: int, batch: int, epochs: int) -> tuple[float, int, float, int]:
    """Whether two threads copy faster than one, measured so that other tenants' preemption does not count: each
    batch's two halves (``np.take`` of 32 rows) are copied either one after the other by one thread or at once by
    two; a half is kept only when its thread ran the whole time (thread CPU / wall > 0.97) and, for the pairs,
    when the two halves overlapped in time for > 90% of the longer one. Returns (bytes/s of a half copied alone,
    halves kept, bytes/s of each half of a simultaneous pair, halves kept): two threads give 2 x pair / alone."""
    import threading

    half = batch // 2
    outs = [np.empty((half,) + col.shape[1:], col.dtype) for _ in range(2)]
    nbytes = half * col[0].nbytes
    res: list = [None, None]
    job: list = [None]
    go, done = threading.Event(), threading.Event()

    def take(k, idx):
        c, t = time.thread_time(), time.perf_counter()
        np.take(col, idx, axis=0, out=outs[k], mode="clip")
        res[k] = (t, time.perf_counter(), time.thread_time() - c)

    def helper():
        while True:
            go.wait()
            go.clear()
            take(1, job[0])
            done.set()

    threading.Thread(target=helper, daemon=True).start()
    alone, pair = [], []
    rng = np.random.default_rng(0)
    for _ in range(epochs):
        order = rng.permutation(n)
        for b in range(n // batch):
            idx = order[b * batch:(b + 1) * batch]
            if b % 2:
                take(0, idx[:half])
                take(1, idx[half:])
                alone += [nbytes / (t1 - t0) for t0, t1, c in res if c > 0.97 * (t1 - t0)]
            else:
                job[0] = idx[half:]
                done.clear()
                go.set()
                take(0, idx[:half])
                done.wait()
                (a0, a1, ca), (b0, b1, cb) = res
                if ca > 0.97 * (a1 - a0) and cb > 0.97 * (b1 - b0) and \
                        min(a1, b1) - max(a0, b0) > 0.9 * max(a1 - a0, b1 - b0):
                    pair += [nbytes / (a1 - a0), nbytes / (b1 - b0)]
    def med(v: list) -> float:
        return float(np.median(v)) if v else float("nan")

    return med(alone), len(alone), med(pair), len(pair)


def loader_run(ds, batch: int, workers: int, before: bool):
    """A drain of one epoch of a fresh loader, warmed up (its slots made) with or without the savings."""
    dl = fastload.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True, seed=0)
    group = group_mod.MAX_GROUP

    def run():
        if before:
            group_mod.MAX_GROUP = 1
        try:
            drain(dl)
        finally:
            group_mod.MAX_GROUP = group

    if before:
        huge = ring_mod.HUGE_FROM
        ring_mod.HUGE_FROM = 1 << 62  # the slots are made in the first epoch
        try:
            run()
        finally:
            ring_mod.HUGE_FROM = huge
        dl._order.prepare = lambda epoch: None
    else:
        run()
    return run


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ceiling", action="store_true",
                    help="the copy alone on 1 and 2 threads, from RAM and from the shard mapping (module docstring)")
    ap.add_argument("--no-torch", action="store_true",
                    help="leave torch's DataLoader out (on a loaded 2-vCPU VM the ceiling ran slower after it)")
    args = ap.parse_args()
    ds = fastload.open(data(args.data, args.case))
    batch = CASES[args.case][3]
    for seg in ds.reader.segments:
        seg.open()
    arrays = {f.name: np.concatenate([np.asarray(s.columns[(f.name, "values")]) for s in ds.reader.segments])
              for f in ds.schema}
    n = (len(ds) // batch) * batch
    fns = {"ceiling: np.take from RAM, 1 thread": ceiling(ds, batch, 1, arrays=arrays)}
    if args.ceiling:
        fns.update(ceilings(ds, arrays, batch))
    for w in (0, 2):
        if not args.ceiling:
            fns[f"fastload before, num_workers={w}"] = loader_run(ds, batch, w, True)
        fns[f"fastload after, num_workers={w}"] = loader_run(ds, batch, w, False)
    torch_key = "torch DataLoader(TensorDataset), num_workers=0"
    # tiny: torch indexes 262,144 rows one by one, seconds a round (arrays_bench has it)
    if args.case == "raw" and not args.no_torch:
        tds = torch.utils.data.TensorDataset(*[torch.from_numpy(a) for a in arrays.values()])
        tdl = torch.utils.data.DataLoader(tds, batch_size=batch, shuffle=True, drop_last=True)
        fns[torch_key] = lambda: drain(tdl)
    for fn in fns.values():
        fn()
    cpu: dict = {k: [] for k in fns}
    wall: dict = {k: [] for k in fns}
    load = os.getloadavg()[0]
    for _ in range(args.rounds):
        for k, fn in fns.items():
            c, t = time.process_time(), time.perf_counter()
            fn()
            cpu[k].append(time.process_time() - c)
            wall[k].append(time.perf_counter() - t)

    def ratio(times, a, b):  # median over rounds of times[a] / times[b]
        return float(np.median([x / y for x, y in zip(times[a], times[b])]))

    top = next(iter(fns))
    print(f"{args.case}, batch {batch}, {n:,} samples an epoch, {args.rounds} interleaved rounds, "
          f"{os.cpu_count()} cores, load average {load:.1f} -> {os.getloadavg()[0]:.1f}\n")
    print("| reader | samples/s (wall) | / ceiling (wall) | samples per CPU-s | / ceiling (CPU) |")
    print("|---|---:|---:|---:|---:|")
    for k in fns:
        print(f"| {k} | {n / np.median(wall[k]):,.0f} | {ratio(wall, top, k):.2f} | {n / np.median(cpu[k]):,.0f} | "
              f"{ratio(cpu, top, k):.2f} |")
    print()
    if args.ceiling:
        (seg,) = ds.reader.segments
        name = next(iter(ds.schema)).name  # the image column
        for where, col in (("RAM", arrays[name]), ("map", seg.columns[(name, "values")])):
            alone, na, pair, npair = overlap_probe(col, len(ds), batch, 10 * args.rounds)
            print(f"- two threads at once, {where}: a half batch alone {alone / 1e9:.1f} GB/s ({na} halves kept), "
                  f"each of two at once {pair / 1e9:.1f} GB/s ({npair} kept): two threads = {2 * pair / alone:.2f}x "
                  "one (unpreempted copies only: overlap_probe)")
    for w in (0, 2):
        a, b = f"fastload after, num_workers={w}", f"fastload before, num_workers={w}"
        if b in fns:
            print(f"- num_workers={w}: after / before {ratio(wall, b, a):.2f}x wall, {ratio(cpu, b, a):.2f}x CPU")
        if torch_key in fns:
            before = f" (before: {ratio(wall, torch_key, b):.2f}x wall)" if b in fns else ""
            print(f"- num_workers={w}: after / torch's num_workers=0 {ratio(wall, torch_key, a):.2f}x wall, "
                  f"{ratio(cpu, torch_key, a):.2f}x CPU{before}")


if __name__ == "__main__":
    main()
