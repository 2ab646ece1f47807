"""Micro-benchmark of the native core (fastload._C). Two cases (--case):

decode (default): images per second for
  decode     full-size decode_jpeg, one thread
  batch      decode_batch with RandomResizedCrop-style crops to 224x224, per pool size and with
             or without DCT-scaled decoding
on synthetic quality-90 JPEGs: 375x500 (ImageNet-like; a 224 crop of it is never downscaled 2x,
so DCT scaling cannot apply) and 1125x1500 (where it does).

gather: rows and GB per second of gather_rows (per pool size) against
np.take(column, idx, axis=0, out=out), reading from a column file memory-mapped from the page
cache (larger than the CPU cache) into a preallocated output ("warm") or a fresh np.empty per
batch ("fresh": page faults included), in random and sequential order, for 3x224x224 uint8 rows
(batch 256), 256-byte rows and int64 labels (batch 4096).

Prints a CSV to stdout (or --csv).

    python bench/native_micro.py [--images 128] [--repeat 5] [--threads 0,1,2]
                                 [--src 375x500,1125x1500] [--grain 20] [--csv out.csv]
    python bench/native_micro.py --case gather [--repeat 5] [--threads 0,1,2] [--csv out.csv]
"""

import argparse
import csv
import io
import math
import mmap
import os
import sys
import tempfile
import time

import numpy as np


def synthetic_photo(rng, h, w, grain=0.0):
    """Smooth multi-scale texture plus edges, plus optional Gaussian grain (sigma in gray
    levels) to reach the file sizes of real photos (grain 20: ~100 KB at 375x500, q90)."""
    img = np.zeros((h, w, 3), np.float64)
    for cells, amp in ((4, 90), (16, 40), (64, 20), (h, 6)):
        small = rng.uniform(-amp, amp, (cells, max(1, cells * w // h), 3))
        ys = np.linspace(0, small.shape[0] - 1, h)
        xs = np.linspace(0, small.shape[1] - 1, w)
        yi, xi = np.floor(ys).astype(int), np.floor(xs).astype(int)
        y1, x1 = np.minimum(yi + 1, small.shape[0] - 1), np.minimum(xi + 1, small.shape[1] - 1)
        fy, fx = (ys - yi)[:, None, None], (xs - xi)[None, :, None]
        top = small[yi][:, xi] * (1 - fx) + small[yi][:, x1] * fx
        bot = small[y1][:, xi] * (1 - fx) + small[y1][:, x1] * fx
        img += top * (1 - fy) + bot * fy
    yy, xx = np.mgrid[0:h, 0:w]
    img[(xx - w * 0.6) ** 2 + (yy - h * 0.4) ** 2 < (h * 0.2) ** 2] += 60
    if grain:
        img += rng.normal(0, grain, img.shape)
    return np.clip(img + 128, 0, 255).astype(np.uint8)


def make_jpegs(n, h=375, w=500, quality=90, seed=0, grain=0.0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        buf = io.BytesIO()
        Image.fromarray(synthetic_photo(rng, h, w, grain)).save(buf, "JPEG", quality=quality)
        out.append(buf.getvalue())
    return out


def random_resized_crops(rng, n, h, w, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision RandomResizedCrop.get_params, vectorised loosely (10 tries, then center)."""
    crops = np.zeros((n, 4), np.int32)
    for k in range(n):
        for _ in range(10):
            area = h * w * rng.uniform(*scale)
            r = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
            cw, ch = int(round(math.sqrt(area * r))), int(round(math.sqrt(area / r)))
            if 0 < cw <= w and 0 < ch <= h:
                crops[k] = (rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1), ch, cw)
                break
        else:
            s = min(h, w)
            crops[k] = ((h - s) // 2, (w - s) // 2, s, s)
    return crops


def best_rate(fn, count, repeat):
    fn()  # warm-up: threads, scratch buffers, page faults
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return count / best


def bench_source(_C, h, w, args):
    jpegs = make_jpegs(args.images, h, w, grain=args.grain)
    blob = np.frombuffer(b"".join(jpegs), np.uint8)
    lengths = np.array([len(j) for j in jpegs], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    n = len(jpegs)
    region = np.zeros(n, np.int64)
    encoding = np.zeros(n, np.uint8)
    src_hw = np.tile(np.array([h, w], np.int32), (n, 1))
    rng = np.random.default_rng(1)
    crops = random_resized_crops(rng, n, h, w)
    flip = rng.integers(0, 2, n).astype(np.uint8)
    out = np.empty((n, args.size, args.size, 3), np.uint8)
    tag, kb = f"{h}x{w}", f"{lengths.mean() / 1024:.1f}"

    rows = []
    rate = best_rate(lambda: [_C.decode_jpeg(j) for j in jpegs], n, args.repeat)
    rows.append(("decode_full", tag, 1, "-", f"{rate:.0f}", f"{1000 / rate:.3f}", kb))
    for t in (int(x) for x in args.threads.split(",")):
        pool = _C.Pool(t)
        for dct in (False, True):
            def run():
                fails = _C.decode_batch(pool, [blob], region, offsets, lengths, encoding,
                                        src_hw, crops, flip, out, dct_scaling=dct)
                assert not fails, fails[:3]
            rate = best_rate(run, n, args.repeat)
            rows.append((f"batch_rrc_{args.size}", tag, t, "on" if dct else "off",
                         f"{rate:.0f}", f"{1000 / rate:.3f}", kb))
        del pool
    return rows


GATHER_CASES = [  # row shape, dtype, rows in the column file, batch size
    ((3, 224, 224), np.uint8, 1024, 256),
    ((256,), np.uint8, 1 << 18, 4096),
    ((), np.int64, 1 << 23, 4096),
]


def mapped_column(directory, shape, dtype, rows, seed=0):
    """A column file of random rows, memory-mapped read-only and read once (page cache and
    page tables warm, as for a shard the loader has been reading)."""
    rng = np.random.default_rng(seed)
    row_bytes = math.prod(shape) * np.dtype(dtype).itemsize
    fd, path = tempfile.mkstemp(suffix=".col", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            for start in range(0, rows, 4096):
                f.write(rng.integers(0, 256, min(4096, rows - start) * row_bytes, np.uint8))
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    finally:
        os.unlink(path)
    column = np.frombuffer(mm, dtype).reshape((rows,) + shape)
    column.sum()
    return mm, column, row_bytes


def bench_gather(_C, args):
    rows = []
    for shape, dtype, n_rows, batch in GATHER_CASES:
        mm, column, row_bytes = mapped_column(args.tmp, shape, dtype, n_rows)
        rng = np.random.default_rng(1)
        orders = {"random": rng.choice(n_rows, batch, replace=False),
                  "sequential": np.arange(batch) + n_rows // 3}
        for order, idx in orders.items():
            region = np.zeros(batch, np.int64)
            offset = idx.astype(np.int64) * row_bytes
            for out_kind in ("warm", "fresh") if row_bytes >= 4096 else ("warm",):
                warm = np.ones((batch,) + shape, dtype)

                def out():
                    return warm if out_kind == "warm" else np.empty((batch,) + shape, dtype)

                runs = [("np.take", "-", lambda: np.take(column, idx, axis=0, out=out()))]
                for t in (int(x) for x in args.threads.split(",")):
                    pool = _C.Pool(t)
                    runs.append(("gather_rows", t, lambda pool=pool: _C.gather_rows(
                        pool, [mm], region, offset, row_bytes, out())))
                for impl, threads, fn in runs:
                    rate = best_rate(fn, batch, args.repeat)
                    rows.append((row_bytes, batch, order, out_kind, impl, threads,
                                 f"{rate:.4g}", f"{rate * row_bytes / 1e9:.2f}"))
                check = out()
                _C.gather_rows(_C.Pool(0), [mm], region, offset, row_bytes, check)
                assert np.array_equal(check, column[idx])
        del column
        mm.close()
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", choices=("decode", "gather"), default="decode")
    p.add_argument("--images", type=int, default=128)
    p.add_argument("--src", default="375x500,1125x1500", help="source sizes HxW, comma-separated")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", default="0,1,2")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--grain", type=float, default=20.0, help="noise sigma; 0 = smooth, small files")
    p.add_argument("--tmp", default=None, help="gather: where to write the column files (~280 MB)")
    p.add_argument("--csv", default=None, help="write here instead of stdout")
    args = p.parse_args(argv)

    from fastload import _C

    if args.case == "gather":
        header = ("row_bytes", "batch", "order", "out", "impl", "pool_threads", "rows_per_s",
                  "gb_per_s")
        rows = bench_gather(_C, args)
    else:
        header = ("case", "src_hw", "pool_threads", "dct_scaling", "img_per_s", "ms_per_img",
                  "mean_kb")
        rows = []
        for src in args.src.split(","):
            h, w = (int(v) for v in src.split("x"))
            rows += bench_source(_C, h, w, args)

    f = open(args.csv, "w", newline="") if args.csv else sys.stdout
    writer = csv.writer(f)
    writer.writerow(header)
    writer.writerows(rows)
    if args.csv:
        f.close()

if __name__ == "__main__":
    main()
