"""Per-decoder verdicts for scripts/gpu_check.sh: a pytest plugin and the summary made from what it wrote.

As a plugin (``pytest -p gpu_verdicts``, tests/cuda on the path):
  --gpu-verdicts=FILE     one JSON line per test as it ends (so a run stopped part-way keeps what finished):
                          nodeid, decoder, outcome (passed / failed / skipped), the skip reason or the failure's
                          first line
  --gpu-decoders=a,b      run only these decoders' tests (the DALI lease: dali,auto); the rest are deselected

A test's decoder is its ``decoder`` parameter, else its module's ``DECODER`` (tests/cuda/test_nvjpeg.py), else
"native" (the loader's own decode, to_device, the augmentation engine).

As a program: ``python tests/cuda/gpu_verdicts.py FILE... [--require dali,nvjpeg]`` prints one line per decoder,
what ran, passed, failed and was skipped (with the reasons), and exits 1 when a test failed or a required decoder
did not run in full: none of its tests ran, or one was skipped (on the GPU machine a skip means its library is
missing or unusable: gpu-check would otherwise pass without the decoder it was meant to prove).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

DECODERS = ("native", "nvjpeg", "dali", "auto")


def decoder_of(item) -> str:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and isinstance(callspec.params.get("decoder"), str):
        return callspec.params["decoder"]
    return getattr(getattr(item, "module", None), "DECODER", "native")


# -- the plugin --------------------------------------------------------------------------------------------------

def pytest_addoption(parser):
    group = parser.getgroup("gpu-check")
    group.addoption("--gpu-verdicts", default=None, help="append one JSON line per test to this file")
    group.addoption("--gpu-decoders", default=None, help="comma-separated: run only these decoders' tests")


_decoders: dict[str, str] = {}
_config: list = []


def pytest_configure(config):
    _config[:] = [config]


def pytest_collection_modifyitems(config, items):
    wanted = config.getoption("--gpu-decoders")
    keep, drop = [], []
    for item in items:
        _decoders[item.nodeid] = decoder_of(item)
        (keep if not wanted or _decoders[item.nodeid] in wanted.split(",") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (file, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    text = str(getattr(report, "longreprtext", "") or longrepr or "")
    lines = [ln for ln in text.splitlines() if ln.startswith("E ")]
    return (lines[0][1:].strip() if lines else (text.splitlines() or [""])[-1])[:300]


def pytest_runtest_logreport(report):
    path = _config[0].getoption("--gpu-verdicts") if _config else None
    if not path:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed") or \
            (report.when == "teardown" and report.outcome == "failed"):
        outcome = report.outcome if report.when != "teardown" else "failed"
        rec = {"nodeid": report.nodeid, "decoder": _decoders.get(report.nodeid, "native"), "outcome": outcome,
               "when": report.when}
        if outcome != "passed":
            rec["reason"] = _reason(report)
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")




# -- the summary -------------------------------------------------------------------------------------------------

def summarize(records: list[dict], require: list[str]) -> tuple[list[str], bool]:
    """(lines, ok): one line per decoder seen or required; ok is False when a test failed or a required decoder
    did not run in full."""
    by: dict[str, list[dict]] = {}
    for rec in records:
        by.setdefault(rec["decoder"], []).append(rec)
    lines, ok = [], True
    for name in [d for d in DECODERS if d in by or d in require] + sorted(set(by) - set(DECODERS)):
        recs = by.get(name, [])
        count = Counter(r["outcome"] for r in recs)
        passed, failed, skipped = count["passed"], count["failed"], count["skipped"]
        ran = passed + failed
        if failed:
            verdict = "FAILED"
        elif ran == 0:
            verdict = "not run"
        elif skipped:
            verdict = "passed in part"
        else:
            verdict = "passed"
        line = f"decoder {name}: {verdict}: {ran} ran ({passed} passed, {failed} failed), {skipped} skipped"
        reasons = Counter(r.get("reason", "") for r in recs if r["outcome"] == "skipped")
        if reasons:
            line += " (" + "; ".join(f"{n}x {why}" for why, n in reasons.most_common(3)) + ")"
        if name in require and (ran == 0 or skipped):
            line += " -- REQUIRED (GPU_CHECK_REQUIRE): it must run in full"
            ok = False
        ok = ok and not failed
        lines.append(line)
        for r in [r for r in recs if r["outcome"] == "failed"][:5]:
            lines.append(f"  failed: {r['nodeid']}: {r.get('reason', '')}")
    return lines, ok


def read(paths: list[Path]) -> list[dict]:
    records = []
    for path in paths:
        if path.exists():
            records += [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--require", default="", help="comma-separated decoders that must run in full")
    args = ap.parse_args(argv)
    require = [d for d in args.require.split(",") if d]
    unknown = sorted(set(require) - set(DECODERS))
    if unknown:
        print(f"GPU_CHECK_REQUIRE names unknown decoders {unknown}: expected some of {', '.join(DECODERS)}")
        return 2
    lines, ok = summarize(read(args.files), require)
    print("\n".join(lines) if lines else "no test ran")
    return 0 if ok and lines else 1


if __name__ == "__main__":
    sys.exit(main())
