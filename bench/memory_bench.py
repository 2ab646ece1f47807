"""Host memory of the whole process tree (the loop's process and every worker it forks) while loaders run epochs
over the same JPEGs: fastload's paths against torch's DataLoader and DALI, at 2 and 8 workers.

Each configuration runs in a child process of its own (a fresh interpreter, so no configuration inherits another's
memory); this process samples the child and every descendant of it every ``--interval`` seconds (50 ms) from
``/proc/<pid>/smaps_rollup``:

* **PSS** (proportional set size): every page counted once over the tree, a page shared by k processes at 1/k
  in each. The sum over the tree is what the tree costs the machine. It includes file pages the processes have
  *mapped* (shared libraries, and fastload's memory-mapped shards: page cache, clean, reclaimable, shown apart
  as "shards" at the epoch ends: the PSS of mapped files under ``--data``; DALI's file reader maps the JPEGs it
  reads, so its row shows them there too), but not the page cache of files read with ``read()`` (the PIL
  datasets read their JPEGs that way: their page cache is not in any process's PSS).
* **USS** (unique set size: Private_Clean + Private_Dirty): pages only one process maps, summed over the tree.
  Shared memory between the loop and its workers (batches in flight, fastload's generic slots) is *not* in USS.
* **anon / file / shmem**: the tree's PSS split by kind (Pss_Anon, Pss_File, Pss_Shmem).

The child pauses at the end of every epoch (the last batch dropped, ``gc.collect()``) until this process has
taken that epoch's sample, so the epoch-end figures are exact, not the nearest 50 ms sample. "idle" is the
tree after the loader (and torch, the dataset, ...) exist and before the first batch: peak - idle is what the
loading itself holds. "growth" is the largest epoch-end PSS after epoch 1 minus epoch 1's (bench/soak.py fails
a run on it).

Configurations (``--configs``, all by default), every one RandomResizedCrop 224 + horizontal flip, batch 64,
shuffle, drop_last, persistent workers, uint8 batches:

  fastload-fast-wN      fastload.DataLoader(fastload.open(packed)), N native decode threads (fast path)
  fastload-generic-wN   fastload.DataLoader(PIL Dataset), N worker processes, shared-memory slots
  torch-getitems-wN     torch.utils.data.DataLoader(fastload.open(packed)): N torch workers, ``__getitems__``
  torch-pil-wN          torch.utils.data.DataLoader(PIL Dataset), N workers (pillow-simd; the torch peer)
  dali-cpu-wN           NVIDIA DALI, CPU-only pipeline (bench/peers/dali_peer.py's), N threads

FFCV is not measured: it needs its own virtualenv (bench/setup_peers.sh: Debian's libopencv-dev + libturbojpeg and
a source build of ffcv 1.0.2), and the report lists it as not run with that reason.

Data: ``--per-class`` JPEGs in 12 classes, built once under ``--data`` (smooth random images, long side
180-640 px, quality 75-95, like bench/photos.py's crops; ``--photos`` uses bench/photos.py's real photographs
instead), packed once for fastload.

    python bench/memory_bench.py [--epochs 5] [--per-class 100] [--configs a,b] [--out md] [--csv csv]
"""

from __future__ import annotations

import gc
import os
import select
import subprocess
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # bench's helpers, and this checkout's fastload

from _common import command, heading, parser, publish, write_csv  # noqa: E402
from peers._common import tree_pids  # noqa: E402

MiB = 2**20
CONFIGS = [f"{k}-w{n}" for k in ("fastload-fast", "fastload-generic", "torch-getitems", "torch-pil", "dali-cpu")
           for n in (2, 8)]
FIELDS = {b"Pss:": "pss", b"Pss_Anon:": "anon", b"Pss_File:": "file", b"Pss_Shmem:": "shmem",
          b"Private_Clean:": "uss", b"Private_Dirty:": "uss", b"Rss:": "rss"}


# ------------------------------------------------------------------------------------------ sampling

def rollup(pid: int) -> dict[str, int] | None:
    """One process's figures in bytes from /proc/PID/smaps_rollup (None: it is gone)."""
    out = dict.fromkeys(set(FIELDS.values()), 0)
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            for line in fh:
                key = FIELDS.get(line.split(b" ", 1)[0])
                if key:
                    out[key] += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return out


def mapped_under(pid: int, root: str) -> int:
    """PSS in bytes of the mappings of files under ``root`` (fastload's shards) in one process (/proc/PID/smaps)."""
    total, inside = 0, False
    try:
        with open(f"/proc/{pid}/smaps", "rb") as fh:
            for line in fh:
                first = line.split(b" ", 1)[0]
                if b"-" in first and not first.endswith(b":"):  # a mapping's header line
                    parts = line.split(None, 5)
                    inside = len(parts) == 6 and parts[5].strip().decode(errors="replace").startswith(root)
                elif inside and first == b"Pss:":
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return 0
    return total


def tree(root: int, data: str | None = None) -> dict:
    """The tree's sums (bytes) and process count; ``data``: also the PSS of mapped files under it."""
    pids = tree_pids(root)
    total = dict.fromkeys(set(FIELDS.values()), 0)
    n = biggest = 0
    for pid in pids:
        r = rollup(pid)
        if r is not None:
            n += 1
            biggest = max(biggest, r["pss"])
            for k, v in r.items():
                total[k] += v
    total["procs"], total["biggest"] = n, biggest  # biggest: the largest one process's PSS (which one grew)
    if data is not None:
        total["shards"] = sum(mapped_under(pid, data) for pid in pids)
    return total


def measure(config: str, args) -> dict:
    """Run ``config`` in a child process and sample its tree; the row of the report."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", config, "--data", str(args.data),
           "--per-class", str(args.per_class), "--epochs", str(args.epochs)] + (["--photos"] if args.photos else [])
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    data = str(Path(args.data).resolve())
    fd, buf = child.stdout.fileno(), b""
    samples, ends, idle, t0, started = [], [], None, time.monotonic(), None
    while True:
        ready, _, _ = select.select([fd], [], [], args.interval)
        if not ready:
            if started is not None:
                s = tree(child.pid)
                s["t"] = time.monotonic() - started
                samples.append(s)
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            word = line.split()
            if not word:
                continue
            if word[0] == b"READY":
                idle, started = tree(child.pid, data), time.monotonic()
                child.stdin.write(b"go\n")
                child.stdin.flush()
            elif word[0] == b"EPOCH":
                s = tree(child.pid, data)
                s.update(epoch=int(word[1]), images=int(word[2]), t=time.monotonic() - started,
                         slots=int(word[3]), slot_bytes=int(word[4]))
                ends.append(s)
                samples.append(s)
                child.stdin.write(b"go\n")
                child.stdin.flush()
    rc = child.wait()
    err = child.stderr.read().decode(errors="replace")
    if rc != 0 or idle is None or len(ends) != args.epochs:
        return {"config": config, "error": (err.strip().splitlines() or [f"exit code {rc}"])[-1][:300]}
    first, later = ends[0], ends[1:]
    return {"config": config, "idle": idle, "ends": ends, "samples": samples, "seconds": time.monotonic() - t0,
            "peak_pss": max(s["pss"] for s in samples), "peak_uss": max(s["uss"] for s in samples),
            "peak_procs": max(s["procs"] for s in samples),
            "growth_pss": (max(s["pss"] for s in later) - first["pss"]) if later else 0,
            "growth_uss": (max(s["uss"] for s in later) - first["uss"]) if later else 0,
            "growth_owned": (max(s["anon"] + s["shmem"] for s in later) - first["anon"] - first["shmem"])
            if later else 0}


# ------------------------------------------------------------------------------------------ the child

def build_folder(root: Path, per_class: int) -> Path:
    """12 classes x ``per_class`` smooth random JPEGs (long side 180-640, quality 75-95), built once."""
    folder = root / f"memory_jpegs_{per_class}"
    stamp = folder / ".complete"
    if stamp.exists():
        return folder
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(12):
        (folder / f"class_{c:02d}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            long = int(rng.integers(180, 641))
            short = int(long * rng.uniform(0.6, 1.0))
            h, w = (long, short) if rng.random() < 0.5 else (short, long)
            small = rng.integers(0, 256, (h // 16 + 2, w // 16 + 2, 3), dtype=np.uint8)
            img = Image.fromarray(small).resize((w, h), Image.BICUBIC)
            img.save(folder / f"class_{c:02d}" / f"{i:05d}.jpg", quality=int(rng.integers(75, 96)))
    stamp.write_text("done\n")
    return folder


def packed(folder: Path, data: Path) -> Path:
    """fastload's packed copy of ``folder`` (packed on first use)."""
    from _common import pack_once

    return pack_once(folder, data / f"{folder.name}_packed")


def make_loader(config: str, folder: Path, data: Path):
    import torch

    import fastload
    from _common import BATCH, SIZE, crop_flip
    from peers._common import pil_train_transform
    from peers._torchdata import ImageFiles

    kind, n = config.rsplit("-w", 1)
    n = int(n)
    opts = dict(batch_size=BATCH, shuffle=True, num_workers=n, drop_last=True, persistent_workers=True)
    if kind in ("fastload-fast", "torch-getitems"):
        ds = fastload.open(packed(folder, data), transforms={"image": crop_flip()})
        if kind == "fastload-fast":
            return fastload.DataLoader(ds, **opts)
        return torch.utils.data.DataLoader(ds, **opts)
    if kind in ("fastload-generic", "torch-pil"):
        ds = ImageFiles(str(folder), pil_train_transform(SIZE, use_torchvision=False)[0])
        if kind == "fastload-generic":
            return fastload.DataLoader(ds, **opts)
        return torch.utils.data.DataLoader(ds, **opts)
    if kind == "dali-cpu":
        return dali_loader(str(folder), BATCH, n, SIZE)
    raise ValueError(f"unknown configuration {config!r}; expected one of {', '.join(CONFIGS)}")


def dali_loader(root: str, batch: int, threads: int, size: int):
    """bench/peers/dali_peer.py's pipeline (CPU-only), as an iterable of image batches per epoch."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=None, seed=1)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="Reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=size, resize_y=size)
        return fn.flip(images, horizontal=fn.random.coin_flip(probability=0.5)), labels

    p = pipe()
    p.build()
    it = DALIGenericIterator(p, ["image", "label"], reader_name="Reader", last_batch_policy=LastBatchPolicy.DROP,
                             auto_reset=True)

    class Epochs:
        def __iter__(self):
            for out in it:
                yield out[0]["image"], out[0]["label"]

    return Epochs()


def child(config: str, args) -> int:
    warnings.simplefilter("ignore")
    folder = photo_or_synthetic(args)
    loader = make_loader(config, folder, args.data)
    gc.collect()
    handshake("READY")
    for epoch in range(1, args.epochs + 1):
        n = 0
        for images, _labels in loader:
            n += images.shape[0]
        images = _labels = None
        gc.collect()
        stats = loader.stats() if hasattr(loader, "stats") and getattr(loader, "fast_path", False) else {}
        handshake(f"EPOCH {epoch} {n} {stats.get('slots', -1)} {stats.get('slot_bytes', -1)}")
    return 0


def handshake(line: str) -> None:
    """Tell the sampling process where we are, and wait until it has taken its sample."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    sys.stdin.readline()


def photo_or_synthetic(args) -> Path:
    if args.photos:
        from _common import photo_folder

        return photo_folder(args.data, args.per_class)
    return build_folder(args.data, args.per_class)


# ------------------------------------------------------------------------------------------ report

def mib(x: float) -> str:
    return f"{x / MiB:,.0f}"


def report(rows: list[dict], args, not_run: dict[str, str]) -> list[str]:
    import platform

    import torch

    lines = [heading("Host memory of the process tree per loader"), "",
             f"`{command()}` on {platform.node() or 'this machine'} ({os.cpu_count()} CPUs, "
             f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB), torch "
             f"{torch.__version__}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
             f"{args.epochs} epochs of {12 * args.per_class:,} JPEGs ({'bench/photos.py' if args.photos else 'synthetic'}); "
             f"RandomResizedCrop 224 + flip, batch 64, shuffle, drop_last, persistent workers. Tree sampled every "
             f"{args.interval * 1000:.0f} ms from /proc/PID/smaps_rollup; the machine was shared with other jobs "
             f"(memory does not depend on timing much; peaks may). MiB throughout.", "",
             "| configuration | procs | idle PSS | peak PSS | peak USS | PSS at epoch ends | growth after epoch 1 "
             "(PSS / USS / anon + shmem) | last epoch: anon / file / shmem / shards | s |",
             "|---|---:|---:|---:|---:|---|---:|---|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['config']} | | | | | failed: {r['error']} | | | |")
            continue
        last = r["ends"][-1]
        lines.append(
            f"| {r['config']} | {r['peak_procs']} | {mib(r['idle']['pss'])} | {mib(r['peak_pss'])} | "
            f"{mib(r['peak_uss'])} | {' / '.join(mib(e['pss']) for e in r['ends'])} | "
            f"{r['growth_pss'] / MiB:+.1f} / {r['growth_uss'] / MiB:+.1f} / {r['growth_owned'] / MiB:+.1f} | "
            f"{mib(last['anon'])} / {mib(last['file'])}"
            f" / {mib(last['shmem'])} / {mib(last['shards'])} | {r['seconds']:.0f} |")
    for r in rows:
        if "error" not in r and r["ends"][-1]["slots"] >= 0:
            e = r["ends"][-1]
            lines.append(f"\n{r['config']}: host slot ring after the last epoch: {e['slots']} slots, "
                         f"{e['slot_bytes'] / MiB:.1f} MiB (``loader.stats()``).")
    lines += ["", "procs: the most processes the tree had. idle: after the loader was built, before the first batch. "
              "shards: PSS of mapped files under the data folder (fastload's shards: page cache, clean and "
              "reclaimable; the PIL rows read files with read(), whose page cache no process's PSS shows). "
              "growth: largest epoch-end figure after epoch 1 minus epoch 1's; anon + shmem is what the tree allocated "
              "(bench/soak.py's check), while total PSS also moves with other processes on the machine mapping the same "
              "libraries (torch's are ~200 MiB of file pages). DALI's file reader maps the JPEGs it reads, so its "
              "shards column is their page cache."]
    for name, why in not_run.items():
        lines.append(f"\nNot run: **{name}**: {why}")
    return lines


def main() -> int:
    ap = parser(__doc__, per_class=100, epochs=5, out=True, csv=True)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, from: " + ", ".join(CONFIGS))
    ap.add_argument("--interval", type=float, default=0.05, help="seconds between samples of the tree")
    ap.add_argument("--photos", action="store_true", help="bench/photos.py's photographs instead of synthetic JPEGs")
    ap.add_argument("--child", default=None, help=argparse_hidden())
    args = ap.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    if args.child:
        return child(args.child, args)
    packed(photo_or_synthetic(args), args.data)  # built and packed once, before any child is measured
    not_run = {"FFCV": ("it needs its own virtualenv with Debian's libopencv-dev + libturbojpeg and a source "
                        "build of ffcv 1.0.2 (bash bench/setup_peers.sh ffcv), and this script has no runner for "
                        "that virtualenv yet")}
    rows = []
    for config in args.configs.split(","):
        r = measure(config, args)
        rows.append(r)
        print(f"{config}: " + (r["error"] if "error" in r else
                               f"peak PSS {mib(r['peak_pss'])} MiB, growth {r['growth_pss'] / MiB:+.1f} MiB"),
              flush=True)
    publish(report(rows, args, not_run), args.out)
    write_csv(args.csv, ({"config": r["config"], "epoch": e.get("epoch", 0), "t": round(e["t"], 3),
                          **{k: round(e[k] / MiB, 2) for k in ("pss", "uss", "rss", "anon", "file", "shmem")},
                          "shards": round(e.get("shards", 0) / MiB, 2), "procs": e["procs"],
                          "biggest_proc_pss": round(e["biggest"] / MiB, 2)}
                         for r in rows if "error" not in r for e in r["samples"]))
    return 0


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
