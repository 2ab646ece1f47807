"""Loader benchmark: the JPEG training pipeline (RandomResizedCrop 224 + flip, uint8 out) on the photo
ImageFolder, fastload vs torch.utils.data.DataLoader + pillow-simd (num_workers swept), against the
ceiling of plain libjpeg-turbo decoding on the same cores. One run, medians over repetitions.

    python bench/loader_bench.py [--per-class 200] [--repeat 5] [--batch-size 64] [--csv out.csv]

The torch peer runs torchvision's RandomResizedCrop algorithm on PIL exactly as torchvision's
``F.resized_crop`` does (crop, then BILINEAR resize with antialiasing, then flip), because there is
no CPU torchvision on this machine; the arithmetic is fastload.transforms' (tested against
torchvision's formulas).
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastload  # noqa: E402
from _common import crop_flip, pack_once, parser, photo_folder, write_csv  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fastload._native import native  # noqa: E402

PIPELINE = crop_flip(224)


class PilFolder(torch.utils.data.Dataset):
    """What a user writes today: ImageFolder-style files, PIL decode, torchvision-style transforms."""

    def __init__(self, root: Path):
        self.files = sorted(root.rglob("*.jpg"))
        classes = sorted({p.parent.name for p in self.files})
        self.labels = [classes.index(p.parent.name) for p in self.files]
        self.pipe = T.ImagePipeline(PIPELINE)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        from PIL import Image

        with Image.open(self.files[i]) as img:
            img = img.convert("RGB")
            out = T.apply_pil(self.pipe, img, np.random.default_rng())
        return torch.from_numpy(np.array(out)).permute(2, 0, 1), self.labels[i]


def run_epochs(make_loader, repeat: int) -> tuple[float, float, float]:
    """(median samples/s, median CPU s per sample, time to first batch) over ``repeat`` epochs."""
    loader = make_loader()
    rates, cpus = [], []
    t0 = time.perf_counter()
    first = None
    for ep in range(repeat + 1):  # the first epoch is warm-up
        n = 0
        c0, w0 = time.process_time(), time.perf_counter()
        for images, labels in loader:
            if first is None:
                first = time.perf_counter() - t0
            n += images.shape[0]
        wall = time.perf_counter() - w0
        if ep:
            rates.append(n / wall)
            cpus.append((time.process_time() - c0) / n)
    return statistics.median(rates), statistics.median(cpus), first


def decode_ceiling(blobs: list[bytes], threads: int, repeat: int) -> float:
    """Plain full-size libjpeg-turbo decoding of every image on ``threads`` threads (GIL released)."""
    C = native()
    rates = []
    for _ in range(repeat):
        chunks = [blobs[t::threads] for t in range(threads)]
        ths = [threading.Thread(target=lambda c=c: [C.decode_jpeg(b) for b in c]) for c in chunks]
        t = time.perf_counter()
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        rates.append(len(blobs) / (time.perf_counter() - t))
    return statistics.median(rates)


def main() -> None:
    args = parser(__doc__, per_class=200, repeat=5, batch_size=64, csv=True).parse_args()
    cores = os.cpu_count() or 1
    photos = photo_folder(args.data, args.per_class)
    packed = pack_once(photos, args.data / f"photos_{args.per_class}.fastload")
    n = len(fastload.open(packed))
    print(f"photo dataset: {n} JPEGs, {cores} cores, batch {args.batch_size}, {args.repeat} epochs after warm-up")

    rows = []
    ds = fastload.open(packed, transforms={"image": PIPELINE})
    for w in sorted({0, 1, cores}):
        r, c, f = run_epochs(lambda: fastload.DataLoader(ds, batch_size=args.batch_size, shuffle=True,
                                                         num_workers=w, drop_last=True), args.repeat)
        rows.append(("fastload", f"threads={w}", r, c, f))
    folder = PilFolder(photos)
    for w in sorted({0, 1, cores, 2 * cores}):
        r, c, f = run_epochs(lambda: torch.utils.data.DataLoader(
            folder, batch_size=args.batch_size, shuffle=True, num_workers=w, drop_last=True,
            persistent_workers=w > 0), args.repeat)
        rows.append(("torch DataLoader + pillow-simd", f"num_workers={w}", r, c, f))
    raw = fastload.open(packed, decode=False)
    blobs = [raw[i][0] for i in range(n)]
    ceiling = decode_ceiling(blobs, cores, args.repeat)
    rows.append(("libjpeg-turbo decode only (ceiling)", f"threads={cores}", ceiling, float("nan"), float("nan")))

    best = {}
    for name, cfg, r, *_ in rows:
        best[name] = max(best.get(name, 0), r)
    fl = best["fastload"]
    print("\n| loader | config | img/s (median) | main-process CPU ms/img | first batch s | fastload best / this |")
    print("|---|---|---:|---:|---:|---:|")
    for name, cfg, r, c, f in rows:
        print(f"| {name} | {cfg} | {r:,.0f} | {c * 1e3:.2f} | {f:.3f} | {fl / r:.2f}x |")
    print(f"\nfastload best vs DataLoader best: {fl / best['torch DataLoader + pillow-simd']:.2f}x; "
          f"fastload best / decode ceiling: {fl / ceiling:.0%}")
    write_csv(args.csv, rows, ["loader", "config", "samples_per_s", "main_process_cpu_s_per_sample", "first_batch_s"])


if __name__ == "__main__":
    main()
