"""JPEG below a full decode (issue 32 item 3): the fused decode + RandomResizedCrop 224 + flip of the native core
against a plain full decode of the same files, on the same number of threads, in one run.

    python bench/jpeg_bench.py [--per-class 150] [--rounds 7] [--threads 2] [--out r.md] [--csv r.csv]

Every configuration decodes every photo of bench/photos.py's folder once per round, from memory:

  fastload DataLoader      one epoch of ``fastload.DataLoader`` (``num_workers=--threads`` decode threads) over the
                           packed copy of the photos: the fused call and all the loader adds around it
  fused                    ``_C.decode_batch`` (what fastload's loader calls per batch of 64): DCT-scaled where
                           the crop allows, only the crop's rows and iMCU columns decoded, resized into a reused
                           slot, on a ``_C.Pool`` of ``--threads`` threads; the crops are drawn afresh each round
  full, fastload native    ``_C.decode_jpeg`` (libjpeg-turbo, full size, RGB, a new array per image) on
                           ``--threads`` Python threads (the GIL is released while decoding)
  full, PIL                ``Image.open(...).load()`` (Pillow's libjpeg-turbo decoder, full size, the stored mode)
                           on ``--threads`` Python threads
  full, simplejpeg         ``simplejpeg.decode_jpeg`` (RGB), when simplejpeg is importable

The rounds alternate the configurations (the order rotates each round) so that load from other processes hits
them alike; each round's ratios fused / full (throughput, and CPU time per image of the whole process) are taken
within the round, and the table gives the medians. The load
average before and after the run is printed with the results: on a shared machine compare only rows of one run.
"""

from __future__ import annotations

import io
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (BATCH, SIZE, build, command, crop_flip, heading, parser, photo_folder, publish,  # noqa: E402
                     write_csv)
from fastload import transforms as T  # noqa: E402
from fastload._native import native  # noqa: E402


def threaded(blobs: list[bytes], threads: int, decode: Callable[[bytes], object]) -> Callable[[], int]:
    """A configuration: ``decode`` every blob, split into ``threads`` interleaved shares run on Python threads."""

    def run() -> int:
        shares = [blobs[t::threads] for t in range(threads)]
        ths = [threading.Thread(target=lambda s=s: [decode(b) for b in s]) for s in shares]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        return len(blobs)

    return run


def fused(blobs: list[bytes], hw: np.ndarray, threads: int, seed: int) -> Callable[[], int]:
    """A configuration: the loader's native call over batches of ``BATCH``, crops planned by the loader's
    RandomResizedCrop + flip from a fresh draw per round."""
    C = native()
    pool = C.Pool(threads)
    blob = b"".join(blobs)
    lengths = np.array([len(b) for b in blobs], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    hw32 = np.ascontiguousarray(hw, dtype=np.int32)
    pipeline = T.ImagePipeline(crop_flip(SIZE))
    rng = np.random.default_rng(seed)
    slot = np.zeros((BATCH, SIZE, SIZE, 3), np.uint8)
    n = len(blobs)

    def run() -> int:
        plan = pipeline.plan(hw[:, 0], hw[:, 1], rng)
        crops = np.ascontiguousarray(plan.crops, dtype=np.int32)
        flips = np.ascontiguousarray(plan.flips, dtype=np.uint8)
        for s in range(0, n, BATCH):
            k = min(BATCH, n - s)
            fails = C.decode_batch(pool, [blob], np.zeros(k, np.int64), offsets[s:s + k], lengths[s:s + k],
                                   np.zeros(k, np.uint8), hw32[s:s + k], crops[s:s + k], flips[s:s + k], slot[:k])
            if fails:
                raise RuntimeError(f"decode_batch failed on {fails[:3]}")
        return n

    return run


def loader(dataset, threads: int) -> Callable[[], int]:
    """A configuration: one epoch of fastload's DataLoader (``threads`` decode threads, shuffled, batch ``BATCH``)
    over the packed copy of the same photos: the fused call plus everything the loader adds around it."""
    import fastload

    dl = fastload.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=threads, drop_last=False)

    def run() -> int:
        n = 0
        for images, _labels in dl:
            n += images.shape[0]
        return n

    return run


def decoded_share(blobs: list[bytes], hw: np.ndarray, seed: int) -> list[str]:
    """What the fused path decodes of each image, by the rules of csrc/jpeg.cc and libjpeg-turbo for one draw of
    crops: DCT scale, entropy (Huffman) data decoded, columns kept by jpeg_crop_scanline, and the area that gets
    IDCT, upsampling and colour conversion. Markdown lines."""
    from PIL import Image

    crops = np.asarray(T.ImagePipeline(crop_flip(SIZE)).plan(hw[:, 0], hw[:, 1], np.random.default_rng(seed)).crops)
    denoms, huff, cols, area, up = [], [], [], [], []
    for b, (top, left, ch, cw), (h, w) in zip(blobs, crops, hw):
        im = Image.open(io.BytesIO(b))
        hs, vs = max(lay[1] for lay in im.layer), max(lay[2] for lay in im.layer)
        d = next((d for d in (8, 4, 2) if ch >= d * SIZE and cw >= d * SIZE), 1)  # batch.cc's choose_dct_denom
        denoms.append(d)
        up.append(ch < SIZE or cw < SIZE)
        mw, mh = 8 * hs // d, 8 * vs // d  # iMCU size in output pixels
        h, w, top, left, ch, cw = -(-h // d), -(-w // d), top // d, left // d, -(-ch // d), -(-cw // d)
        m0, m1 = max(0, left - 1), min(w, left + cw + 1)  # jpeg.cc's one-column margin
        kept = m1 - m0 // mw * mw if m1 - m0 < w else w  # jpeg_crop_scanline widens to whole iMCUs
        rows = -(-h // mh)
        last = min(rows, (top + ch - 1) // mh + 1 + (vs == 2 and len(im.layer) > 1))  # + a context iMCU row
        first = max(0, top // mh - 1)  # jpeg_skip_scanlines decodes the iMCU row before the first one in full
        huff.append(1.0 if im.info.get("progressive") else last / rows)  # progressive: every scan, whole image
        cols.append(kept / w)
        area.append(kept / w * (last - first) / rows)
    return [f"- DCT scale 1/8, 1/4, 1/2, 1: {denoms.count(8)}, {denoms.count(4)}, {denoms.count(2)}, "
            f"{denoms.count(1)} images; the crop is upsampled on at least one axis in {np.mean(up):.0%} of them",
            f"- crop area / image area: mean {np.mean(crops[:, 2] * crops[:, 3] / (hw[:, 0] * hw[:, 1])):.2f}",
            f"- entropy-coded data Huffman-decoded (every iMCU row down to the crop's last; all of a progressive "
            f"file): mean {np.mean(huff):.2f} of the image",
            f"- columns kept by jpeg_crop_scanline: mean {np.mean(cols):.2f} of the width",
            f"- area that gets IDCT, upsampling and colour conversion: mean {np.mean(area):.2f} of the image"]


def rotate(configs: dict[str, Callable[[], int]], rounds: int) -> tuple[dict[str, list[float]],
                                                                       dict[str, list[float]]]:
    """One warm-up pass of each, then ``rounds`` rounds in a rotating order. Per configuration and round:
    images/s, and this process's CPU microseconds per image (all its threads; less sensitive to other
    processes' load than the wall clock, though not immune: they share caches and cores)."""
    for fn in configs.values():
        fn()
    names = list(configs)
    rates: dict[str, list[float]] = {k: [] for k in names}
    cpu: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t, c = time.perf_counter(), time.process_time()
            n = configs[name]()
            rates[name].append(n / (time.perf_counter() - t))
            cpu[name].append((time.process_time() - c) / n * 1e6)
    return rates, cpu


def main() -> None:
    ap = parser(__doc__, per_class=150, rounds=7, out=True, csv=True)
    ap.add_argument("--threads", type=int, default=2, help="decode threads of every configuration")
    ap.add_argument("--only", default=None, help="run only the configurations whose name contains this (to profile)")
    args = ap.parse_args()
    from PIL import Image, features

    C = native()
    folder = photo_folder(args.data, args.per_class)
    files = sorted(folder.rglob("*.jpg"))
    blobs = [p.read_bytes() for p in files]
    hw = np.array([C.jpeg_info(b)[:2] for b in blobs], np.int64)
    progressive = sum(Image.open(io.BytesIO(b)).info.get("progressive", 0) != 0 for b in blobs)

    def pil_load(b: bytes) -> None:
        with Image.open(io.BytesIO(b)) as im:
            im.load()

    configs: dict[str, Callable[[], int]] = {
        "fused decode+crop+resize (decode_batch)": fused(blobs, hw, args.threads, seed=0),
        "fastload DataLoader (RRC 224 + flip, the whole loader)": loader(
            build(args.data / f"photos_{args.per_class}.fastload", folder, transforms={"image": crop_flip(SIZE)}),
            args.threads),
        "full decode, fastload native (decode_jpeg)": threaded(blobs, args.threads, C.decode_jpeg),
        "full decode, PIL (Image.load)": threaded(blobs, args.threads, pil_load),
    }
    try:
        import simplejpeg

        configs["full decode, simplejpeg"] = threaded(blobs, args.threads, simplejpeg.decode_jpeg)
    except ImportError:
        simplejpeg = None

    if args.only:
        configs = {k: v for k, v in configs.items() if args.only in k}
        if not configs:
            raise SystemExit(f"--only {args.only!r} matches no configuration")
    load0 = os.getloadavg()
    t0 = time.time()
    rates, cpu = rotate(configs, args.rounds)
    load1 = os.getloadavg()
    names = list(configs)
    fused_name = names[0]  # with --only, the ratios are to the first configuration run

    lines = [heading("JPEG: fused decode + crop + resize vs a plain full decode"), "",
             f"`{command()}`", "",
             f"{len(blobs):,} JPEGs of bench/photos.py ({folder.name}; median {int(np.median(hw[:, 0]))}x"
             f"{int(np.median(hw[:, 1]))} px, {progressive} progressive), {args.threads} threads per configuration, "
             f"RandomResizedCrop {SIZE} + flip, batch {BATCH}; {args.rounds} rounds after a warm-up, "
             f"alternating, {time.time() - t0:.0f} s.",
             f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; load average "
             f"(1/5/15 min) {load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f} before, "
             f"{load1[0]:.2f}/{load1[1]:.2f}/{load1[2]:.2f} after. libjpeg-turbo "
             f"{features.version_feature('libjpeg_turbo')} (PIL); simplejpeg "
             f"{getattr(simplejpeg, '__version__', 'not installed') if simplejpeg else 'not installed'}.", "",
             "| configuration | img/s (median) | min-max | fused / this, img/s | CPU us/img (median) |"
             " fused / this, CPU |",
             "|---|---:|---:|---:|---:|---:|"]
    rows = []
    for name in names:
        ratios = [f / r for f, r in zip(rates[fused_name], rates[name])]
        cpu_ratios = [c / f for f, c in zip(cpu[fused_name], cpu[name])]
        lines.append(f"| {name} | {statistics.median(rates[name]):,.0f} | {min(rates[name]):,.0f}-"
                     f"{max(rates[name]):,.0f} | {statistics.median(ratios):.2f}x | "
                     f"{statistics.median(cpu[name]):,.0f} | {statistics.median(cpu_ratios):.2f}x |")
        rows += [{"configuration": name, "round": i, "images_per_s": round(r, 1), "fused_ratio": round(q, 4),
                  "cpu_us_per_image": round(c, 1), "fused_cpu_ratio": round(cq, 4), "threads": args.threads,
                  "load_before": load0[0], "load_after": load1[0]}
                 for i, (r, q, c, cq) in enumerate(zip(rates[name], ratios, cpu[name], cpu_ratios))]
    lines += ["", "What the fused path decodes (csrc/jpeg.cc's rules, for one draw of crops, seed 0):", "",
              *decoded_share(blobs, hw, seed=0)]
    publish(lines, args.out)
    write_csv(args.csv, rows)


if __name__ == "__main__":
    main()
