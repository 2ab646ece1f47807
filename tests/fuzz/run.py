"""Run the fuzz targets of targets.py: many inputs, on demand (``make fuzz``).

    python tests/fuzz/run.py --target each            # every target, 1,000,000 inputs in all
    python tests/fuzz/run.py --target jpeg --runs 200000 --jobs 2
    python tests/fuzz/run.py --engine random --runs 20000  # no atheris: seeded mutations, outcome-guided

Engines (default: atheris where installed, random for the jpeg target):
  atheris  coverage-guided: libFuzzer driving the instrumented Python readers, where every structural check
           lives. The native module and libjpeg carry no coverage instrumentation, so native paths get
           mutated inputs without native feedback (for jpeg the corpus would shrink to non-JPEGs: it uses
           random). One process per job, each ``--runs / --jobs`` inputs, sharing one corpus directory under
           build/fuzz/corpus/TARGET; crashing inputs land in build/fuzz/findings/.
  random   no dependency: byte-level and JSON-token mutations of the seeds; an input whose outcome (which
           error, which message shape) is new joins the pool it mutates. Findings are saved the same way.

Under ``scripts/sanitize.sh``'s environment the targets run against the ASan + UBSan build.

Exit status 1 when anything was found. The summary line gives inputs, seconds and inputs per second.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import random
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # a fallback for a checkout without an install; PYTHONPATH still wins
OUT = ROOT / "build" / "fuzz"
HANG_S = 60  # an input running longer than this is a hang: the process dumps its stack and exits

INTERESTING = [0, 1, 2, 3, 7, 8, 63, 64, 127, 128, 255, 256, 4095, 4096, 65535, 65536, (1 << 31) - 1, 1 << 31,
               (1 << 32) - 1, 1 << 32, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, (1 << 64) - 8]
JSON_TOKENS = [b"-1", b"0", b"1", b"2", b"1e309", b"-0.0", b"18446744073709551616", b"9223372036854775807",
               b"null", b"true", b"[]", b"{}", b'""', b'"x"', b"[null]", b'"shard-00000.fls"', b'"../x"',
               b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["]


class Mutator:
    """Seeded mutations of a growing pool of inputs."""

    def __init__(self, seeds: list[bytes], rng: random.Random, pool_max: int = 2000):
        self.pool = list(seeds)
        self.rng = rng
        self.pool_max = pool_max

    def add(self, data: bytes) -> None:
        if len(self.pool) < self.pool_max:
            self.pool.append(data)
        else:
            self.pool[self.rng.randrange(len(self.pool))] = data

    def __call__(self) -> bytes:
        r = self.rng
        data = bytearray(r.choice(self.pool))
        for _ in range(r.choice((1, 1, 1, 2, 2, 3, 4, 8))):
            self._once(data)
        return bytes(data)

    def _once(self, d: bytearray) -> None:
        r = self.rng
        n = len(d)
        op = r.randrange(11)
        if n == 0 or op == 0:
            d[r.randint(0, n):r.randint(0, n)] = r.randbytes(r.randint(1, 16))
        elif op == 1:
            d[r.randrange(n)] ^= 1 << r.randrange(8)
        elif op == 2:
            d[r.randrange(n)] = r.randrange(256)
        elif op in (3, 4):  # an interesting little-endian integer, often aligned (offsets, lengths, counts)
            width = r.choice((1, 2, 4, 8, 8))
            pos = r.randrange(n)
            if r.random() < 0.6:
                pos -= pos % 8
            v = r.choice(INTERESTING) + r.choice((0, 0, 0, -1, 1))
            d[pos:pos + width] = (v % (1 << (8 * width))).to_bytes(width, "little")
        elif op == 5:
            a = r.randrange(n)
            del d[a:a + r.randint(1, 64)]
        elif op == 6:
            a = r.randrange(n)
            chunk = d[a:a + r.randint(1, 64)]
            b = r.randrange(n)
            d[b:b + (len(chunk) if r.random() < 0.5 else 0)] = chunk
        elif op == 7:  # splice with another input
            other = r.choice(self.pool)
            if other:
                a = r.randrange(len(other))
                b = r.randrange(n)
                d[b:] = other[a:a + r.randint(1, max(1, len(other) - a))]
        elif op == 8:
            del d[r.randint(1, n):]
        else:  # JSON-ish text: replace a number or a token
            spans = [m.span() for m in re.finditer(rb"-?[0-9]+(\.[0-9]+)?|\"[^\"]{0,40}\"|null|true|false|\[|\{",
                                                  bytes(d[:4096]))]
            if spans:
                a, b = r.choice(spans)
                d[a:b] = r.choice(JSON_TOKENS)
            else:
                d[r.randrange(n)] = r.choice(b'{}[]",:0123456789')


def outcome(e: BaseException | None) -> str:
    """The shape of an outcome: exception type and message without numbers and paths."""
    if e is None:
        return "ok"
    msg = re.sub(r"'[^']*'|\d+", "", str(e))[:80]
    return f"{type(e).__name__}:{msg}"


def save_finding(target: str, data: bytes, report: str) -> Path:
    import hashlib

    d = OUT / "findings"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{target}-{hashlib.sha1(data).hexdigest()[:16]}"
    path.write_bytes(data)
    path.with_suffix(".txt").write_text(report)
    return path


def run_random(target_name: str, runs: int, seed: int, max_time: float | None = None, quiet: bool = False,
               seeds_obj=None) -> dict:
    """Run ``runs`` mutated inputs in this process. Returns counts; findings are saved and counted."""
    sys.path.insert(0, str(HERE))
    import targets

    target = targets.make(target_name, seeds_obj)
    rng = random.Random(seed)
    mut = Mutator(target.seeds(), rng)
    seen: set[str] = set()
    stats = {"target": target_name, "engine": "random", "inputs": 0, "findings": 0, "outcomes": 0}
    faulthandler.enable()
    t0 = time.perf_counter()
    last = t0
    inputs = target.seeds() + [b""]
    k = 0
    try:
        while stats["inputs"] < runs:
            data = inputs[k] if k < len(inputs) else mut()
            k += 1
            faulthandler.dump_traceback_later(HANG_S, exit=True)
            err: BaseException | None = None
            result = None
            try:
                result = target(data)
            except Exception as e:  # noqa: BLE001 - the oracle decides
                err = e
            faulthandler.cancel_dump_traceback_later()
            stats["inputs"] += 1
            if err is not None and not targets.allowed(err):
                stats["findings"] += 1
                report = "".join(traceback.format_exception(err))
                path = save_finding(target_name, data, report)
                if not quiet:
                    print(f"FINDING ({path}):\n{report}", file=sys.stderr, flush=True)
            shape = outcome(err) if err is not None else str(result)
            if shape not in seen:
                seen.add(shape)
                mut.add(data)
            now = time.perf_counter()
            if not quiet and now - last > 30:
                last = now
                print(f"#{stats['inputs']} outcomes: {len(seen)} findings: {stats['findings']} "
                      f"exec/s: {stats['inputs'] / (now - t0):.0f}", flush=True)
            if max_time is not None and now - t0 > max_time:
                break
    finally:
        faulthandler.cancel_dump_traceback_later()
    stats["seconds"] = time.perf_counter() - t0
    stats["outcomes"] = len(seen)
    stats["per_s"] = stats["inputs"] / max(stats["seconds"], 1e-9)
    return stats


def survey_lmdb_file(runs: int, seed: int) -> dict:
    """Byte-level damage to a whole ``data.mdb``, each read in a forked child. LMDB's page structure is
    liblmdb's to check, and it does not check everything (docs/THREAT_MODEL.md): this counts how often a
    damaged environment still crashes the reader (``crashes``). A Python exception other than fastload's
    own is a finding, as everywhere else."""
    sys.path.insert(0, str(HERE))
    import targets
    from fastload import FastloadError

    seeds = targets.Seeds()
    pristine = [(seeds.root / "seed" / f"{name}.lmdb" / "data.mdb").read_bytes() for name, *_ in seeds.specs]
    work = seeds.work / "lmdb-file"
    work.mkdir()
    rng = random.Random(seed)
    mut = Mutator(pristine, rng)
    counts = {"inputs": 0, "read": 0, "refused": 0, "findings": 0, "crashes": 0}
    signals: dict[str, int] = {}
    t0 = time.perf_counter()
    for _ in range(runs):
        data = mut()
        (work / "data.mdb").write_bytes(data)
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                code = 0 if targets.exercise(work) == "ok" else 4  # 4: refused with FastloadError
            except FastloadError:
                code = 4
            except BaseException:
                pass
            os._exit(code)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        counts["inputs"] += 1
        if code < 0:
            counts["crashes"] += 1
            name = __import__("signal").Signals(-code).name
            signals[name] = signals.get(name, 0) + 1
        elif code == 3:
            counts["findings"] += 1
            save_finding("lmdb-file", data, "a Python exception other than FastloadError (rerun to see it)")
        else:
            counts["read" if code == 0 else "refused"] += 1
    seeds.close()
    seconds = time.perf_counter() - t0
    print(f"lmdb-file survey: {counts['inputs']:,} damaged environments: {counts['read']} read, "
          f"{counts['refused']} refused with FastloadError, {counts['crashes']} crashed inside liblmdb "
          f"{signals or ''}, {counts['findings']} finding(s)", flush=True)
    return dict(counts, target="lmdb-file", engine="random", seconds=seconds, per_s=counts["inputs"] / seconds)


def run_atheris(target_name: str, runs: int, jobs: int, seed: int, max_time: float | None) -> dict:
    sys.path.insert(0, str(HERE))
    import targets

    corpus = OUT / "corpus" / target_name
    corpus.mkdir(parents=True, exist_ok=True)
    if not any(corpus.iterdir()):
        seeds = targets.make(target_name)
        for k, s in enumerate(seeds.seeds()):
            (corpus / f"seed-{k:04d}").write_bytes(s)
    (OUT / "findings").mkdir(parents=True, exist_ok=True)
    per_job = -(-runs // jobs)
    t0 = time.perf_counter()
    procs = []
    for j in range(jobs):
        args = [sys.executable, str(HERE / "fuzz_atheris.py"), target_name, str(corpus), f"-runs={per_job}",
                f"-seed={seed + j + 1}", f"-timeout={HANG_S}", "-rss_limit_mb=6144", "-print_final_stats=1",
                f"-artifact_prefix={OUT / 'findings'}/{target_name}-"]
        if max_time is not None:
            args.append(f"-max_total_time={int(max_time)}")
        log = open(OUT / f"atheris-{target_name}-{j}.log", "w")
        procs.append((subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT), log))
    codes = []
    for p, log in procs:
        codes.append(p.wait())
        log.close()
    seconds = time.perf_counter() - t0
    done, cov = 0, []
    for j in range(jobs):
        text = (OUT / f"atheris-{target_name}-{j}.log").read_text(errors="replace")
        m = re.findall(r"Done (\d+) runs in (\d+) second", text)
        done += int(m[-1][0]) if m else 0
        cov += [int(c) for c in re.findall(r"cov: (\d+)", text)[-1:]]
    findings = sum(1 for c in codes if c != 0)
    return {"target": target_name, "engine": "atheris", "inputs": done, "findings": findings,
            "seconds": seconds, "per_s": done / max(seconds, 1e-9), "coverage": max(cov, default=0),
            "logs": [str(OUT / f"atheris-{target_name}-{j}.log") for j in range(jobs)]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="all", help="shard, manifest, lmdb, jpeg, all (default), 'each' (every "
                                                     "target in turn, --runs split evenly), or lmdb-file (a "
                                                     "survey of whole-file LMDB damage, one fork per input)")
    ap.add_argument("--runs", type=int, default=1_000_000, help="inputs in all (default 1,000,000)")
    ap.add_argument("--engine", choices=["atheris", "random"], default=None,
                    help="default: atheris when importable, except for jpeg: the native code carries no "
                         "coverage instrumentation, and libFuzzer's corpus then shrinks to non-JPEGs")
    ap.add_argument("--jobs", type=int, default=1, help="parallel processes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-time", type=float, default=None, help="stop each job after this many seconds")
    a = ap.parse_args(argv)
    have_atheris = True
    try:
        import atheris  # noqa: F401
    except ImportError:
        have_atheris = False
        if a.engine != "random":
            print("atheris is not installed (pip install atheris): using the random engine", file=sys.stderr)
    names = ["shard", "manifest", "lmdb", "jpeg"] if a.target == "each" else [a.target]
    results = []
    for name in names:
        runs = a.runs // len(names)
        engine = a.engine or ("atheris" if have_atheris and name != "jpeg" else "random")
        if not have_atheris:
            engine = "random"
        if name == "lmdb-file":
            r = survey_lmdb_file(runs, a.seed)
        elif engine == "atheris":
            r = run_atheris(name, runs, a.jobs, a.seed, a.max_time)
        elif a.jobs > 1:
            r = _random_jobs(name, runs, a.jobs, a.seed, a.max_time)
        else:
            r = run_random(name, runs, a.seed, a.max_time)
        results.append(r)
        print(f"fuzz {r['target']} ({r['engine']}): {r['inputs']:,} inputs in {r['seconds']:.0f} s, "
              f"{r['per_s']:,.0f}/s, {r['findings']} finding(s)"
              + (f", coverage {r['coverage']}" if "coverage" in r else "")
              + (f", {r['outcomes']} distinct outcomes" if "outcomes" in r else ""), flush=True)
    total = sum(r["inputs"] for r in results)
    print(f"fuzz total: {total:,} inputs, {sum(r['findings'] for r in results)} finding(s)")
    return 1 if any(r["findings"] for r in results) else 0


def _random_jobs(name: str, runs: int, jobs: int, seed: int, max_time: float | None) -> dict:
    per = -(-runs // jobs)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--engine", "random", "--target", name, "--runs", str(per)]
    if max_time is not None:
        cmd += ["--max-time", str(max_time)]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(cmd + ["--seed", str(seed + j)], stdout=subprocess.PIPE, text=True)
             for j in range(jobs)]
    outs = [p.communicate()[0] for p in procs]
    inputs = sum(int(m.replace(",", "")) for o in outs for m in re.findall(r"fuzz total: ([\d,]+)", o))
    findings = sum(p.returncode != 0 for p in procs)
    seconds = time.perf_counter() - t0
    return {"target": name, "engine": "random", "inputs": inputs, "findings": findings, "seconds": seconds,
            "per_s": inputs / max(seconds, 1e-9)}


if __name__ == "__main__":
    sys.exit(main())
