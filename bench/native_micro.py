"""Micro-benchmark of the native core (fastload._C): images per second for

  decode     full-size decode_jpeg, one thread
  batch      decode_batch with RandomResizedCrop-style crops to 224x224, per pool size and with
             or without DCT-scaled decoding

on synthetic quality-90 JPEGs: 375x500 (ImageNet-like; a 224 crop of it is never downscaled 2x,
so DCT scaling cannot apply) and 1125x1500 (where it does). Prints a CSV to stdout (or --csv).

    python bench/native_micro.py [--images 128] [--repeat 5] [--threads 0,1,2]
                                 [--src 375x500,1125x1500] [--grain 20] [--csv out.csv]
"""

import argparse
import csv
import io
import math
import sys
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=128)
    p.add_argument("--src", default="375x500,1125x1500", help="source sizes HxW, comma-separated")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", default="0,1,2")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--grain", type=float, default=20.0, help="noise sigma; 0 = smooth, small files")
    p.add_argument("--csv", default=None, help="write here instead of stdout")
    args = p.parse_args(argv)

    from fastload import _C

    rows = []
    for src in args.src.split(","):
        h, w = (int(v) for v in src.split("x"))
        rows += bench_source(_C, h, w, args)

    f = open(args.csv, "w", newline="") if args.csv else sys.stdout
    writer = csv.writer(f)
    writer.writerow(("case", "src_hw", "pool_threads", "dct_scaling", "img_per_s", "ms_per_img",
                     "mean_kb"))
    writer.writerows(rows)
    if args.csv:
        f.close()


if __name__ == "__main__":
    main()
