"""A fastload dataset under torch's own DataLoader (``Dataset.__getitems__``), against torch's DataLoader over
pillow-simd, on the same photos with the same workers.

A script that keeps ``torch.utils.data.DataLoader`` (or a framework that rebuilds the loader: accelerate's
``DataLoaderShard``, HF Trainer, Ray Train) and only swaps the dataset for ``fastload.open(...)`` gets one
native batch decode per batch in each worker (``fastload/_getitems.py``). This measures what that is worth:

  torch DataLoader + fastload dataset   ``torch.utils.data.DataLoader(fastload.open(packed, transforms=...))``
  torch DataLoader + pillow-simd        the same loader over the JPEG files: ImageFolder's listing, PIL open +
                                        convert, torchvision's RandomResizedCrop algorithm written out with PIL
                                        (there is no torchvision here), flip; bench/peers' torch baseline
  accelerator.prepare(fastload.DataLoader)  accelerate's documented call on fastload's loader: rebuilt into its
                                        DataLoaderShard (which then calls __getitems__ in its workers)
  fastload.DataLoader (fast path)       for reference: the same dataset on fastload's own loader
  torch DataLoader, decoded up front    the ceiling: one batch decoded once and handed out again, so only
                                        torch's per-batch collate and shared-memory hand-over are timed

All: RandomResizedCrop 224 + horizontal flip, batch 64, shuffle, drop_last, num_workers=2 (worker processes
for torch's loaders and accelerate's, decode threads for fastload's own), persistent workers, uint8 batches;
bench/photos.py's real photographs (1,800 files, long side 180-640), packed by settings_bench.build.

Each configuration runs ``--epochs`` epochs per round (the loop only takes the batches); rounds alternate
after one warm-up round (so drift on a shared machine hits every row alike), each row is the median over
rounds, and ratios are within this run.

    python bench/getitems_bench.py [--rounds 5] [--epochs 2] [--out bench/results/getitems_cpu2.md] [--csv ...]
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402

BATCH, WORKERS, SIZE = 64, 2, 224
TORCH_FASTLOAD = "torch DataLoader + fastload dataset"
TORCH_PIL = "torch DataLoader + pillow-simd"
CEILING = "torch DataLoader, batches decoded once up front (its own per-batch cost: the ceiling of any dataset)"


def drain(loader, epochs: int):
    def run() -> int:
        n = 0
        for _ in range(epochs):
            for images, _labels in loader:
                n += images.shape[0]
        return n
    return run


class Predecoded(torch.utils.data.Dataset):
    """The ceiling of any dataset under torch's DataLoader here: one batch of the fastload dataset's items,
    decoded once up front and handed out again for every batch (``__getitems__``), so a round costs only what
    torch's loader does per batch (default_collate into a fresh shared-memory batch in the worker, the
    file-descriptor hand-over, the main process's rebuild), never decoding."""

    def __init__(self, ds):
        self.n = len(ds)
        self.items = ds.__getitems__(list(range(BATCH)))

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, indices):
        return self.items[: len(indices)]


def loaders(data: Path) -> dict:
    """name -> a loader over the same photos (see the module docstring)."""
    from accelerate import Accelerator
    from peers._common import pil_train_transform
    from peers._torchdata import ImageFiles
    from photos import build_photo_folder
    from settings_bench import build

    folder = data / "photos_150"
    build_photo_folder(folder, per_class=150, seed=0, progress=False)
    transform, _ = pil_train_transform(SIZE, use_torchvision=False)
    ds = build(data / "settings_photos", folder,
               transforms={"image": [T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip()]})
    common = dict(batch_size=BATCH, shuffle=True, num_workers=WORKERS, drop_last=True, persistent_workers=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)  # the rebuild warning: that is the point here
        prepared = Accelerator(cpu=True).prepare(fastload.DataLoader(ds, **common))
    return {TORCH_FASTLOAD: torch.utils.data.DataLoader(ds, **common),
            TORCH_PIL: torch.utils.data.DataLoader(ImageFiles(str(folder), transform), **common),
            "accelerator.prepare(fastload.DataLoader)": prepared,
            "fastload.DataLoader (fast path)": fastload.DataLoader(ds, **common),
            CEILING: torch.utils.data.DataLoader(Predecoded(ds), **common)}


def rounds(configs: dict, count: int) -> dict[str, list[float]]:
    """images/s of each configuration per round: one warm-up round, then ``count`` alternating rounds."""
    for fn in configs.values():
        fn()  # warm-up: page cache, worker processes, native threads
    rates: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(count):
        for name, fn in configs.items():
            t = time.perf_counter()
            n = fn()
            rates[name].append(n / (time.perf_counter() - t))
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("bench/data"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="markdown table")
    ap.add_argument("--csv", type=Path, default=None)
    args = ap.parse_args()
    configs = {name: drain(loader, args.epochs) for name, loader in loaders(args.data).items()}
    rates = rounds(configs, args.rounds)
    med = {k: statistics.median(v) for k, v in rates.items()}
    cmd = "python bench/getitems_bench.py " + " ".join(sys.argv[1:])
    lines = [f"# A fastload dataset under torch's DataLoader ({os.cpu_count()} CPUs), {time.strftime('%Y-%m-%d')}", "",
             (f"`{cmd.strip()}`: {args.epochs} epochs of 1,800 real photos per round (RandomResizedCrop {SIZE} + "
              f"flip, batch {BATCH}, num_workers={WORKERS}, persistent); medians of {args.rounds} alternating "
              f"rounds after a warm-up round; ratios within this run. torch {torch.__version__}."),
             "", f"| loader | images/s (median) | min-max | vs {TORCH_PIL} |", "|---|---:|---:|---:|"]
    for name in configs:
        lines.append(f"| {name} | {med[name]:,.0f} | {min(rates[name]):,.0f}-{max(rates[name]):,.0f} | "
                     f"{med[name] / med[TORCH_PIL]:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    if args.out:
        args.out.write_text(text)
    if args.csv:
        with args.csv.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["loader", "round", "images_per_s"])
            for name, values in rates.items():
                w.writerows((name, r, f"{v:.1f}") for r, v in enumerate(values))


if __name__ == "__main__":
    main()
