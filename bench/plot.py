"""Plots of the benchmark suite's CSVs: one PNG beside each ``suite_<case>.csv``.

    bench/.venvs/plot/bin/python bench/plot.py bench/results/suite_photos.csv [...]

Runs in the ``plot`` venv (``bash bench/setup_peers.sh plot``): matplotlib pulls plain pillow, which must never
land in the project's .venv (pillow-simd lives there). Reads only the CSV files (and ``suite_machine.json``
beside them for the title), so plots can be redrawn without re-running anything.

  loader cases  left: samples/s per loader and config (fastload's rows highlighted); right: CPU ms per sample
  overlap       left: loop time / compute-only time (1.0 = loading hidden); right: CPU ms per sample
  pack          samples/s per writer, one panel per dataset
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"fastload": "#d62728", "torch-simd": "#1f77b4", "torch-pillow": "#aec7e8", "dali": "#76b900",
          "ffcv": "#9467bd", "wds": "#ff7f0e", "litdata": "#8c564b"}


def _num(row: dict, key: str) -> float | None:
    try:
        return float(row[key])
    except (KeyError, TypeError, ValueError):
        return None


def _machine(csv_path: Path) -> str:
    info = csv_path.with_name("suite_machine.json")
    if info.exists():
        m = json.loads(info.read_text())
        return f"{m['cores']} vCPUs ({m['cpu']}), {m['memory']}, {m['os']}, {m['date']}"
    return ""


def _label(r: dict) -> str:
    return f"{r['loader']}\n{r['config']}" if r["config"] else r["loader"]


def _barh(ax, rows, key, xlabel, fmt, ref=None, invert=True):
    labels = [_label(r) for r in rows]
    values = [_num(r, key) or 0.0 for r in rows]
    colors = [COLORS.get(r["peer"], "#7f7f7f") for r in rows]
    y = range(len(rows))
    ax.barh(y, values, color=colors)
    ax.set_yticks(list(y), labels, fontsize=7)
    if invert:  # once per shared y axis
        ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    top = max(values) if values else 1
    for i, v in enumerate(values):
        ax.text(v + top * 0.01, i, fmt(v), va="center", fontsize=7)
    if ref is not None:
        ax.axvline(ref, color="k", lw=0.8, ls="--")
    ax.set_xlim(0, top * 1.22)
    ax.grid(axis="x", alpha=0.3)


def plot_loader(rows: list[dict], case: str, out: Path, title: str) -> None:
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 0.42 * len(ok) + 1.6), sharey=True)
    if case == "overlap":
        _barh(a, ok, "loop_over_compute", "loop time / compute-only time (lower is better, 1 = hidden)",
              lambda v: f"{v:.2f}", ref=1.0)
    else:
        _barh(a, ok, "samples_per_s", "samples/s (median; higher is better)", lambda v: f"{v:,.0f}")
    for r in ok:
        r["cpu_ms"] = (_num(r, "cpu_s_per_sample") or 0.0) * 1e3
    _barh(b, ok, "cpu_ms", "CPU ms per sample, workers included (lower is better)", lambda v: f"{v:.3f}",
          invert=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_pack(rows: list[dict], out: Path, title: str) -> None:
    ok = [r for r in rows if r["status"] == "ok"]
    datasets = list(dict.fromkeys(r["dataset"] for r in ok))
    if not datasets:
        return
    fig, axes = plt.subplots(len(datasets), 1, figsize=(10, sum(0.42 * sum(r["dataset"] == d for r in ok) + 0.9
                                                              for d in datasets) + 0.8))
    axes = axes if len(datasets) > 1 else [axes]
    for ax, d in zip(axes, datasets):
        sub = [r for r in ok if r["dataset"] == d]
        _barh(ax, sub, "samples_per_s", "", lambda v: f"{v:,.0f}")
        ax.set_title(f"{d}: samples/s packed (MB/s in the CSV and table)", fontsize=9, loc="left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    for p in map(Path, paths):
        with open(p, newline="") as fh:
            rows = list(csv.DictReader(fh))
        case = rows[0]["case"] if rows else p.stem.removeprefix("suite_")
        out = p.with_suffix(".png")
        title = f"fastload suite: {case}  |  {_machine(p)}"
        if case == "pack":
            plot_pack(rows, out, title)
        else:
            plot_loader(rows, case, out, title)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
