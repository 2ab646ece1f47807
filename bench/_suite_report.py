"""The benchmark suite's reports (bench/suite.py): per case a CSV and a markdown table with the ratios to fastload,
the plots (bench/plot.py in its own venv), and suite.md, which puts the cases' sections together.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

from _suite_plan import BENCH, CASES, VENVS, source_bytes
from _suite_run import machine_line
from peers import PEERS


def contexts(sources: dict, repeat: int, min_time: float) -> dict[str, str]:
    """The paragraph under each case's title: what was read, and how it was measured."""
    context: dict[str, str] = {}
    n_photos, b_photos = source_bytes(sources, "photos")
    context["photos"] = (f"{n_photos:,} JPEGs ({b_photos / 1e6:.1f} MB, bench/photos.py, real photographs), "
                         f"random order, drop_last; median of {repeat} repetitions after a warm-up epoch. "
                         f"All data sit in the page cache (warm reads).")
    for ds in ("raw", "tiny", "varlen"):
        n, nb = source_bytes(sources, ds)
        context[ds] = (f"{n:,} samples ({nb / 1e6:,.0f} MB of .npy), random order, drop_last; median of "
                       f"{repeat} repetitions after a warm-up epoch, each at least {min_time} s of whole "
                       f"epochs. Warm page cache.")
    context["pack"] = (f"Sources: photos {n_photos:,} JPEGs ({b_photos / 1e6:.1f} MB); raw, tiny, varlen as in their "
                       f"cases (.npy, page cache warm). Median of {repeat} runs; 2 workers where the writer "
                       f"takes a number.")
    return context


def overlap_context(n_photos: int, batch: int, compute: dict, best_photos: float, target: float,
                    repeat: int) -> str:
    return (f"{n_photos:,} JPEGs, batch {batch}. Compute step: {compute['k']} float32 {compute['n']}x{compute['n']} "
            f"matmuls on one intra-op thread (~{compute['k'] * compute['matmul_ms']:.1f} ms), sized to one batch at "
            f"the best photos-case speed of this run ({best_photos:,.0f} img/s = {target:.1f} ms/batch). On 2 "
            f"cores the step takes one: the loader has the other, so a loader that needs less CPU per sample "
            f"hides better. Median of {repeat} repetitions after a warm-up epoch.")


def ratio(v) -> str:
    if v is None or v == "":
        return ""
    return f"{v:,.0f}x" if v >= 100 else f"{v:.1f}x" if v >= 10 else f"{v:.2f}x"


def add_ratios(case: str, rows: list[dict]) -> None:
    ok = [r for r in rows if r.get("status") == "ok"]
    if case == "pack":
        for r in ok:
            ref_mode = "re-encode q90" if (r["peer"] == "ffcv" and r["dataset"] == "photos") else None
            refs = [x for x in ok if x["peer"] == "fastload" and x["dataset"] == r["dataset"]
                    and (ref_mode in x["config"] if ref_mode else "check=header" not in x["config"]
                         and "re-encode" not in x["config"])]
            if refs:
                r["fastload_vs_this"] = r["seconds"] / refs[0]["seconds"]
                r["compared_with"] = "fastload " + (refs[0]["config"] or "default")
        return
    fl = [r for r in ok if r["peer"] == "fastload"]
    if not fl:
        return
    if case == "overlap":
        best = min(r["loop_over_compute"] for r in fl)
        for r in ok:
            r["fastload_vs_this"] = r["loop_over_compute"] / best
    else:
        best = max(r["samples_per_s"] for r in fl)
        for r in ok:
            r["fastload_vs_this"] = best / r["samples_per_s"]


CSV_FIELDS = {
    "loader": ["case", "peer", "loader", "config", "samples_per_s", "fastload_vs_this", "cpu_s_per_sample",
               "peak_rss_mib", "peak_pss_mib", "first_batch_s", "samples_per_epoch", "loop_ms_per_batch",
               "compute_ms_per_batch", "loop_over_compute", "background_cores", "job_s", "status", "pipeline",
               "note", "versions"],
    "pack": ["case", "dataset", "peer", "loader", "config", "seconds", "samples", "samples_per_s", "source_bytes",
             "mb_per_s", "output_bytes", "fastload_vs_this", "compared_with", "cpu_s", "peak_rss_mib",
             "background_cores", "job_s", "status", "pipeline", "note", "versions"],
}

TITLES = {
    "pack": "Pack: each format's writer on the same sources",
    "photos": "JPEG training pipeline: RandomResizedCrop 224 + flip, uint8, batch {b}",
    "overlap": "Overlap: the JPEG pipeline feeding a loop with a fixed compute step per batch (main thread), batch {b}",
    "raw": "Raw uint8 3x224x224 arrays, batch {b}",
    "tiny": "Tiny records (48 int32 tokens + int64 label = 200 bytes), batch {b}",
    "varlen": "Variable-length token sequences (16-512 int32), padded to 512 + lengths, batch {b}",
}


def write_case(case: str, rows: list[dict], out_dir: Path, m: dict, context: dict, batch: dict) -> str:
    add_ratios(case, rows)
    kind = "pack" if case == "pack" else "loader"
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / f"suite_{case}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS[kind], extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()})
    md = [f"## {TITLES[case].format(b=batch.get(case))}", "", f"Machine: {machine_line(m)}.", ""]
    if context.get(case):
        md += [context[case], ""]
    if kind == "pack":
        md += ["| dataset | writer | config | s (median) | samples/s | MB/s of source | output MB | "
               "fastload / this (time) | CPU s | peak RSS MiB |",
               "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            if r.get("status") != "ok":
                md.append(f"| {r.get('dataset', '')} | {r['loader']} | {r['config']} | {r['status']} |  |  |  |  |  |  |")
                continue
            md.append(f"| {r['dataset']} | {r['loader']} | {r['config']} | {r['seconds']:.3f} | "
                      f"{r['samples_per_s']:,.0f} | {r['mb_per_s']:,.1f} | {r['output_bytes'] / 1e6:,.1f} | "
                      f"{ratio(r.get('fastload_vs_this'))} | "
                      f"{r['cpu_s']:.2f} | {r['peak_rss_mib']:,.0f} |")
        md += ["", "fastload / this: the peer's time over fastload's for the same dataset (photos: FFCV is compared "
                   "with fastload's re-encode, the others with its default, JPEG bytes kept); > 1 means fastload "
                   "packs faster."]
    else:
        overlap = case == "overlap"
        head = ("| loader | config | loop / compute | loop ms/batch | compute ms/batch | samples/s | vs fastload best | "
                "CPU ms/sample | peak RSS MiB (PSS) | first batch s |" if overlap else
                "| loader | config | samples/s | fastload best / this | CPU ms/sample | peak RSS MiB (PSS) | "
                "first batch s |")
        md += [head, "|---|---|" + "---:|" * (head.count("|") - 3)]
        for r in rows:
            if r.get("status") != "ok":
                md.append(f"| {r['loader']} | {r['config']} | {r['status']} |" + " |" * (head.count("|") - 4))
                continue
            mem = f"{r['peak_rss_mib']:,.0f} ({r['peak_pss_mib']:,.0f})"
            common = (f"{r['cpu_s_per_sample'] * 1e3:.3f} | {mem} | {r['first_batch_s']:.2f} |")
            rel = ratio(r.get("fastload_vs_this"))
            if overlap:
                md.append(f"| {r['loader']} | {r['config']} | {r['loop_over_compute']:.2f} | "
                          f"{r['loop_ms_per_batch']:.1f} | {r['compute_ms_per_batch']:.1f} | {r['samples_per_s']:,.0f} | "
                          f"{rel} | {common}")
            else:
                md.append(f"| {r['loader']} | {r['config']} | {r['samples_per_s']:,.0f} | {rel} | {common}")
        notes = sorted({f"{r['loader']}, {r['config']}: {r['note']}" for r in rows if r.get("note")})
        if overlap:
            md += ["", "loop / compute: wall time per batch of the training loop over the compute step alone "
                       "(1.00: loading fully hidden). vs fastload best: this loop time over fastload's best."]
        else:
            md += ["", "fastload best / this: fastload's fastest configuration's samples/s over this row's "
                       "(> 1: fastload is faster). CPU includes worker processes; RSS sums the process tree "
                       "(PSS, sampled every 2 s, counts shared pages once)."]
        md += [f"- {n}" for n in notes]
    text = "\n".join(md) + "\n"
    (out_dir / f"suite_{case}.md").write_text(text)
    return text


def plot(cases: list[str], out_dir: Path) -> None:
    py = VENVS / "plot" / "bin" / "python"
    if not py.exists():
        reason = (VENVS / "plot.skip").read_text().strip() if (VENVS / "plot.skip").exists() else \
            "bench/.venvs/plot is not set up (bash bench/setup_peers.sh plot)"
        print(f"  plots skipped: {reason}")
        return
    csvs = [str(out_dir / f"suite_{c}.csv") for c in cases if (out_dir / f"suite_{c}.csv").exists()]
    proc = subprocess.run([str(py), str(BENCH / "plot.py"), *csvs], capture_output=True, text=True, timeout=300)
    print("  " + (proc.stdout.strip().replace("\n", "\n  ") or proc.stderr.strip()[-500:]))


def write_machine(out_dir: Path, m: dict, quick: bool, **extra) -> None:
    """suite_machine.json: the machine's description, which the plots' titles read."""
    with open(out_dir / "suite_machine.json", "w") as fh:
        json.dump({**m, "line": machine_line(m), **extra, "quick": quick}, fh, indent=1)


def write_summary(out_dir: Path, m: dict, args, available: dict, skipped: dict, total: float, jobs: int) -> None:
    """suite.md: the run's heading, the peers' versions or why they were skipped, then every case's section
    (those this run did not measure from earlier runs, as the heading says)."""
    peers_md = ["## Peers", "", "| peer | status |", "|---|---|"]
    peers_md += [f"| {PEERS[p][2]} | installed: {' '.join(f'{k}={x}' for k, x in v.items())} |"
                 for p, v in available.items()]
    peers_md += [f"| {PEERS[p][2]} | skipped: {why} |" for p, why in skipped.items()]
    head = [f"# fastload benchmark suite{' (quick)' if args.quick else ''}", "",
            f"Machine: {machine_line(m)}. Command: `python bench/suite.py{' --quick' if args.quick else ''}` "
            f"(after `bash bench/setup_peers.sh`); total {total / 60:.1f} min, {jobs} jobs; load average "
            f"{os.getloadavg()[0]:.2f} at the end. Shared machine: compare rows of one run only.", ""]
    if set(args.cases) != set(CASES):
        head[-2] += f" This run: {', '.join(args.cases)} (the other sections are from earlier runs)."
    sections = [(out_dir / f"suite_{c}.md").read_text() for c in CASES if (out_dir / f"suite_{c}.md").exists()]
    (out_dir / "suite.md").write_text("\n".join(head + peers_md) + "\n\n" + "\n".join(sections))
