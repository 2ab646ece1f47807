"""The table for scripts/upstream_suites.sh: junit XML of the torch and fastload runs -> markdown.

A test counts as failed if any of its junit entries (setup, call, teardown) has a failure or error, as skipped if
it was skipped (xfail included, as pytest writes it), passed otherwise. "fastload only" is the set of tests that
fail in the fastload run and pass (or are absent: a file that did not collect) in the torch run.
"""

import argparse
import csv
import datetime
import platform
import xml.etree.ElementTree as ET
from pathlib import Path


def outcomes(run_dir):
    """{(suite, file, test id): (outcome, one-line message, seconds)} for every junit file under run_dir/<suite>/."""
    result = {}
    for xml in sorted(Path(run_dir).glob("*/*.xml")):
        suite = xml.parent.name
        for case in ET.parse(xml).iter("testcase"):
            key = (suite, xml.stem, f"{case.get('classname', '')}::{case.get('name', '')}")
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            if bad is not None:
                text = (bad.get("message") or bad.text or "").strip().splitlines()
                outcome = ("failed", text[0][:160] if text else "")
            elif case.find("skipped") is not None:
                outcome = ("skipped", "")
            else:
                outcome = ("passed", "")
            if key not in result or outcome[0] == "failed":
                result[key] = outcome + (result.get(key, (0, 0, 0.0))[2] + float(case.get("time") or 0),)
            else:
                result[key] = result[key][:2] + (result[key][2] + float(case.get("time") or 0),)
    return result


def count(res):
    tally = {"passed": 0, "failed": 0, "skipped": 0}
    for outcome, *_ in res.values():
        tally[outcome] += 1
    return tally


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--junit", required=True, help="the work folder's junit/ (runs torch/ and fastload/ in it)")
    ap.add_argument("--baseline", help="the junit/torch folder of an earlier run, if this one ran fastload only")
    ap.add_argument("--out", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--fastload", required=True, help="fastload tree and commit of the fastload run")
    ap.add_argument("--ref", action="append", default=[], help="upstream sources, 'name ref = commit'")
    ap.add_argument("--venv", required=True)
    args = ap.parse_args()

    junit = Path(args.junit)
    torch_dir = Path(args.baseline) if args.baseline else junit / "torch"
    runs = {}
    if torch_dir.is_dir():
        runs["torch's DataLoader"] = outcomes(torch_dir)
    if (junit / "fastload").is_dir():
        runs["fastload swapped in"] = outcomes(junit / "fastload")

    lines = ["# Upstream test suites with fastload swapped in (issue 18)", ""]
    lines += [
        f"- command: `{args.command}`",
        f"- fastload: {args.fastload}",
        *[f"- {r}" for r in args.ref],
        f"- venv: {args.venv}; {platform.python_version()}, {datetime.date.today()}",
        "- the fastload run puts a sitecustomize.py on PYTHONPATH that sets `torch.utils.data.DataLoader` and "
        "`torch.utils.data.dataloader.DataLoader` to `fastload.DataLoader` in every process",
        "",
        "| run | passed | failed | skipped |",
        "|---|---:|---:|---:|",
    ]
    for name, res in runs.items():
        t = count(res)
        lines.append(f"| {name} | {t['passed']} | {t['failed']} | {t['skipped']} |")

    times = junit / "times.tsv"
    if times.exists():
        lines += [
            "",
            "Wall time per file (seconds, exit code):",
            "",
            "| suite | file | run | s | rc |",
            "|---|---|---|---:|---:|",
        ]
        for run, suite, f, s, rc in csv.reader(times.open(), delimiter="\t"):
            lines.append(f"| {suite} | {f} | {run} | {s} | {rc} |")

    if len(runs) == 2:
        base, swapped = runs.values()
        only = sorted(k for k, (o, *_) in swapped.items() if o == "failed" and base.get(k, ("passed",))[0] != "failed")
        both = sorted(k for k, (o, *_) in swapped.items() if o == "failed" and base.get(k, ("",))[0] == "failed")
        torch_only = sorted(k for k, (o, *_) in base.items() if o == "failed" and swapped.get(k, ("",))[0] != "failed")
        for title, keys, res in [
            (f"Fail only with fastload ({len(only)})", only, swapped),
            (f"Fail in both runs ({len(both)})", both, swapped),
            (f"Fail only with torch's DataLoader ({len(torch_only)})", torch_only, base),
        ]:
            lines += ["", f"## {title}", ""]
            lines += [f"- `{s}` `{f}` `{t}`: {res[(s, f, t)][1].replace('|', '/')}" for s, f, t in keys] or ["none"]

        # A loader that passes but is much slower is a finding too (pytest's per-test time, call phase).
        slower = sorted(
            (
                (swapped[k][2] - base[k][2], k)
                for k in swapped.keys() & base.keys()
                if swapped[k][0] == base[k][0] == "passed"
            ),
            reverse=True,
        )[:10]
        lines += [
            "",
            "## Passing tests that took longest more with fastload (top 10, seconds)",
            "",
            "| test | torch | fastload |",
            "|---|---:|---:|",
        ]
        lines += [
            f"| `{s}` `{t}` | {base[(s, f, t)][2]:.2f} | {swapped[(s, f, t)][2]:.2f} |"
            for d, (s, f, t) in slower
            if d > 0.5
        ] or ["| none more than 0.5 s | | |"]

    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text if len(text) < 6000 else "\n".join(lines[:20]))


if __name__ == "__main__":
    main()
