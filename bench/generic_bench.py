"""Generic-path benchmark: fastload.DataLoader's shared-memory workers vs torch.utils.data.DataLoader on
plain map-style Datasets, at equal num_workers and batch size. One run, medians over repetitions.

    python bench/generic_bench.py [--repeat 5] [--batch-size 64] [--workers 1 2] [--csv out.csv]
    python bench/generic_bench.py --cases photos --photos bench/data/photos_200 --workers 2

Cases (samples cost almost no CPU to make, so the transport from workers to the main process dominates):
  small  (3, 32, 32) float32 + int label   (12 KiB per sample)
  large  (3, 224, 224) uint8 + int label   (147 KiB per sample)
  large-f32 (3, 224, 224) float32 + int    (588 KiB per sample)
  tiny   (48,) int32 + int label               (200 bytes per sample: per-sample Python dominates)
  photos (with --photos DIR) a JPEG ImageFolder through the suite's Dataset (bench/peers/_torchdata.py
         ImageFiles: PIL decode, RandomResizedCrop 224 + flip written out with PIL): the Dataset's CPU work
         dominates, so the question is only whether the loader costs the workers anything
Each sample is a fresh copy of a pooled tensor, as a decode or transform would produce. Every epoch
is timed from ``iter()`` to the last batch with persistent workers (so worker start-up is left out),
after one warm-up epoch; the consumer touches one value per batch. Both loaders stay alive and their
epochs alternate, so load from elsewhere on the machine falls on both alike.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

import fastload  # noqa: E402
from _common import parser, write_csv  # noqa: E402

CASES = {
    "small": ((3, 32, 32), torch.float32, 8192),
    "large": ((3, 224, 224), torch.uint8, 2048),
    "large-f32": ((3, 224, 224), torch.float32, 1024),
    "tiny": ((48,), torch.int32, 65536),
}


class PoolDataset(torch.utils.data.Dataset):
    def __init__(self, shape: tuple, dtype: torch.dtype, n: int, pool: int = 16):
        g = torch.Generator().manual_seed(0)
        self.pool = [(torch.rand(shape, generator=g) * 255).to(dtype) for _ in range(pool)]
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.pool[i % len(self.pool)].clone(), i


def epoch_seconds(loader) -> float:
    t0 = time.perf_counter()
    for x, y in loader:
        x[(0,) * x.dim()].item()  # touch the batch
    return time.perf_counter() - t0


def measure(ds, workers: int, batch_size: int, repeat: int) -> tuple[float, float]:
    """Median samples/s of (torch, fastload), their epochs alternating."""
    loaders = [cls(ds, batch_size=batch_size, shuffle=True, num_workers=workers, persistent_workers=True)
               for cls in (torch.utils.data.DataLoader, fastload.DataLoader)]
    for loader in loaders:
        epoch_seconds(loader)  # warm-up: workers start, slots get allocated
    times: list[list[float]] = [[], []]
    for _ in range(repeat):
        for k, loader in enumerate(loaders):
            times[k].append(epoch_seconds(loader))
    del loaders
    return len(ds) / statistics.median(times[0]), len(ds) / statistics.median(times[1])


def main() -> None:
    ap = parser(__doc__, repeat=5, batch_size=64, data=False, csv=True)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=[*CASES, "photos"])
    ap.add_argument("--photos", type=Path, help="a JPEG ImageFolder for the photos case")
    args = ap.parse_args()
    rows = []
    print(f"{'case':<10} {'workers':>7} {'torch samples/s':>16} {'fastload samples/s':>19} {'ratio':>7}")
    if "photos" in args.cases and args.photos is None:
        ap.error("the photos case needs --photos DIR (e.g. bench/data/photos_200, made by bench/photos.py)")
    for case in args.cases:
        if case == "photos":
            from peers._common import pil_train_transform
            from peers._torchdata import ImageFiles

            ds = ImageFiles(str(args.photos), pil_train_transform(224, use_torchvision=False)[0])
            shape, dtype = (3, 224, 224), torch.uint8
        else:
            shape, dtype, n = CASES[case]
            ds = PoolDataset(shape, dtype, n)
        for w in args.workers:
            t, f = measure(ds, w, args.batch_size, args.repeat)
            rows.append({"case": case, "shape": "x".join(map(str, shape)), "dtype": str(dtype).split(".")[-1],
                         "workers": w, "batch_size": args.batch_size, "torch_samples_s": round(t, 1),
                         "fastload_samples_s": round(f, 1), "ratio": round(f / t, 3)})
            print(f"{case:<10} {w:>7} {t:>16,.0f} {f:>19,.0f} {f / t:>6.2f}x", flush=True)
    write_csv(args.csv, rows)


if __name__ == "__main__":
    main()
