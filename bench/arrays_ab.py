"""Issue 32 (raw arrays, tiny records): fastload's fast path with and without its three per-batch savings, in one
process, rounds interleaved, against arrays_bench's in-RAM one-thread gather ceiling (and torch's DataLoader over a
TensorDataset at num_workers=0 for raw), medians of per-round ratios, wall and CPU time (every thread's).

"before" switches off, on the same code: group fills (``fast/group.py``: several cheap batches per fill), the next
epoch's shuffle prepared in a background thread (``Order.prepare``) and huge-page slots (``_ring.huge_empty``).
Wall ratios need a quiet machine; CPU ratios are less sensitive to other tenants (not immune).

    python bench/arrays_ab.py raw|tiny [--rounds 7] [--no-torch] [--data bench/data]
        raw: 1,024 x uint8 3x224x224 + int64 label, batch 64; tiny: 262,144 x int32[64] + int64 label, batch 1024
"""

from __future__ import annotations

import os
import sys
import time
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
    for w in (0, 2):
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
    for w in (0, 2):
        a, b = f"fastload after, num_workers={w}", f"fastload before, num_workers={w}"
        print(f"- num_workers={w}: after / before {ratio(wall, b, a):.2f}x wall, {ratio(cpu, b, a):.2f}x CPU")
        if torch_key in fns:
            print(f"- num_workers={w}: after / torch's num_workers=0 {ratio(wall, torch_key, a):.2f}x wall, "
                  f"{ratio(cpu, torch_key, a):.2f}x CPU (before: {ratio(wall, torch_key, b):.2f}x wall)")


if __name__ == "__main__":
    main()
