"""What the benchmark scripts in bench/ share: their common flags, the photo data they build and reuse, the
alternating-rounds harness, and the report plumbing (heading, command line, markdown file, CSV).

Each script keeps its own cases and tables. Only what means the same thing in every script lives here, so that a
flag, a data set or a timing rule changes once for all of them (and a newcomer reads it once).
"""

from __future__ import annotations

import argparse
import csv
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import fastload
from fastload import transforms as T

# The photo scripts' setting (augment, getitems, mix, frameworks): batch 64, 2 workers (processes for torch's
# loader, decode threads for fastload's), 224 x 224 crops.
BATCH, WORKERS, SIZE = 64, 2, 224
LOADER_OPTIONS = dict(batch_size=BATCH, shuffle=True, num_workers=WORKERS, drop_last=True, persistent_workers=True)


# ------------------------------------------------------------------------------------------ flags

def parser(doc: str, *, per_class: int | None = None, rounds: int | None = None, repeat: int | None = None,
           epochs: int | None = None, batch_size: int | None = None, data: bool = True, out: bool = False,
           csv: bool = False) -> argparse.ArgumentParser:
    """The flags that mean the same in every script, with this script's defaults (None: the script has no such
    flag). The script adds its own after these."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if data:
        ap.add_argument("--data", type=Path, default=Path("bench/data"),
                        help="where the photo folders and packed copies are built, and reused on later runs")
    if per_class is not None:
        ap.add_argument("--per-class", type=int, default=per_class, help="photos per class (12 classes)")
    if rounds is not None:
        ap.add_argument("--rounds", type=int, default=rounds, help="alternating rounds after the warm-up one")
    if repeat is not None:
        ap.add_argument("--repeat", type=int, default=repeat, help="timed repetitions (the median counts)")
    if epochs is not None:
        ap.add_argument("--epochs", type=int, default=epochs, help="epochs per configuration and round")
    if batch_size is not None:
        ap.add_argument("--batch-size", type=int, default=batch_size)
    if out:
        ap.add_argument("--out", type=Path, default=None, help="write the markdown report here too")
    if csv:
        ap.add_argument("--csv", type=Path, default=None, help="write the raw numbers here")
    return ap


# ------------------------------------------------------------------------------------------- data

def photo_folder(data: Path, per_class: int = 150) -> Path:
    """bench/photos.py's ImageFolder of real photographs (12 classes), built once under ``data`` and reused."""
    from photos import build_photo_folder

    folder = data / f"photos_{per_class}"
    build_photo_folder(folder, per_class=per_class, seed=0, progress=False)
    return folder


def pack_once(source, path: Path, **pack_options) -> Path:
    """``fastload.pack(source, path)`` unless a packed dataset is already there (its manifest is written last)."""
    if not (path / "manifest.json").exists():
        fastload.pack(source, path, overwrite=True, **pack_options)
    return path


def build(path: Path, source, **options) -> fastload.Dataset:
    """The packed copy of ``source`` at ``path`` (packed on first use), opened with ``options``."""
    return fastload.open(pack_once(source, path), **options)


def packed_photos(data: Path, folder: Path, image_transforms: list) -> fastload.Dataset:
    """The photo folder's packed copy that settings_bench, revisions_bench and the photo scripts all read."""
    return build(data / "settings_photos", folder, transforms={"image": image_transforms})


def crop_flip(size: int = SIZE) -> list:
    """The training crop every loader benchmark runs: RandomResizedCrop + horizontal flip."""
    return [T.RandomResizedCrop(size), T.RandomHorizontalFlip()]


# ----------------------------------------------------------------------------------------- timing

def drain(loader, epochs: int) -> Callable[[], int]:
    """A configuration for :func:`alternate`: ``epochs`` epochs of ``loader``, returning the images seen."""
    def run() -> int:
        n = 0
        for _ in range(epochs):
            for images, _labels in loader:
                n += images.shape[0]
        return n
    return run


@dataclass
class Round:
    wall: float    # seconds
    cpu: float     # this process's CPU seconds (its threads included, child processes not)
    result: Any    # what the configuration returned


def alternate(configs: dict[str, Callable[[], Any]], count: int,
              between: Callable[[str], None] | None = None) -> dict[str, list[Round]]:
    """Run every configuration once to warm up (page cache, worker processes, native threads), then ``count``
    rounds of each in turn, so that drift on a shared machine hits every configuration alike. ``between(name)``
    runs after each call of configuration ``name`` (warm-up included), outside its timed window (e.g. ``settle``)."""
    for name, fn in configs.items():
        fn()
        if between is not None:
            between(name)
    timings: dict[str, list[Round]] = {k: [] for k in configs}
    for _ in range(count):
        for name, fn in configs.items():
            t, c = time.perf_counter(), time.process_time()
            result = fn()
            timings[name].append(Round(time.perf_counter() - t, time.process_time() - c, result))
            if between is not None:
                between(name)
    return timings


def tree_cpu_seconds() -> float | None:
    """CPU seconds used so far by this process (all its threads) and its live descendants (a loader's worker
    processes), from /proc; None where there is no /proc (not Linux)."""
    if not os.path.isdir("/proc/self"):
        return None
    parent, cpu = {}, {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        except OSError:  # gone since the listing
            continue
        pid = int(entry.name)
        parent[pid], cpu[pid] = int(fields[1]), int(fields[11]) + int(fields[12])  # ppid, utime + stime
    mine = {os.getpid()}
    grew = True
    while grew:
        grew = False
        for pid, pp in parent.items():
            if pp in mine and pid not in mine:
                mine.add(pid)
                grew = True
    return sum(cpu[pid] for pid in mine) / os.sysconf("SC_CLK_TCK")


def settle(limit_s: float = 5.0, sample_s: float = 0.2, idle: float = 0.15) -> tuple[float, bool]:
    """Wait until this process and its workers are idle (below ``idle`` of one core over a ``sample_s`` sample),
    at most ``limit_s``. Returns the CPU seconds they used meanwhile (what a loader did after its timed window,
    which would have been charged to the next one; the /proc reads here add about 0.01 s a sample) and whether
    they did go idle."""
    start = last = tree_cpu_seconds()
    if start is None or last is None:
        return 0.0, True
    t0 = time.perf_counter()
    now = last
    while time.perf_counter() - t0 < limit_s:
        time.sleep(sample_s)
        now = tree_cpu_seconds() or last
        if now - last < idle * sample_s:
            return now - start, True
        last = now
    return now - start, False


def image_rounds(configs: dict[str, Callable[[], int]], count: int) -> tuple[dict[str, list[float]],
                                                                            dict[str, list[float]]]:
    """Per configuration (which returns the images it loaded) and round: images/s, and this process's CPU
    seconds per image (fastload's threads are in it; torch's worker processes are not)."""
    timings = alternate(configs, count)
    return ({k: [r.result / r.wall for r in v] for k, v in timings.items()},
            {k: [r.cpu / r.result for r in v] for k, v in timings.items()})


def median_seconds(fn: Callable[[], Any], repeat: int) -> float:
    """The median wall time of ``repeat`` calls of ``fn`` (no warm-up: call it once first where one is due)."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def medians(values: dict[Any, list[float]]) -> dict[Any, float]:
    return {k: statistics.median(v) for k, v in values.items()}


def spread(values: Sequence[float]) -> str:
    """Two table cells: the median, and the min-max range over the rounds."""
    return f"{statistics.median(values):,.0f} | {min(values):,.0f}-{max(values):,.0f}"


# ----------------------------------------------------------------------------------------- output

def heading(title: str) -> str:
    """A report's first line: the title, this machine's CPU count and today's date."""
    return f"# {title} ({os.cpu_count()} CPUs), {time.strftime('%Y-%m-%d')}"


def command() -> str:
    """This run's command line as the report quotes it, to run again (arguments shell-quoted)."""
    return f"python bench/{Path(sys.argv[0]).name} {shlex.join(sys.argv[1:])}".strip()


def publish(lines: list[str], out: Path | None) -> str:
    """Print the report, and write it to ``out`` when one was asked for."""
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    if out:
        out.write_text(text)
    return text


def write_csv(path: Path | None, rows: Iterable, header: Sequence[str] | None = None) -> None:
    """``rows`` (dicts, whose keys are the header; or sequences under ``header``) to ``path``, when one was
    asked for."""
    if path is None:
        return
    rows = list(rows)
    if header is None and not rows:
        raise ValueError(f"write_csv({path}): no rows and no header: nothing says what the columns are")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        if header is None:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
        else:
            w = csv.writer(fh)
            w.writerow(header)
        w.writerows(rows)
