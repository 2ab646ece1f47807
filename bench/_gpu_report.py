"""The GPU benchmarks' results file (bench/gpu_bench.py, bench/augment_gpu_bench.py): what imports here, the
sections run one after another whatever the ones before did, and a file written again after every section, so
that a run stopped part-way (SIGTERM: scripts/gpu_check.sh's time limit) leaves what ran and names what did
not."""

from __future__ import annotations

import importlib
import signal
import traceback
from pathlib import Path


def availability() -> list[str]:
    """Which optional pieces import here: a section that needs a missing one says so instead of crashing."""
    out = []
    for name, module in (("torchvision", "torchvision"), ("DALI", "nvidia.dali")):
        try:
            out.append(f"{name} {getattr(importlib.import_module(module), '__version__', '?')}")
        except Exception as e:  # noqa: BLE001  (missing, or broken: any exception at import)
            first = str(e).splitlines()[0][:160] if str(e) else ""
            out.append(f"{name} unusable ({type(e).__name__}: {first})")
    return out


class Stopped(BaseException):
    """SIGTERM arrived (gpu_check.sh's time limit): not an Exception, so no section's handler swallows it."""


_saving: list[int] = []  # non-empty while Report.save writes; a stop arriving then is kept here until it is done


def _stop(signum, frame):
    if _saving:
        _saving.append(signum)
        return
    raise Stopped(f"stopped by signal {signum} (the time limit ran out)")


class Report:
    """The results file, written again after every section so that a run stopped part-way leaves what ran
    and names what did not; it ends with every goal of ``goals`` (section key -> the goal's words) and its
    verdict, "not measured" (with the reason) unless its section returned one."""

    def __init__(self, out: Path, lines: list[str], goals: dict[str, str]):
        self.out, self.lines, self.goals = out, lines, goals
        self.verdicts: dict[str, str] = {}
        #: sections not finished: listed in every write until they end, so a run killed in a section (SIGKILL,
        #: or SIGTERM landing in a long native call) leaves a file naming it too
        self.pending: list[str] = []
        self.default = "not measured: its section did not finish"
        self.why_pending = "the run ended before they finished"

    def text(self) -> list[str]:
        tail = [f"Not run ({self.why_pending}): {', '.join(self.pending)}", ""] if self.pending else []
        tail += ["## Goals", ""] + [f"- {goal}: {self.verdicts.get(key, self.default)}" for key, goal in self.goals.items()]
        return self.lines + tail

    def save(self, echo: bool = False) -> None:
        """Write the file; a stop landing meanwhile takes effect once the file says what it should (a finished
        section no longer listed as not run), then ends the run as anywhere else. (Not a blocked signal mask:
        the loaders' threads would take the signal, and Python runs the handler in this thread at once.)"""
        _saving.append(0)
        try:
            write(self.text(), self.out, echo=echo)
        finally:
            stops = _saving[1:]
            _saving.clear()
        if stops:
            _stop(stops[0], None)


def run_sections(report: Report, sections: list[tuple[str, object]]) -> list[str]:
    """Run each section in turn, whatever the ones before did; returns the failures (wrong results). A
    section returns the verdicts of the goals it measured (or None). On SIGTERM the file is written, then
    the run ends (``Stopped`` propagates)."""
    failed = []
    report.pending = [title for title, _ in sections]
    report.save()
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        for title, run in sections:
            try:
                report.verdicts.update(run() or {})
            except AssertionError as e:  # a wrong result: written, and the run fails at the end
                failed.append(f"{title}: {e}")
                report.lines += [f"**{title} FAILED**: {e}", ""]
            except Stopped as e:
                report.pending.remove(title)
                report.lines += [f"**{title}** did not finish: {e}", ""]
                report.save()
                raise
            except Exception as e:  # noqa: BLE001  (a missing DALI/torchvision: say what could not run)
                traceback.print_exc()
                report.lines += [f"{title} could not run: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}", ""]
            report.pending.remove(title)
            report.save()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return failed


def write(lines: list[str], out: Path, echo: bool = True) -> None:
    text = "\n".join(lines)
    if echo:
        print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(out)  # whole or not at all, also when a signal lands while writing
    if echo:
        print(f"results written to {out}")
