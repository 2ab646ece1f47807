"""Pack benchmark: how fast `fastload.pack` turns the photo ImageFolder into shards.

  read only        every source file read once (cold reads are the disk's speed; here the page cache
                   is warm, so this is the ceiling of reading and writing nothing)
  passthrough      JPEG bytes stored untouched (validated with a 1/8-scale decode), workers swept;
                   and with check="header" (header + end marker only)
  jpeg re-encode   decode, shrink to --max-side, re-encode at quality 90, workers swept

    python bench/pack_bench.py [--per-class 200] [--repeat 3] [--csv out.csv]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastload  # noqa: E402
from _common import median_seconds, parser, photo_folder, write_csv  # noqa: E402


def main() -> None:
    args = parser(__doc__, per_class=200, repeat=3, csv=True).parse_args()
    photos = photo_folder(args.data, args.per_class)
    files = sorted(photos.rglob("*.jpg"))
    total = sum(f.stat().st_size for f in files)
    cores = os.cpu_count() or 1
    print(f"{len(files)} JPEGs, {total / 1e6:.1f} MB, {cores} cores; median of {args.repeat}")
    rows = []
    t = median_seconds(lambda: [f.read_bytes() for f in files], args.repeat)
    rows.append(("read only", 0, t))
    with tempfile.TemporaryDirectory(dir=args.data) as tmp:
        for mode, kw in (("passthrough", {}), ("passthrough, check=header", {"check": "header"}),
                         ("jpeg re-encode", {"max_side": 256})):
            for w in sorted({1, cores}):
                dst = Path(tmp) / "out"
                image_mode = "passthrough" if mode.startswith("passthrough") else "jpeg"

                def once():
                    shutil.rmtree(dst, ignore_errors=True)
                    fastload.pack(photos, dst, image_mode=image_mode, workers=w, shard_size="64MB", **kw)

                rows.append((mode, w, median_seconds(once, args.repeat)))
    base = rows[0][2]
    print("\n| step | workers | s | samples/s | MB/s of source | vs read only |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, w, t in rows:
        print(f"| {name} | {w} | {t:.3f} | {len(files) / t:,.0f} | {total / 1e6 / t:,.1f} | {base / t:.2f} |")
    reenc = {w: t for name, w, t in rows if name == "jpeg re-encode"}
    if len(reenc) == 2:
        print(f"\nre-encode speed-up from 1 to {cores} workers: {reenc[1] / reenc[cores]:.2f}x")
    write_csv(args.csv, ((n, w, t, len(files), total) for n, w, t in rows),
              ["step", "workers", "seconds", "samples", "source_bytes"])


if __name__ == "__main__":
    main()
