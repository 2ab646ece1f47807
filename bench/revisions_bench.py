"""Loader throughput of two revisions of fastload's Python code on the same native core, in one run.

A restructuring must not cost throughput. This exports ``fastload/`` at each revision (``git archive``)
into a temporary directory, gives both the native extension built in this checkout (so only the
Python differs), and runs
each case in a fresh process per revision, alternating revisions round by round so drift on a shared
machine hits both alike. Each row is the median over rounds of samples/s.

  tiny    int32[64] + int64 label, 1M rows, batch 1024, shuffle, num_workers 0 and 2 (per-batch Python
          dominates: the case most sensitive to code on the batch path)
  raw     uint8 3x224x224, 2,000 rows, batch 64, shuffle, num_workers 2
  photos  JPEG RandomResizedCrop 224 + flip, 1,800 real photographs, batch 64, num_workers 2; and the same
          with ToDtype(float32, scale=True) + ImageNet Normalize on the CPU (float32 batches)

The packed datasets are bench/settings_bench.py's (built there on first use).

It refuses a revision whose Python this checkout's extension may not fit: every name the revision's binding
source exports from ``_C`` (``m.def``, ``m.attr``, ``py::class_`` and their methods, read from csrc/binding.cc
and csrc/bind_* at that revision; it may have only binding.cc) must be exported by this checkout's binding
source too, with the same keyword arguments in the same order and the same ones defaulted; arguments added
after them must have defaults. This checks the names and calls Python can use, not the behaviour behind them.

    python bench/revisions_bench.py [--base 2c9a045] [--head HEAD] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data"

CASES = {  # name: (dataset dir, batch size, num_workers, image transforms: "" none, "crop", "crop+normalize")
    "tiny, num_workers=0": ("settings_tiny", 1024, 0, ""),
    "tiny, num_workers=2": ("settings_tiny", 1024, 2, ""),
    "raw, num_workers=2": ("settings_raw", 64, 2, ""),
    "photos, num_workers=2": ("settings_photos", 64, 2, "crop"),
    "photos + ToDtype/Normalize, num_workers=2": ("settings_photos", 64, 2, "crop+normalize"),
}

RUN = r"""
import json, statistics, sys, time
import torch
import fastload
from fastload import transforms as T
path, bs, nw, images, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
pipeline = [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
if images == "crop+normalize":
    pipeline += [T.ToDtype(torch.float32, scale=True), T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]
opts = {"transforms": {"image": pipeline}} if images else {}
loader = fastload.DataLoader(fastload.open(path, **opts), batch_size=bs, shuffle=True, num_workers=nw,
                             drop_last=True, persistent_workers=nw > 0)
def epoch():
    n = 0
    for batch in loader:
        n += int(batch[-1].shape[0])
    return n
epoch()  # warm-up: page cache, slots, threads
rates, t_end = [], time.perf_counter() + seconds
while time.perf_counter() < t_end or len(rates) < 3:
    t = time.perf_counter()
    n = epoch()
    rates.append(n / (time.perf_counter() - t))
print(json.dumps({"rate": statistics.median(rates), "epochs": len(rates), "fastload": fastload.__file__}))
"""


BINDING = ("csrc/binding.cc", "csrc/bind_*")
_EXPORT = re.compile(r'\bm\.(?P<kind>def|attr)\(\s*"(?P<name>\w+)"'
                     r'|py::class_<[^>]*>\(\s*m\s*,\s*"(?P<cls>\w+)"'
                     r'|\.(?P<method>def|def_property_readonly|def_readonly|def_readwrite|def_static)\(\s*(?:"(?P<mname>\w+)"|(?P<init>py::init))')
_ARG = re.compile(r'py::arg\("(\w+)"\)(\s*=)?')


def exported_api(sources: list[str]) -> dict[str, tuple[tuple[str, bool], ...]]:
    """``_C``'s exports declared in binding sources: name (``Class.method`` for members) -> its keyword
    arguments as (name, has a default)."""
    api: dict[str, tuple[tuple[str, bool], ...]] = {}
    for text in sources:
        marks = list(_EXPORT.finditer(text))
        cls = ""
        for k, m in enumerate(marks):
            end = marks[k + 1].start() if k + 1 < len(marks) else len(text)
            args = tuple((a.group(1), bool(a.group(2))) for a in _ARG.finditer(text, m.end(), end))
            if m.group("cls"):
                cls, name = m.group("cls"), m.group("cls")
            elif m.group("method"):
                name = f"{cls}.{m.group('mname') or '__init__'}"
            else:
                name = m.group("name")
            api[name] = args
    return api


def api_mismatch(base: dict, head: dict) -> str | None:
    """Why code written against ``base`` may not run on ``head``, or None."""
    for name, args in sorted(base.items()):
        if name not in head:
            return f"_C.{name} is no longer exported"
        new = head[name]
        if new[:len(args)] != args or not all(default for _, default in new[len(args):]):
            return f"_C.{name}'s arguments changed: {[a for a, _ in args]} -> {[a for a, _ in new]}"
    return None


def binding_at(rev: str | None) -> list[str]:
    """The binding sources at ``rev`` (None: this checkout's files, which its extension is built from)."""
    if rev is None:
        return [p.read_text() for pattern in BINDING for p in sorted(ROOT.glob(pattern))]
    names = subprocess.run(["git", "ls-tree", "--name-only", rev, "csrc/"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    names = [n for n in names if n == BINDING[0] or n.startswith("csrc/bind_")]
    return [subprocess.run(["git", "show", f"{rev}:{n}"], cwd=ROOT, check=True, capture_output=True,
                           text=True).stdout for n in names]


def export(rev: str, into: Path) -> str:
    """fastload/ at ``rev`` under ``into``, with this checkout's extension; returns the commit."""
    commit = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout.strip()
    base, head = exported_api(binding_at(rev)), exported_api(binding_at(None))
    if not base:
        sys.exit(f"{rev}: found no _C exports in its {' or '.join(BINDING)}; cannot check that this "
                 f"checkout's extension fits its Python")
    why = api_mismatch(base, head)
    if why:
        sys.exit(f"{rev}: {why} in this checkout's binding sources, so its extension may not fit that "
                 f"revision's Python; compare revisions whose _C API this one only extends")
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev, "fastload"], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    for so in (ROOT / "fastload").glob("_C*.so"):
        (into / "fastload" / so.name).write_bytes(so.read_bytes())
    return commit


def ensure_data(cases: list[str]) -> None:
    missing = [CASES[c][0] for c in cases if not (DATA / CASES[c][0] / "manifest.json").exists()]
    if missing:
        sys.exit(f"missing packed datasets {sorted(set(missing))}: run `python bench/settings_bench.py` once "
                 f"to build them")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="2c9a045", help="revision before the change (default: before issue 13)")
    ap.add_argument("--head", default="HEAD")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0, help="measured time per case and process")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES), metavar="CASE",
                    help="some of: " + "; ".join(CASES))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    ensure_data(args.cases)
    with tempfile.TemporaryDirectory() as tmp:
        revs = {name: export(rev, Path(tmp) / name) for name, rev in (("base", args.base), ("head", args.head))}
        rates: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            order = ("base", "head") if r % 2 == 0 else ("head", "base")
            for case in args.cases:
                d, bs, nw, images = CASES[case]
                for name in order:
                    env = dict(os.environ, PYTHONPATH=str(Path(tmp) / name), PYTHONWARNINGS="ignore")
                    out = subprocess.run([sys.executable, "-c", RUN, str(DATA / d), str(bs), str(nw), images,
                                          str(args.seconds)],
                                         cwd=tmp, env=env, capture_output=True, text=True, check=True)
                    res = json.loads(out.stdout.strip().splitlines()[-1])
                    assert res["fastload"].startswith(str(Path(tmp) / name)), res["fastload"]
                    rates.setdefault((case, name), []).append(res["rate"])
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    cmd = "python bench/revisions_bench.py " + shlex.join(sys.argv[1:])
    lines = [(f"# Loader throughput of two revisions of fastload's Python ({os.cpu_count()} CPUs), "
              f"{time.strftime('%Y-%m-%d')}"), "",
             (f"`{cmd.strip()}`: fastload/ at base {revs['base']} and head {revs['head']}, both on this "
              f"checkout's native extension; medians of {args.rounds} alternating rounds, samples/s."), "",
             "| case | base | head | head / base |", "|---|---:|---:|---:|"]
    for case in args.cases:
        b, h = statistics.median(rates[(case, "base")]), statistics.median(rates[(case, "head")])
        lines.append(f"| {case} | {b:,.0f} | {h:,.0f} | {h / b:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
