"""Remote datasets: epoch time reading from an S3 server on this machine, with a cold and a warm shard
cache, against the same dataset on local disk; and LitData reading the same photographs from the same
server the same three ways (in its own venv, ``bench/.venvs/litdata``, see ``bench/setup_peers.sh``).

The S3 server is moto's (``python -m moto.server``), in a process of its own on a free localhost port:
it shares this machine's cores with the loader, as a real object store would not. Every epoch is the
JPEG training pipeline of ``loader_bench.py`` (RandomResizedCrop 224 + flip, batch 64, shuffled,
``drop_last``, 2 threads / 2 workers). The three ways are measured alternately, ``--repeat`` rounds:

* local: the packed dataset on local disk (page cache warm);
* cold: a fresh, empty cache directory; the time includes opening the dataset (the manifest read);
* warm: a new dataset object over a cache that already holds every shard (the open included).

Usage::

    python bench/remote_bench.py --per-class 200 --repeat 5 --csv bench/results/remote_photos_cpu2.csv
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # never look for credentials off this machine

import fastload  # noqa: E402
from _common import crop_flip, pack_once, parser, photo_folder, write_csv  # noqa: E402

PIPELINE = crop_flip(224)
KEY = SECRET = "bench"
LITDATA_VENV = HERE / ".venvs" / "litdata"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Moto:
    def __init__(self):
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()  # a server still starting would outlive the benchmark
                    raise RuntimeError(f"moto server did not start on port {self.port} within 60 s")
                time.sleep(0.1)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def options(self) -> dict:
        return {"endpoint_url": self.endpoint, "key": KEY, "secret": SECRET}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def upload_dir(fs, local: Path, prefix: str, last: str | None = None) -> None:
    names = sorted((p for p in local.rglob("*") if p.is_file()), key=lambda p: p.name == last)
    for p in names:
        fs.put_file(str(p), f"{prefix}/{p.relative_to(local).as_posix()}")


def fastload_epoch(path: str, batch_size: int, order: str, **open_kw) -> tuple[float, dict | None]:
    t = time.perf_counter()
    ds = fastload.open(path, transforms={"image": PIPELINE}, **open_kw)
    loader = fastload.DataLoader(ds, batch_size=batch_size, order=order, window=2, num_workers=2, drop_last=True)
    n = sum(len(labels) for _, labels in loader)
    dt = time.perf_counter() - t
    assert n == len(ds) // batch_size * batch_size
    return dt, loader.stats()["remote"]


def epoch_row(loader: str, how: str, seconds: list[float], samples: int) -> dict:
    """A table row: one loader's epochs read one way (local, cold, warm)."""
    median = statistics.median(seconds)
    return {"loader": loader, "how": how, "median_s": median, "min_s": min(seconds), "max_s": max(seconds),
            "img_per_s": samples / median}


def litdata(spec: dict) -> dict:
    """Run one LitData step in its venv (bench/peers/litdata_remote.py); its JSON result."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(spec, fh)
    try:
        out = subprocess.run([str(LITDATA_VENV / "bin" / "python"), "-m", "peers.litdata_remote", fh.name],
                             env=dict(os.environ, PYTHONPATH=str(HERE)), capture_output=True, text=True,
                             timeout=1800)
    finally:
        os.unlink(fh.name)
    for line in out.stdout.splitlines():
        if line.startswith("@@RESULT "):
            return json.loads(line[len("@@RESULT "):])
    raise RuntimeError(f"litdata step {spec['step']} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")


def main() -> None:
    ap = parser(__doc__, per_class=200, repeat=5, batch_size=64, csv=True)
    ap.add_argument("--shard-size", default="4MB", help="shards (and LitData chunks) of this size")
    ap.add_argument("--orders", default="random,quasi", help="fastload orders to measure (quasi: window=2)")
    ap.add_argument("--no-litdata", action="store_true")
    args = ap.parse_args()
    photos = photo_folder(args.data, args.per_class)
    packed = pack_once(photos, args.data / f"photos_{args.per_class}_{args.shard_size}.fastload",
                       shard_size=args.shard_size)
    m = fastload.open(packed).manifest
    size = sum(e.bytes for e in m.shards)
    print(f"{m.num_samples} JPEGs, {len(m.shards)} shards, {size / 1e6:.1f} MB; batch {args.batch_size}; "
          f"{args.repeat} rounds of local / cold / warm (alternating)")
    work = Path(tempfile.mkdtemp(prefix="remote_bench_"))
    server = Moto()
    rows = []
    try:
        import s3fs

        fs = s3fs.S3FileSystem(**server.options())
        fs.mkdir("bench")
        upload_dir(fs, packed, "bench/fastload", last="manifest.json")
        url = "s3://bench/fastload"
        opts = dict(storage_options=server.options())
        warm_cache = work / "warm"
        for order in args.orders.split(","):
            fastload_epoch(str(packed), args.batch_size, order)  # warm-up: page cache, thread pools, imports
            fastload_epoch(url, args.batch_size, order, cache_dir=warm_cache, **opts)
            times = {"local": [], "cold": [], "warm": []}
            cold_stats = []
            for r in range(args.repeat):
                times["local"].append(fastload_epoch(str(packed), args.batch_size, order)[0])
                cold = work / f"cold{r}"
                dt, stats = fastload_epoch(url, args.batch_size, order, cache_dir=cold, **opts)
                times["cold"].append(dt)
                cold_stats.append(stats)
                shutil.rmtree(cold)
                dt, stats = fastload_epoch(url, args.batch_size, order, cache_dir=warm_cache, **opts)
                assert stats["downloads"] == 0, stats
                times["warm"].append(dt)
            name = f"fastload, order={order}"
            rows += [epoch_row(name, how, ts, m.num_samples) for how, ts in times.items()]
            waited = statistics.median(s["wait_s"] for s in cold_stats)
            dl = statistics.median(s["download_s"] for s in cold_stats)
            print(f"{name}, cold epochs: median {dl:.2f} s of download time (4 threads, summed), "
                  f"{waited:.2f} s of it waited for by the loader; retries {sum(s['retries'] for s in cold_stats)}")
        if not args.no_litdata:
            if not (LITDATA_VENV / "bin" / "python").exists():
                print("LitData: no venv (run `bash bench/setup_peers.sh litdata`); skipped")
            else:
                lit_local = work / "litdata_local"
                prep = litdata({"step": "optimize", "photos": str(photos), "out": str(lit_local),
                                "chunk_bytes": args.shard_size})
                upload_dir(fs, lit_local, "bench/litdata", last="index.json")
                spec = {"step": "epochs", "local": str(lit_local), "url": "s3://bench/litdata",
                        "endpoint": server.endpoint, "key": KEY, "secret": SECRET, "work": str(work / "lit"),
                        "batch_size": args.batch_size, "repeat": args.repeat}
                res = litdata(spec)
                rows += [epoch_row(f"LitData {prep['version']}", how, ts, res["samples"])
                         for how, ts in res["times"].items()]
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    base = {r["loader"]: r["median_s"] for r in rows if r["how"] == "local"}
    print("\n| loader | data | epoch s (median) | min | max | img/s | vs its local disk |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        r["vs_local"] = r["median_s"] / base[r["loader"]]
        print(f"| {r['loader']} | {r['how']} | {r['median_s']:.3f} | {r['min_s']:.3f} | {r['max_s']:.3f} | "
              f"{r['img_per_s']:,.0f} | {r['vs_local']:.2f}x |")
    write_csv(args.csv, rows)


if __name__ == "__main__":
    main()
