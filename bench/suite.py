"""The benchmark suite: fastload against the data loaders people use, on the same tasks, in one run.

    bash bench/setup_peers.sh          # once: the peers' venvs under bench/.venvs/ (skips what cannot install)
    python bench/suite.py [--quick] [--cases pack photos overlap raw tiny varlen] [--peers ...]

Datasets (generated here, nothing downloaded but the photo wheels bench/photos.py caches):
  photos  the photo ImageFolder (bench/photos.py, real photographs, per class crops: 2,400 JPEGs)
  raw     uint8 3x224x224 arrays + int64 labels (4,096 samples, 617 MB)
  tiny    200-byte records: 48 int32 tokens + an int64 label (65,536 records)
  varlen  token sequences, int32, lengths uniform in [16, 512] (32,768 sequences), padded to 512 when batched

Cases (each in bench/results/suite_<case>.csv | .md | .png, with the machine's description):
  pack     each format's own writer from the same sources: samples/s and MB/s of source (fastload, FFCV,
           WebDataset, LitData); the outputs are the datasets the loader cases read
  photos   JPEG training pipeline: RandomResizedCrop 224 (scale 0.08-1, ratio 3/4-4/3) + horizontal flip,
           uint8 out, batch 64 (fastload fast/generic path, torch DataLoader + pillow-simd / pillow with
           num_workers swept and pin_memory, DALI CPU, FFCV, WebDataset)
  overlap  the photos pipeline feeding a loop whose main thread runs a fixed compute step per batch (single-
           threaded float32 matmuls, GIL released, sized to one batch at the best loader's speed in this run):
           loop time / compute-only time (1.00 = loading fully hidden)
  raw, tiny, varlen   array reading: batch 256 / 4096 / 256 (varlen padded to 512 + lengths)

Every peer runs its own recommended pipeline in its own venv, as a subprocess (bench/peers/): one process per
(peer, config), so peak memory and first-batch time are that configuration's own. Measures (see
bench/peers/_common.py): samples/s (median of --repeat repetitions after a warm-up epoch; a repetition is
whole epochs of at least --min-time seconds, or --max-time seconds of batches where one epoch takes longer),
CPU s per sample
including worker processes, peak RSS and PSS of the process tree, time to first batch; "fastload / this" is
fastload's best configuration divided by the row, from the same run. Every job records the CPU that other
tenants took meanwhile (hypervisor steal + other processes); a job disturbed beyond --disturbed cores runs
again once, and the row says so.

The pieces: _suite_plan.py (cases, jobs, datasets), _suite_run.py (the runner), _suite_report.py (tables, plots).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from _suite_plan import BATCH, BATCH_QUICK, CASES, SIZES, generate, packs_needed, source_bytes  # noqa: E402
from _suite_report import contexts, overlap_context, plot, write_case, write_machine, write_summary  # noqa: E402
from _suite_run import Runner, calibrate_compute, check_peers, machine, machine_line, run_loader_case  # noqa: E402
from _suite_run import run_pack  # noqa: E402
from peers import PEERS  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny datasets, one config per peer (< 2 min)")
    ap.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    ap.add_argument("--peers", nargs="+", choices=list(PEERS), default=list(PEERS))
    ap.add_argument("--repeat", type=int, default=None, help="timed repetitions per job (default 3; quick 1)")
    ap.add_argument("--min-time", type=float, default=None, help="minimum seconds per repetition (whole epochs)")
    ap.add_argument("--max-time", type=float, default=None,
                    help="a repetition stops mid-epoch after this many seconds (default 4; quick 2)")
    ap.add_argument("--data", default=str(BENCH / "data" / "suite"), help="generated and packed datasets")
    ap.add_argument("--out", default=str(BENCH / "results"), help="where suite_<case>.csv|md|png go")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per job")
    ap.add_argument("--disturbed", type=float, default=0.5,
                    help="re-run a job once when other tenants took more than this many cores during it")
    ap.add_argument("--max-reruns", type=int, default=12, help="re-runs of disturbed jobs, in all")
    ap.add_argument("--quiet-wait", type=float, default=180,
                    help="seconds, in all, to wait for other tenants' load to pass before a job after a disturbed one")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args()
    t_start = time.perf_counter()
    sizes = SIZES["quick" if args.quick else "full"]
    args.repeat = args.repeat or sizes["repeat"]
    args.min_time = sizes["min_time"] if args.min_time is None else args.min_time
    args.max_time = sizes["max_time"] if args.max_time is None else args.max_time
    if args.quick:
        args.disturbed = math.inf  # a smoke run: no re-runs, no waiting
        args.data = str(Path(args.data).with_name(Path(args.data).name + "_quick"))
        if args.out == str(BENCH / "results"):
            args.out = str(Path(args.data) / "results")
    out_dir = Path(args.out)
    batch = BATCH_QUICK if args.quick else BATCH
    if "fastload" not in args.peers:
        args.peers.insert(0, "fastload")
    m = machine()
    print(f"fastload benchmark suite{' (quick)' if args.quick else ''}: {machine_line(m)}", flush=True)
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)

    print("peers:", flush=True)
    available, skipped = check_peers(args.peers, import_check=not args.quick)
    for peer, v in available.items():
        print(f"  ok    {peer:13s} {' '.join(f'{k}={x}' for k, x in v.items())}", flush=True)
    for peer, why in skipped.items():
        print(f"  SKIP  {peer:13s} {why}", flush=True)
    if "fastload" not in available:
        print("fastload itself does not import: run `make install` first", file=sys.stderr)
        return 1

    print("datasets:", flush=True)
    sources = generate(Path(args.data), sizes)
    runner = Runner(args, sources, available, skipped)
    context = contexts(sources, args.repeat, args.min_time)

    if "pack" in args.cases:
        print("case pack:", flush=True)
        rows = run_pack(runner, sizes, args.quick)
        write_case("pack", rows, out_dir, m, context, batch)
    needed = packs_needed(args.cases, args.quick)
    if needed:
        run_pack(runner, sizes, args.quick, prepare_only=True, needed=needed)

    best_photos = None
    for case in [c for c in args.cases if c != "pack"]:
        extra = {}
        if case == "overlap":
            if best_photos is None:
                print("  overlap: measuring the photos pipeline's best speed first (fastload, 2 threads)", flush=True)
                res = runner.run(runner.spec("fastload", "photos", {"path": "fast", "num_workers": 2}), args.timeout)
                best_photos = res.get("samples_per_s", 1000.0)
            target = (BATCH_QUICK if args.quick else BATCH)["overlap"] / best_photos * 1e3
            compute = calibrate_compute(target)
            extra["compute"] = {"n": compute["n"], "k": compute["k"]}
            context["overlap"] = overlap_context(source_bytes(sources, "photos")[0], batch["overlap"], compute,
                                                 best_photos, target, args.repeat)
        print(f"case {case}:", flush=True)
        t_case = time.perf_counter()
        rows = run_loader_case(runner, case, extra)
        if case == "photos":
            ok = [r["samples_per_s"] for r in rows if r.get("status") == "ok"]
            best_photos = max(ok) if ok else None
        context[case] = context.get(case, "") + f" Case time {(time.perf_counter() - t_case) / 60:.1f} min."
        text = write_case(case, rows, out_dir, m, context, batch)
        print("\n" + text, flush=True)

    write_machine(out_dir, m, args.quick)
    if not args.no_plot:
        print("plots:", flush=True)
        plot(args.cases, out_dir)
    total = time.perf_counter() - t_start
    write_summary(out_dir, m, args, available, skipped, total, runner.jobs_run)
    write_machine(out_dir, m, args.quick, total_s=total)
    print(f"wrote {out_dir}/suite.md and suite_<case>.csv|md|png; total {total / 60:.1f} min", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
