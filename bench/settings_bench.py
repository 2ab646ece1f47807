"""fastload at the settings users copy from tuning guides, against the reference of the same run.

  tiny   int32[64] + int64 label, 1M rows, batch 1024, shuffle: fastload at num_workers 0, 2 and 8 vs the
         numpy gather ceiling (np.take of each batch's rows into a warm buffer, 1 thread); and short
         epochs (200-byte records, 16 batches of 4,096 per epoch) at num_workers 0, 2 and 8
  raw    uint8 3x224x224, 2,000 rows, batch 64, shuffle, num_workers=2 vs the gather ceiling (np.take into
         a warm buffer, 1 and 2 threads; the best counts)
  jpeg   CPU time per image of RandomResizedCrop 224 + flip: the whole fastload DataLoader (shuffled
         epochs of batch 64 from the packed files at num_workers 0 and 2; the process's CPU time, every
         thread counted) and its native call alone (decode_batch, one thread), vs a full-size
         libjpeg-turbo decode of the same files, on bench/photos.py's real photographs (1,800 files,
         long side 180-640)

Every configuration runs once per round, rounds alternate (so drift on a shared machine hits every row
alike), and each row is the median over rounds; ratios are within the run.

    python bench/settings_bench.py [--rounds 5] [--out bench/results/settings_cpu2.md]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastload  # noqa: E402
from _common import alternate, build, command, crop_flip, heading, medians, packed_photos, parser  # noqa: E402
from _common import photo_folder  # noqa: E402
from arrays_bench import ceiling, drain  # noqa: E402


def rounds(configs: dict, n: int, count: int) -> dict[str, float]:
    """samples/s of each configuration (``n`` samples a call): the median over ``count`` alternating rounds."""
    return {k: n / statistics.median(r.wall for r in v) for k, v in alternate(configs, count).items()}


def tiny(data: Path, count: int) -> list[str]:
    rng = np.random.default_rng(0)
    rows = 1_000_000
    ds = build(data / "settings_tiny", {"tokens": rng.integers(0, 50000, (rows, 64), dtype=np.int32),
                                        "label": rng.integers(0, 1000, rows).astype(np.int64)})
    n = (len(ds) // 1024) * 1024
    configs = {"numpy gather ceiling, 1 thread": ceiling(ds, 1024, 1)}
    for w in (0, 2, 8):
        dl = fastload.DataLoader(ds, batch_size=1024, shuffle=True, num_workers=w, drop_last=True, seed=0)
        configs[f"fastload, num_workers={w}"] = lambda dl=dl: drain(dl)
    rates = rounds(configs, n, count)
    ref = rates["numpy gather ceiling, 1 thread"]
    lines = ["## Tiny records: int32[64] + int64 label, 1M rows, batch 1024, shuffle", "",
             "| reader | M samples/s | vs ceiling |", "|---|---:|---:|"]
    lines += [f"| {k} | {v / 1e6:.2f} | {v / ref:.2f} |" for k, v in rates.items()]
    return lines + [""] + short_epochs(data, count)


def short_epochs(data: Path, count: int) -> list[str]:
    """Epochs of 16 batches (65,536 rows, batch 4,096): what an epoch costs besides its batches (starting
    threads, iterators) shows here; 20 epochs per round, non-persistent loaders as users write them."""
    rng = np.random.default_rng(1)
    rows, bs, epochs = 65_536, 4096, 20
    ds = build(data / "settings_tiny_short", {"tokens": rng.integers(0, 50000, (rows, 48), dtype=np.int32),
                                              "label": rng.integers(0, 1000, rows).astype(np.int64)})
    configs = {}
    for w in (0, 2, 8):
        dl = fastload.DataLoader(ds, batch_size=bs, shuffle=True, num_workers=w, drop_last=True, seed=0)
        configs[f"fastload, num_workers={w}"] = lambda dl=dl: [drain(dl) for _ in range(epochs)]
    rates = rounds(configs, rows * epochs, count)
    ref = rates["fastload, num_workers=0"]
    lines = [f"## Short epochs: int32[48] + int64 label (200 bytes), {rows:,} rows, batch {bs:,}, shuffle, "
             f"{epochs} epochs per round", "", "| reader | M samples/s | vs num_workers=0 |", "|---|---:|---:|"]
    lines += [f"| {k} | {v / 1e6:.2f} | {v / ref:.2f} |" for k, v in rates.items()]
    return lines + [""]


def raw(data: Path, count: int) -> list[str]:
    rng = np.random.default_rng(0)
    ds = build(data / "settings_raw", {"image": rng.integers(0, 255, (2000, 3, 224, 224), dtype=np.uint8),
                                       "label": rng.integers(0, 1000, 2000)})
    n = (len(ds) // 64) * 64
    dl = fastload.DataLoader(ds, batch_size=64, shuffle=True, num_workers=2, drop_last=True, seed=0)
    configs = {"numpy gather ceiling, 1 thread": ceiling(ds, 64, 1),
               "numpy gather ceiling, 2 threads": ceiling(ds, 64, 2),
               "fastload, num_workers=2": lambda: drain(dl)}
    rates = rounds(configs, n, count)
    ref = max(rates["numpy gather ceiling, 1 thread"], rates["numpy gather ceiling, 2 threads"])
    lines = ["## Raw uint8 3x224x224, 2,000 rows, batch 64, shuffle", "",
             "| reader | samples/s | vs best ceiling |", "|---|---:|---:|"]
    lines += [f"| {k} | {v:,.0f} | {v / ref:.0%} |" for k, v in rates.items()]
    return lines + [""]


def jpeg(data: Path, count: int) -> list[str]:
    from fastload import _C
    from fastload.transforms import ImagePipeline

    folder = photo_folder(data)
    blobs = [f.read_bytes() for f in sorted(folder.rglob("*.jpg"))]
    n = len(blobs)
    hw = np.array([_C.jpeg_info(b)[:2] for b in blobs], np.int64)
    plan = ImagePipeline(crop_flip(224)).plan(hw[:, 0], hw[:, 1], np.random.default_rng(0))
    lengths = np.array([len(b) for b in blobs], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    region, out, pool = b"".join(blobs), np.empty((n, 224, 224, 3), np.uint8), _C.Pool(0)

    def rrc():
        _C.decode_batch(pool, [region], np.zeros(n, np.int64), offsets, lengths, np.zeros(n, np.uint8),
                        hw.astype(np.int32), plan.crops.astype(np.int32), plan.flips.astype(np.uint8), out)

    def full():
        for b in blobs:
            _C.decode_jpeg(b)

    ds = packed_photos(data, folder, crop_flip(224))
    loaders = {w: fastload.DataLoader(ds, batch_size=64, shuffle=True, num_workers=w, drop_last=True,
                                      persistent_workers=w > 0) for w in (0, 2)}

    def epoch(w):
        def run():
            return sum(int(labels.shape[0]) for _, labels in loaders[w])
        return run

    configs = {"fastload DataLoader, num_workers=0 (whole process)": epoch(0),
               "fastload DataLoader, num_workers=2 (whole process)": epoch(2),
               "RandomResizedCrop 224 + flip (decode_batch, 1 thread)": rrc, "full-size decode (decode_jpeg)": full}
    med = medians({k: [r.cpu / (r.result or n) * 1e6 for r in v] for k, v in alternate(configs, count).items()})
    ref = med["full-size decode (decode_jpeg)"]
    lines = [f"## JPEG: CPU time per image, {n} real photographs (long side 180-640)", "",
             "| work | CPU us/image | vs full decode |", "|---|---:|---:|"]
    lines += [f"| {k} | {v:.0f} | {v / ref:.2f} |" for k, v in med.items()]
    return lines + [""]


def main() -> None:
    ap = parser(__doc__, rounds=5, out=True)
    ap.add_argument("--cases", nargs="+", default=["tiny", "raw", "jpeg"], choices=["tiny", "raw", "jpeg"])
    args = ap.parse_args()
    lines = [heading("fastload at users' settings"), "",
             f"`{command()}`: medians of {args.rounds} alternating rounds; ratios within this run.", ""]
    for case in args.cases:
        lines += {"tiny": tiny, "raw": raw, "jpeg": jpeg}[case](args.data, args.rounds)
        print("\n".join(lines), flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
