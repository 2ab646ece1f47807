"""Running the benchmark suite's jobs (bench/suite.py): the machine's description and load, the job runner (one
subprocess per (peer, config) in the peer's venv, re-run once when other tenants disturbed it), the pack case,
the rows the tables are made of, and which peers are installed.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _suite_plan import (BATCH, BATCH_QUICK, BENCH, DATASET_OF, GENERATOR, PACKS, ROOT, VENVS, config_text,
                         loader_jobs, pack_jobs, packed_path, prepare_jobs, source_bytes)
from peers import PEERS

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


# --------------------------------------------------------------------------------------- running

def add_note(res: dict, note: str) -> None:
    res["note"] = "; ".join(x for x in (res.get("note"), note) if x)


class Runner:
    """Runs the suite's jobs, each in its peer's venv as a subprocess (``python -m peers run SPEC``), one at a
    time, watching the CPU that other tenants take meanwhile."""

    def __init__(self, args, sources: dict, available: dict, skipped: dict):
        self.args, self.sources, self.available, self.skipped = args, sources, available, skipped
        self.logs = Path(args.data) / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.jobs_run = 0
        self.reruns = 0
        self.last_background = 0.0
        self.quiet_budget = args.quiet_wait

    def available_reason(self, peer: str) -> str:
        """Why ``peer`` has no rows in this run."""
        return self.skipped.get(peer, "not selected")

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
    """The pack case (timed), or with prepare_only the packs the loader cases need (``needed``) that are missing."""
    args = runner.args
    rows = []
    for peer, cfg in prepare_jobs(needed) if prepare_only else pack_jobs(quick):
        dataset, mode = cfg["dataset"], cfg.get("mode", "")
        canonical = mode in ("", "passthrough")
        if peer not in runner.available:
            if not prepare_only:
                rows.append(skip_row("pack", peer, cfg, runner.available_reason(peer), dataset=dataset))
            continue
        out = packed_path(Path(args.data), peer, dataset, "" if canonical else mode)
        sig = source_sig(args, dataset, sizes)
        if prepare_only and packed_ok(out, sig):
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


def run_loader_case(runner: Runner, case: str, extra: dict) -> list[dict]:
    """A loader case's jobs in table order, each printed as it ends; a row for each (skipped peers' included)."""
    args, rows = runner.args, []
    for peer, cfg in loader_jobs(case, args.quick):
        if peer not in args.peers:
            continue
        if peer not in runner.available:
            rows.append(skip_row(case, peer, cfg, runner.available_reason(peer)))
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

# --------------------------------------------------------------------------------------- peers

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
