"""`make demo`: build the photo ImageFolder, pack it with `fastload pack`, read it back, summarise.

The photos are real photographs shipped inside PyPI wheels (see bench/photos.py).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastload  # noqa: E402
from photos import build_photo_folder  # noqa: E402


def fastload_cli(*args: str) -> None:
    cmd = [sys.executable, "-m", "fastload.cli", *args]
    print("$ fastload " + " ".join(args), flush=True)
    subprocess.run(cmd, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("demo_out"))
    ap.add_argument("--per-class", type=int, default=40)
    args = ap.parse_args()
    photos, packed = args.out / "photos", args.out / "packed"

    print("== 1. photo ImageFolder from real photographs in PyPI wheels", flush=True)
    info = build_photo_folder(photos, per_class=args.per_class, seed=0)
    keep = ("count", "total_bytes", "bytes", "width", "height", "quality", "subsampling", "progressive", "grayscale")
    for k in keep:
        print(f"  {k:<12} {info[k]}")
    print(f"  {'classes':<12} {len(info['sources'])}: " + ", ".join(info["sources"]), flush=True)

    print("\n== 2. pack", flush=True)
    fastload_cli("pack", str(photos), str(packed), "--overwrite", "--shard-size", "4MB")
    fastload_cli("inspect", str(packed))
    fastload_cli("verify", str(packed))

    print("\n== 3. read back", flush=True)
    ds = fastload.open(packed)
    raw = fastload.open(packed, decode=False)
    files = sorted(p for p in photos.rglob("*.jpg"))
    assert len(ds) == len(files), (len(ds), len(files))
    t0 = time.perf_counter()
    shapes, labels = [], []
    for i in range(len(ds)):
        img, label = ds[i]
        shapes.append(tuple(img.shape))
        labels.append(label)
    dt = time.perf_counter() - t0
    same = sum(raw[i][0] == files[i].read_bytes() for i in range(len(ds)))
    counts = np.bincount(labels, minlength=len(ds.classes))
    hs = [s[1] for s in shapes]
    ws = [s[2] for s in shapes]
    print(f"samples          {len(ds)} in {len(ds.classes)} classes ({', '.join(ds.classes)})")
    print(f"per class        min {counts.min()}, max {counts.max()}")
    print(f"image sizes      height {min(hs)}..{max(hs)}, width {min(ws)}..{max(ws)}")
    print(f"bytes identical  {same}/{len(ds)} JPEGs stored byte for byte (passthrough)")
    print(f"decode ds[i]     {len(ds) / dt:,.0f} img/s, one thread, full-size decode (ds[i] without transforms)")
    if same != len(ds):
        sys.exit("demo: packed bytes differ from the source files")

    print("\n== 4. training pipeline (RandomResizedCrop 224 + flip): fastload vs torch DataLoader", flush=True)
    from loader_bench import PIPELINE, PilFolder, run_epochs

    cores = os.cpu_count() or 1
    train = fastload.open(packed, transforms={"image": PIPELINE})
    fl, _, _ = run_epochs(lambda: fastload.DataLoader(train, batch_size=32, shuffle=True, num_workers=cores,
                                                      drop_last=True), 2)
    tl, _, _ = run_epochs(lambda: torch.utils.data.DataLoader(PilFolder(photos), batch_size=32, shuffle=True,
                                                              num_workers=cores, drop_last=True,
                                                              persistent_workers=True), 2)
    print(f"fastload.DataLoader(num_workers={cores})            {fl:8,.0f} img/s")
    print(f"torch DataLoader + pillow-simd (num_workers={cores}) {tl:8,.0f} img/s")
    print(f"speed-up {fl / tl:.2f}x (small demo set, 2 epochs; `python bench/loader_bench.py` for the full benchmark)")


if __name__ == "__main__":
    main()
