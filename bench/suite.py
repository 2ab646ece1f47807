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
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from peers import PEERS  # noqa: E402

VENVS = BENCH / ".venvs"
CASES = ("pack", "photos", "overlap", "raw", "tiny", "varlen")
DATASET_OF = {"photos": "photos", "overlap": "photos", "raw": "raw", "tiny": "tiny", "varlen": "varlen"}
GENERATOR = 1  # bump when the array generators change

SIZES = {  # full run / --quick
    "full": {"per_class": 200, "raw": 4096, "tiny": 65536, "varlen": 32768, "repeat": 3, "min_time": 0.5,
             "max_time": 4.0, "pack_budget": 20.0},
    "quick": {"per_class": 12, "raw": 512, "tiny": 8192, "varlen": 4096, "repeat": 1, "min_time": 0.05,
              "max_time": 2.0, "pack_budget": 0.0},
}
BATCH = {"photos": 64, "overlap": 64, "raw": 256, "tiny": 4096, "varlen": 256}
BATCH_QUICK = {"photos": 32, "overlap": 32, "raw": 64, "tiny": 512, "varlen": 64}  # >= 1 batch per worker

# Which peer packs which dataset (pack case; the loader cases read these outputs).
PACKS = {
    "fastload": ("photos", "raw", "tiny", "varlen"),
    "wds": ("photos", "raw", "tiny", "varlen"),
    "ffcv": ("photos", "raw", "tiny", "varlen"),
    "litdata": ("raw", "tiny", "varlen"),
}


def packed_path(data: Path, peer: str, dataset: str, mode: str = "") -> Path:
    name = dataset + (f"-{mode}" if mode else "")
    return data / peer / (name + ".beton" if peer == "ffcv" else name)


# --------------------------------------------------------------------------------------- jobs

def loader_jobs(case: str, quick: bool) -> list[tuple[str, dict]]:
    """(peer, config) for a loader case, in table order."""
    fl = lambda path, w: ("fastload", {"path": path, "num_workers": w})  # noqa: E731
    if quick:  # a smoke run: every peer once where it is fastest to check, fastload's paths once
        fast, torch2 = fl("fast", 2), ("torch-simd", {"num_workers": 2})
        return {
            "photos": [fast, fl("generic", 2), torch2, ("torch-pillow", {"num_workers": 2}),
                       ("dali", {"num_threads": 2}), ("ffcv", {"num_workers": 2}), ("wds", {"num_workers": 2})],
            "overlap": [fast, torch2],
            "raw": [fast, torch2],
            "tiny": [fast, fl("generic", 2), torch2, ("wds", {"num_workers": 2}), ("ffcv", {"num_workers": 2}),
                     ("litdata", {"num_workers": 2})],
            "varlen": [fast, torch2],
        }[case]
    if case == "photos":
        return [fl("fast", 0), fl("fast", 1), fl("fast", 2), fl("generic", 2),
                *[("torch-simd", {"num_workers": w}) for w in (0, 2, 4)],
                ("torch-simd", {"num_workers": 2, "files": True}),
                ("torch-simd", {"num_workers": 2, "pin_memory": True}),
                *[("torch-pillow", {"num_workers": w}) for w in (0, 2, 4)],
                ("dali", {"num_threads": 1}), ("dali", {"num_threads": 2}),
                ("ffcv", {"num_workers": 1}), ("ffcv", {"num_workers": 2}),
                ("wds", {"num_workers": 2}), ("wds", {"num_workers": 4})]
    if case == "overlap":
        return [fl("fast", 0), fl("fast", 2), fl("generic", 2),
                ("torch-simd", {"num_workers": 0}), ("torch-simd", {"num_workers": 2}),
                ("torch-pillow", {"num_workers": 2}), ("dali", {"num_threads": 2}), ("ffcv", {"num_workers": 2}),
                ("wds", {"num_workers": 2})]
    if case in ("raw", "tiny"):
        return [fl("fast", 0), fl("fast", 2), fl("generic", 2),
                ("torch-simd", {"num_workers": 0, "fetch": "sample"}), ("torch-simd", {"num_workers": 2, "fetch": "sample"}),
                ("torch-simd", {"num_workers": 0, "fetch": "batch"}),
                ("wds", {"num_workers": 0}), ("wds", {"num_workers": 2}),
                ("ffcv", {"num_workers": 1}), ("ffcv", {"num_workers": 2}),
                ("litdata", {"num_workers": 0}), ("litdata", {"num_workers": 2})]
    if case == "varlen":
        return [fl("fast", 0), fl("fast", 2), fl("generic", 2),
                ("torch-simd", {"num_workers": 0}), ("torch-simd", {"num_workers": 2}),
                ("wds", {"num_workers": 2}), ("ffcv", {"num_workers": 2}), ("litdata", {"num_workers": 2})]
    raise ValueError(case)


def pack_jobs(quick: bool) -> list[tuple[str, dict]]:
    jobs = [("fastload", {"dataset": "photos", "mode": "passthrough"}),
            ("fastload", {"dataset": "photos", "mode": "header"}),
            ("fastload", {"dataset": "photos", "mode": "jpeg"}),
            ("wds", {"dataset": "photos"}), ("ffcv", {"dataset": "photos"})]
    for ds in ("raw", "tiny", "varlen"):
        jobs += [("fastload", {"dataset": ds}), ("wds", {"dataset": ds}), ("ffcv", {"dataset": ds}),
                 ("litdata", {"dataset": ds})]
    if quick:
        jobs = [j for j in jobs if j[1]["dataset"] in ("photos", "tiny") and j[1].get("mode", "passthrough") ==
                "passthrough"]
    return jobs


def config_text(peer: str, cfg: dict) -> str:
    parts = []
    for k, v in cfg.items():
        if k == "files":
            parts.append("the generic row's Dataset (no torchvision)")
            continue
        if k in ("dataset",):
            continue
        if k == "path":
            parts.insert(0, f"{v} path")
        elif k == "num_threads":
            parts.append(f"threads={v}")
        elif k == "num_workers":
            parts.append(("threads" if peer == "fastload" and cfg.get("path") == "fast" else "num_workers") + f"={v}")
        elif k == "pin_memory":
            parts.append("pin_memory" if v else "")
        elif k == "fetch":
            parts.append("whole-batch fetch" if v == "batch" else "")
        elif k == "mode":
            parts.append({"passthrough": "JPEG bytes kept (check=decode)", "header": "JPEG bytes kept (check=header)",
                          "jpeg": "re-encode q90"}[v])
        else:
            parts.append(f"{k}={v}")
    return ", ".join(p for p in parts if p)


# --------------------------------------------------------------------------------------- machine

def machine() -> dict:
    def first(path: str, key: str) -> str:
        try:
            for line in open(path):
                if line.startswith(key):
                    return line.split(":", 1)[1].strip().strip('"') if ":" in line else line.split("=", 1)[1].strip().strip('"')
        except OSError:
            pass
        return "?"

    mem = first("/proc/meminfo", "MemTotal")
    try:
        mem_gib = f"{int(mem.split()[0]) / 2**20:.0f} GiB"
    except ValueError:
        mem_gib = mem
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except Exception:
        commit = "?"
    return {
        "cpu": first("/proc/cpuinfo", "model name"),
        "cores": os.cpu_count(),
        "memory": mem_gib,
        "os": first("/etc/os-release", "PRETTY_NAME="),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "commit": commit,
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "gpu": "none (CPU-only run)",
    }


def machine_line(m: dict) -> str:
    return (f"{m['cores']} vCPUs ({m['cpu']}), {m['memory']} RAM, {m['gpu']}, {m['os']}, kernel {m['kernel']}, "
            f"Python {m['python']}, fastload at {m['commit']}, {m['date']}")


def cpu_times() -> tuple[float, float]:
    """(busy, steal) seconds of the whole machine so far, from /proc/stat."""
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq, steal = (v + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) / tick, steal / tick


# --------------------------------------------------------------------------------------- datasets

def generate(data: Path, sizes: dict) -> dict:
    """Build (or reuse) the sources; returns {name: path}."""
    import numpy as np

    from photos import build_photo_folder

    data.mkdir(parents=True, exist_ok=True)
    photos = BENCH / "data" / f"photos_{sizes['per_class']}"
    info = build_photo_folder(photos, per_class=sizes["per_class"], seed=0, progress=False)
    print(f"  photos: {info['count']} JPEGs, {info['total_bytes'] / 1e6:.1f} MB in {photos}"
          f"{' (reused)' if info['reused'] else ''}", flush=True)
    out = {"photos": str(photos)}

    def arrays(name: str, n: int, make) -> None:
        d = data / f"{name}_{n}"
        stamp = d / ".stamp.json"
        want = {"generator": GENERATOR, "n": n}
        if not (stamp.exists() and json.loads(stamp.read_text()) == want):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            t = time.perf_counter()
            total = 0
            for field, arr in make(np.random.default_rng(0), n).items():
                np.save(d / f"{field}.npy", arr)
                total += arr.nbytes
            stamp.write_text(json.dumps(want))
            print(f"  {name}: generated {n:,} samples, {total / 1e6:,.0f} MB in {time.perf_counter() - t:.1f} s",
                  flush=True)
        else:
            total = sum(f.stat().st_size for f in d.glob("*.npy"))
            print(f"  {name}: {n:,} samples, {total / 1e6:,.0f} MB (reused)", flush=True)
        out[name] = str(d)

    arrays("raw", sizes["raw"], lambda rng, n: {
        "images": rng.integers(0, 256, (n, 3, 224, 224), dtype=np.uint8),
        "labels": rng.integers(0, 1000, n, dtype=np.int64)})
    arrays("tiny", sizes["tiny"], lambda rng, n: {
        "tokens": rng.integers(0, 50000, (n, 48), dtype=np.int32),
        "labels": rng.integers(0, 2, n, dtype=np.int64)})

    def varlen(rng, n):
        lengths = rng.integers(16, 513, n)
        lengths[0] = 512  # the longest possible row is present: every format pads to 512
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return {"tokens": rng.integers(0, 50000, int(offsets[-1]), dtype=np.int32), "offsets": offsets,
                "labels": rng.integers(0, 2, n, dtype=np.int64)}

    arrays("varlen", sizes["varlen"], varlen)
    return out


def source_bytes(sources: dict, dataset: str) -> tuple[int, int]:
    """(samples, bytes) of a source dataset."""
    if dataset == "photos":
        stamp = json.loads((Path(sources["photos"]) / ".photos.json").read_text())
        return len(stamp["files"]), sum(r["bytes"] for r in stamp["files"])
    d = Path(sources[dataset])
    n = len(__import__("numpy").load(d / "labels.npy", mmap_mode="r"))
    return n, sum(f.stat().st_size for f in d.glob("*.npy"))


# --------------------------------------------------------------------------------------- running

def add_note(res: dict, note: str) -> None:
    res["note"] = "; ".join(x for x in (res.get("note"), note) if x)


class Runner:
    def __init__(self, args, sources: dict, available: dict):
        self.args, self.sources, self.available = args, sources, available
        self.logs = Path(args.data) / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.jobs_run = 0
        self.reruns = 0
        self.last_background = 0.0
        self.quiet_budget = args.quiet_wait

    def python(self, peer: str) -> str:
        venv = PEERS[peer][1]
        return sys.executable if venv is None else str(VENVS / venv / "bin" / "python")

    def run(self, spec: dict, timeout: float) -> dict:
        """Run one job. After a disturbed job, first wait (within --quiet-wait in all) for other tenants' load to
        pass; re-run a job once (within --max-reruns in all) when they took more than --disturbed cores."""
        if self.last_background > self.args.disturbed:
            self.wait_quiet()
        res = self._run_once(spec, timeout)
        first = res.get("background_cores", 0.0)
        if res.get("status") == "ok" and first > self.args.disturbed and self.reruns < self.args.max_reruns:
            self.reruns += 1
            print(f"      disturbed ({first:.2f} cores taken by others): running it again", flush=True)
            self.wait_quiet()
            again = self._run_once(spec, timeout)
            if again.get("status") == "ok" and again.get("background_cores", 0.0) <= first:
                res = again
                add_note(res, f"re-run: the first run was disturbed by {first:.2f} cores of other load")
            elif again.get("status") == "ok":
                add_note(res, f"ran twice, both disturbed by others ({first:.2f}, {again['background_cores']:.2f} "
                              f"cores): the less disturbed run")
        elif res.get("status") == "ok" and first > self.args.disturbed:
            add_note(res, f"disturbed by {first:.2f} cores of other load (re-run budget spent)")
        self.last_background = res.get("background_cores", 0.0)
        return res

    def wait_quiet(self, per_job: float = 30.0) -> None:
        """Sample the machine in 0.5 s windows until others use less than --disturbed cores (bounded)."""
        t0 = time.perf_counter()
        while self.quiet_budget > 0 and time.perf_counter() - t0 < per_job:
            busy0, steal0 = cpu_times()
            time.sleep(0.5)
            busy1, steal1 = cpu_times()
            self.quiet_budget -= 0.5
            if (busy1 - busy0 + steal1 - steal0) / 0.5 <= self.args.disturbed:
                return

    def _run_once(self, spec: dict, timeout: float) -> dict:
        peer = spec["peer"]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(BENCH)] + ([str(ROOT)] if peer == "fastload" else []))
        env.setdefault("PYTHONWARNINGS", "ignore")
        self.jobs_run += 1
        tag = f"{self.jobs_run:03d}_{spec['case']}_{peer}"
        log = self.logs / f"{tag}.log"
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, dir=self.logs) as fh:
            json.dump(spec, fh)
            spec_path = fh.name
        busy0, steal0 = cpu_times()
        ru0 = os.times()
        t0 = time.perf_counter()
        try:
            with open(log, "w") as out:
                proc = subprocess.run([self.python(peer), "-m", "peers", "run", spec_path], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=out, text=True, timeout=timeout)
            stdout = proc.stdout
            code = proc.returncode
        except subprocess.TimeoutExpired as e:
            stdout, code = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout"
        finally:
            os.unlink(spec_path)
        wall = time.perf_counter() - t0
        ru1 = os.times()
        busy1, steal1 = cpu_times()
        ours = (ru1.children_user - ru0.children_user) + (ru1.children_system - ru0.children_system)
        background = max(0.0, (busy1 - busy0) - ours) + (steal1 - steal0)
        with open(log, "a") as fh:
            fh.write(stdout)
        result = None
        for line in stdout.splitlines():
            if line.startswith("@@RESULT "):
                result = json.loads(line[len("@@RESULT "):])
        if result is None:
            tail = [ln for ln in log.read_text().splitlines() if ln.strip()][-1:] or ["no output"]
            why = "timed out" if code == "timeout" else f"exit {code}"
            return {"status": f"failed ({why}): {tail[0][:200]}", "job_s": wall}
        result["status"] = "ok"
        result["job_s"] = wall
        result["background_cores"] = background / wall if wall > 0 else 0.0
        return result

    def spec(self, peer: str, case: str, cfg: dict, **extra) -> dict:
        data = dict(self.sources)
        ds = DATASET_OF.get(case)
        if ds and peer in PACKS and ds in PACKS[peer]:
            data["packed"] = str(packed_path(Path(self.args.data), peer, ds))
        batch = BATCH_QUICK if self.args.quick else BATCH
        return {"peer": peer, "case": case, "config": cfg, "data": data, "batch_size": batch.get(case),
                "repeat": self.args.repeat, "min_time": self.args.min_time, "max_time": self.args.max_time,
                "seed": 0, **extra}


def stamp_of(out: Path) -> Path:
    return out.with_name(out.name + ".stamp.json")


def packed_ok(out: Path, sig: dict) -> bool:
    st = stamp_of(out)
    return out.exists() and st.exists() and json.loads(st.read_text()) == sig


def source_sig(args, dataset: str, sizes: dict) -> dict:
    n = sizes["per_class"] if dataset == "photos" else sizes[dataset]
    return {"dataset": dataset, "n": n, "generator": GENERATOR}


def run_pack(runner: Runner, sizes: dict, quick: bool, *, prepare_only=False, needed=None) -> list[dict]:
    """The pack case (timed), or with prepare_only the packs the loader cases need that are missing."""
    args = runner.args
    rows = []
    for peer, cfg in pack_jobs(quick):
        dataset, mode = cfg["dataset"], cfg.get("mode", "")
        canonical = mode in ("", "passthrough")
        if peer not in runner.available:
            if not prepare_only:
                rows.append(skip_row("pack", peer, cfg, runner.available_reason(peer), dataset=dataset))
            continue
        out = packed_path(Path(args.data), peer, dataset, "" if canonical else mode)
        sig = source_sig(args, dataset, sizes)
        if prepare_only:
            if not canonical or (peer, dataset) not in needed or packed_ok(out, sig):
                continue
        out.parent.mkdir(parents=True, exist_ok=True)
        stamp_of(out).unlink(missing_ok=True)
        spec = runner.spec(peer, "pack", cfg, out=str(out))
        spec["repeat"] = 1 if prepare_only else args.repeat
        spec["max_seconds"] = sizes["pack_budget"]
        what = f"{peer} {dataset} {config_text(peer, cfg)}".strip()
        print(f"    {'prepare' if prepare_only else 'pack'} {what} ...", end=" ", flush=True)
        res = runner.run(spec, timeout=args.timeout)
        if res["status"] == "ok":
            stamp_of(out).write_text(json.dumps(sig))
            n, nbytes = source_bytes(runner.sources, dataset)
            res.update(samples=n, source_bytes=nbytes, samples_per_s=n / res["seconds"],
                       mb_per_s=nbytes / 1e6 / res["seconds"])
            print(f"{res['seconds']:.2f} s ({res['samples_per_s']:,.0f} samples/s)", flush=True)
        else:
            print(res["status"], flush=True)
        if not prepare_only:
            rows.append(row("pack", peer, cfg, res, dataset=dataset))
    return rows


def skip_row(case, peer, cfg, reason, **extra) -> dict:
    return {"case": case, "peer": peer, "loader": PEERS[peer][2], "config": config_text(peer, cfg),
            "status": f"skipped: {reason}", **extra}


def row(case, peer, cfg, res, **extra) -> dict:
    r = {"case": case, "peer": peer, "loader": PEERS[peer][2], "config": config_text(peer, cfg), **extra}
    keep = ("samples_per_s", "cpu_s_per_sample", "peak_rss_mib", "peak_pss_mib", "first_batch_s", "samples_per_epoch",
            "loop_ms_per_batch", "compute_ms_per_batch", "loop_over_compute", "seconds", "cpu_s", "samples",
            "source_bytes", "mb_per_s", "output_bytes", "background_cores", "job_s", "status", "note", "pipeline")
    r.update({k: res[k] for k in keep if k in res})
    if res.get("partial_epochs"):
        why = "an epoch takes longer than --max-time: repetitions are that many seconds of batches"
        r["note"] = "; ".join(x for x in (r.get("note"), why) if x)
    if "versions" in res:
        r["versions"] = " ".join(f"{k}={v}" for k, v in res["versions"].items())
    return r


def calibrate_compute(target_ms: float) -> dict:
    """(n, k) such that k single-threaded float32 n x n matmuls take about ``target_ms``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        n = 512
        a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
        for _ in range(3):
            torch.mm(a, b, out=c)
        times = []
        for _ in range(15):
            t = time.perf_counter()
            torch.mm(a, b, out=c)
            times.append(time.perf_counter() - t)
        one = statistics.median(times) * 1e3
    finally:
        torch.set_num_threads(threads)
    k = max(1, round(target_ms / one))
    return {"n": n, "k": k, "matmul_ms": one, "target_ms": target_ms}


# --------------------------------------------------------------------------------------- output

def fmt(v, spec: str = ",.0f", missing: str = "") -> str:
    if v is None or v == "" or (isinstance(v, float) and math.isnan(v)):
        return missing
    return format(v, spec)


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


# --------------------------------------------------------------------------------------- main

def check_peers(wanted: list[str], import_check: bool = True) -> tuple[dict, dict]:
    """({peer: versions} that run, {peer: reason} that do not). Without ``import_check`` a set-up venv counts as
    available (its runner reports an import failure as the job's failure)."""
    available, skipped = {}, {}
    for peer in wanted:
        venv = PEERS[peer][1]
        if venv is not None:
            skip = VENVS / f"{venv}.skip"
            if skip.exists():
                skipped[peer] = skip.read_text().strip()
                continue
            if not (VENVS / venv / "bin" / "python").exists():
                skipped[peer] = f"not set up: run `bash bench/setup_peers.sh {venv}`"
                continue
        if not import_check:
            available[peer] = {}
            continue
        py = sys.executable if venv is None else str(VENVS / venv / "bin" / "python")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BENCH)] + ([str(ROOT)] if venv is None else [])),
                   PYTHONWARNINGS="ignore")
        proc = subprocess.run([py, "-m", "peers", "check", peer], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0:
            skipped[peer] = "does not import: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
        else:
            available[peer] = json.loads(proc.stdout.strip().splitlines()[-1])
    return available, skipped


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
    runner = Runner(args, sources, available)
    runner.available_reason = lambda p: skipped.get(p, "not selected")
    context: dict[str, str] = {}
    n_photos, b_photos = source_bytes(sources, "photos")
    context["photos"] = (f"{n_photos:,} JPEGs ({b_photos / 1e6:.1f} MB, bench/photos.py, real photographs), "
                         f"random order, drop_last; median of {args.repeat} repetitions after a warm-up epoch. "
                         f"All data sit in the page cache (warm reads).")
    for ds in ("raw", "tiny", "varlen"):
        n, nb = source_bytes(sources, ds)
        context[ds] = (f"{n:,} samples ({nb / 1e6:,.0f} MB of .npy), random order, drop_last; median of "
                       f"{args.repeat} repetitions after a warm-up epoch, each at least {args.min_time} s of whole "
                       f"epochs. Warm page cache.")
    context["pack"] = (f"Sources: photos {n_photos:,} JPEGs ({b_photos / 1e6:.1f} MB); raw, tiny, varlen as in their "
                       f"cases (.npy, page cache warm). Median of {args.repeat} runs; 2 workers where the writer "
                       f"takes a number.")

    all_md, summary = [], []
    if "pack" in args.cases:
        print("case pack:", flush=True)
        rows = run_pack(runner, sizes, args.quick)
        all_md.append(write_case("pack", rows, out_dir, m, context, batch))
    needed = set()
    for case in args.cases:
        if case != "pack":
            for peer, _ in loader_jobs(case, args.quick):
                if peer in PACKS and DATASET_OF[case] in PACKS[peer]:
                    needed.add((peer, DATASET_OF[case]))
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
            context["overlap"] = (
                f"{n_photos:,} JPEGs, batch {batch['overlap']}. Compute step: {compute['k']} float32 {compute['n']}x{compute['n']} "
                f"matmuls on one intra-op thread (~{compute['k'] * compute['matmul_ms']:.1f} ms), sized to one batch at "
                f"the best photos-case speed of this run ({best_photos:,.0f} img/s = {target:.1f} ms/batch). On 2 "
                f"cores the step takes one: the loader has the other, so a loader that needs less CPU per sample "
                f"hides better. Median of {args.repeat} repetitions after a warm-up epoch.")
        print(f"case {case}:", flush=True)
        t_case = time.perf_counter()
        rows = []
        for peer, cfg in loader_jobs(case, args.quick):
            if peer not in args.peers:
                continue
            if peer not in available:
                rows.append(skip_row(case, peer, cfg, skipped.get(peer, "not selected")))
                continue
            what = f"{PEERS[peer][2]}, {config_text(peer, cfg)}"
            print(f"    {what} ...", end=" ", flush=True)
            spec = runner.spec(peer, case, cfg, **extra)
            res = runner.run(spec, args.timeout)
            if res["status"] == "ok":
                msg = f"{res['samples_per_s']:,.0f} samples/s"
                if case == "overlap":
                    msg = f"loop/compute {res['loop_over_compute']:.2f} ({msg})"
                print(f"{msg} [{res['job_s']:.0f} s]", flush=True)
            else:
                print(res["status"], flush=True)
            rows.append(row(case, peer, cfg, res))
        if case == "photos":
            ok = [r["samples_per_s"] for r in rows if r.get("status") == "ok"]
            best_photos = max(ok) if ok else None
        context[case] = context.get(case, "") + f" Case time {(time.perf_counter() - t_case) / 60:.1f} min."
        text = write_case(case, rows, out_dir, m, context, batch)
        all_md.append(text)
        print("\n" + text, flush=True)

    with open(out_dir / "suite_machine.json", "w") as fh:  # the plots' titles read it
        json.dump({**m, "line": machine_line(m), "quick": args.quick}, fh, indent=1)
    if not args.no_plot:
        print("plots:", flush=True)
        plot(args.cases, out_dir)
    total = time.perf_counter() - t_start
    peers_md = ["## Peers", "", "| peer | status |", "|---|---|"]
    peers_md += [f"| {PEERS[p][2]} | installed: {' '.join(f'{k}={x}' for k, x in v.items())} |"
                 for p, v in available.items()]
    peers_md += [f"| {PEERS[p][2]} | skipped: {why} |" for p, why in skipped.items()]
    head = [f"# fastload benchmark suite{' (quick)' if args.quick else ''}", "",
            f"Machine: {machine_line(m)}. Command: `python bench/suite.py{' --quick' if args.quick else ''}` "
            f"(after `bash bench/setup_peers.sh`); total {total / 60:.1f} min, {runner.jobs_run} jobs; load average "
            f"{os.getloadavg()[0]:.2f} at the end. Shared machine: compare rows of one run only.", ""]
    if set(args.cases) != set(CASES):
        head[-2] += f" This run: {', '.join(args.cases)} (the other sections are from earlier runs)."
    sections = [(out_dir / f"suite_{c}.md").read_text() for c in CASES if (out_dir / f"suite_{c}.md").exists()]
    (out_dir / "suite.md").write_text("\n".join(head + peers_md) + "\n\n" + "\n".join(sections))
    with open(out_dir / "suite_machine.json", "w") as fh:
        json.dump({**m, "line": machine_line(m), "total_s": total, "quick": args.quick}, fh, indent=1)
    print(f"wrote {out_dir}/suite.md and suite_<case>.csv|md|png; total {total / 60:.1f} min", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
