"""CPU cost per image of recipes_bench.py's rows, split by who spends it: a measure that a loaded machine does not
skew the way it skews samples/s (a shared machine's wall times mean little; CPU seconds per image move far less).

For each (recipe, loader) asked for, the loader of recipes_bench.py is built and drained for a warm-up epoch (the
pack-once cache, worker start-up, first-batch allocations), then ``--repeat`` times for ``--epochs`` epochs with
the CPU time read before and after from /proc: per thread of this process (the training thread, which collates
and normalizes; fastload's producer thread, which plans and fills; the native decode threads and any other
thread the libraries made) and per child process (torch's workers, fastload's per-sample fallback workers). The
figures are CPU milliseconds per image, the median over the repeats; nothing else runs in the measured loop (no
statistics, no training step).

    bench/.venvs/timm/bin/python bench/recipes_cpu.py --recipes "timm train,tv v2 recipe" --loaders open,import
    bench/.venvs/timm/bin/python bench/recipes_cpu.py --photos 150 ...   # bench/photos.py's real photos
    bench/.venvs/timm/bin/python bench/recipes_cpu.py --kernels --repeat 5  # the profiled parts alone

Loaders: ``torch`` (torch's DataLoader + ImageFolder), ``open`` (fastload.open + fastload.DataLoader), ``import``
(fastload.DataLoader(ImageFolder): the one changed import). Needs torchvision and timm (the test-only venv).
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastload  # noqa: E402
from _common import parser  # noqa: E402
from recipes_bench import folder_samples, recipes, synthetic_folder  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(stat_path: str) -> float:
    """utime + stime of a /proc stat file, in seconds (0 when the thread or process is gone)."""
    try:
        with open(stat_path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _children(pid: int) -> list[int]:
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def snapshot() -> tuple[dict[int, tuple[str, float]], float, float]:
    """({thread id: (role, CPU seconds)} of this process's live threads, the process's CPU seconds (ended threads
    included), its child processes' CPU seconds). Roles: 'main' (the training thread), 'python threads'
    (fastload's producer and any other Python thread), 'native threads' (threads Python did not start: the decode
    pool, torch's intra-op threads)."""
    pid = os.getpid()
    py = {t.native_id for t in threading.enumerate()}
    threads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        t = int(tid)
        role = "main" if t == pid else "python threads" if t in py else "native threads"
        threads[t] = (role, _cpu(f"/proc/{pid}/task/{tid}/stat"))
    children, stack = 0.0, _children(pid)
    while stack:
        c = stack.pop()
        if os.path.isdir(f"/proc/{c}/task"):
            children += sum(_cpu(f"/proc/{c}/task/{t}/stat") for t in os.listdir(f"/proc/{c}/task"))
            stack += _children(c)
    return threads, _cpu(f"/proc/{pid}/stat"), children


def spent(before: tuple, after: tuple) -> dict[str, float]:
    """CPU seconds between two snapshots by role; 'ended threads': threads that ended in between (an epoch's
    producer thread), the process's figure less its live threads'; 'children': the worker processes'."""
    out = {"main": 0.0, "python threads": 0.0, "native threads": 0.0, "ended threads": 0.0, "children": 0.0}
    for t, (role, cpu) in after[0].items():
        out[role] += cpu - before[0].get(t, (role, 0.0))[1]
    out["ended threads"] = (after[1] - before[1]) - sum(v for k, v in out.items() if k != "ended threads")
    out["children"] = after[2] - before[2]
    return out


def perf_control(command: str) -> None:
    """'enable' / 'disable' to a ``perf record --control fifo:PATH -D -1`` run whose fifo $PERF_CTL names, so
    that a profile holds the measured epochs only (not imports, packing or the warm-up)."""
    path = os.environ.get("PERF_CTL")
    if path:
        with open(path, "w") as f:
            f.write(command + "\n")


def drain(loader, epochs: int) -> int:
    n = 0
    for _ in range(epochs):
        for images, _labels in loader:
            n += images.shape[0]
    return n


def best_cpu(fn: Callable[[], Any], repeat: int) -> float:
    """The least CPU seconds (this process, every thread) of ``repeat`` calls of ``fn``."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def kernels(repeat: int) -> None:
    """The parts this file's profile named, alone, in CPU ms per image (64 images of 224 x 224): timm's geometric
    ops' affine warp (bilinear, bicubic; FASTLOAD_SIMD=scalar for the scalar walk), planning timm train's batch
    (RandAugment, RandomErasing, the crop), and ToDtype + Normalize's one pass (``_C.affine_u8_f32``)."""
    import numpy as np
    from PIL import Image

    from fastload import _C
    from fastload._augment.engine_native import run_native
    from fastload._augment.plan import BICUBIC, BILINEAR, plan_batch
    from fastload._augment.timm_policies import TimmOp, TimmRandAugment
    from fastload._draws import SampleDraws
    from fastload.transforms import ImagePipeline

    n, rng = 64, np.random.default_rng(0)
    tiles = np.stack([np.asarray(Image.fromarray(rng.integers(0, 256, (28, 28, 3), np.uint8)).resize((224, 224)))
                      for _ in range(n)])
    pool = _C.Pool(0)
    for name, interpolation in (("bilinear", BILINEAR), ("bicubic", BICUBIC)):
        ops = [TimmOp(o, 1.0, 9, magnitude_std=0.5, interpolation=interpolation)
               for o in ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")]
        plan = plan_batch([TimmRandAugment(ops, 1)], np.tile([224, 224], (n, 1)), np.random.default_rng(0))
        cpu = best_cpu(lambda plan=plan: run_native(tiles.copy(), plan, pool), repeat)
        print(f"affine warp, {name}: {1e3 * cpu / n:.3f} (the copy of the tiles included)", flush=True)
    pipe = ImagePipeline(recipes()["timm train"]())
    h, w = np.full(n, 375), np.full(n, 500)
    plan_all = lambda: [pipe.plan(h, w, SampleDraws(0, 0, np.arange(b * n, b * n + n))) for b in range(20)]  # noqa: E731
    print(f"planning a timm train batch: {1e3 * best_cpu(plan_all, repeat) / (20 * n):.3f}", flush=True)
    x = torch.randint(0, 256, (n, 224, 224, 3), dtype=torch.uint8)
    out = torch.empty((n, 224, 224, 3), dtype=torch.float32)
    a, b = [1 / 255 / 0.229, 1 / 255 / 0.224, 1 / 255 / 0.225], [-0.485 / 0.229, -0.456 / 0.224, -0.406 / 0.225]
    normalize = lambda: _C.affine_u8_f32(x.numpy(), out.numpy(), a, b, True)  # noqa: E731
    print(f"ToDtype + Normalize (a batch of {n}): {1e3 * best_cpu(normalize, repeat * 3) / n:.4f}", flush=True)


def main() -> None:
    ap = parser(__doc__, epochs=2, batch_size=64, repeat=3)
    ap.add_argument("--count", type=int, default=512, help="synthetic photo-like JPEGs (8 classes)")
    ap.add_argument("--photos", type=int, default=None, help="use bench/photos.py's real photos, N per class")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--recipes", default="timm train,tv v2 recipe,tv classic,timm eval")
    ap.add_argument("--loaders", default="open,import")
    ap.add_argument("--kernels", action="store_true", help="the profiled parts alone (warp, planning, Normalize)")
    args = ap.parse_args()
    if args.kernels:
        print(f"fastload from {Path(fastload.__file__).parent}; CPU ms per image, best of {args.repeat}", flush=True)
        kernels(args.repeat)
        return
    import torchvision

    if args.photos:
        from _common import photo_folder
        folder = photo_folder(args.data, args.photos)
    else:
        folder = synthetic_folder(args.data, args.count)
    os.environ["FASTLOAD_CACHE_DIR"] = str((args.data / "recipes_cache").resolve())
    options = dict(batch_size=args.batch_size, shuffle=True, num_workers=args.workers, drop_last=True,
                   persistent_workers=True)
    made = recipes()
    import timm.data

    # timm's DeiT setting (bicubic: the default of its train.py's configs), next to recipes_bench.py's bilinear one
    made["timm train bicubic"] = lambda: timm.data.create_transform(
        224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25, interpolation="bicubic")
    builders = {
        "torch": lambda m: torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(str(folder), transform=m()),
                                                       **options),
        "open": lambda m: fastload.DataLoader(fastload.open(folder, transforms={"image": m()}), **options),
        "import": lambda m: fastload.DataLoader(torchvision.datasets.ImageFolder(str(folder), transform=m()),
                                                **options),
    }
    print(f"{len(folder_samples(folder)[1])} images from {folder}, batch {args.batch_size}, {args.workers} workers, "
          f"{args.epochs} epoch(s) x {args.repeat} repeats after a warm-up epoch; fastload from "
          f"{Path(fastload.__file__).parent}; CPU ms per image, median (min-max of the total)", flush=True)
    for r in args.recipes.split(","):
        for k in args.loaders.split(","):
            loader = builders[k](made[r])
            drain(loader, 1)
            runs = []
            for _ in range(args.repeat):
                perf_control("enable")
                before = snapshot()
                n = drain(loader, args.epochs)
                after = snapshot()
                perf_control("disable")
                runs.append({role: 1e3 * v / n for role, v in spent(before, after).items()})
            totals = [sum(run.values()) for run in runs]
            parts = ", ".join(f"{role} {statistics.median(run[role] for run in runs):.2f}" for role in runs[0])
            print(f"{r:>14} | {k:>6} | total {statistics.median(totals):.2f} ({min(totals):.2f}-{max(totals):.2f}) "
                  f"| {parts}", flush=True)
            del loader


if __name__ == "__main__":
    main()
