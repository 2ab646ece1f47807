"""``fastload bench DST``: measure the user's own packed dataset.

Throughput of the fast path per native thread count (the fastest marked, and the count ``num_workers='auto'``
picks: the fewest threads within 5% of the fastest, which is not always the fastest), the time per
sample spent reading bytes, decoding (full size) and in the whole per-sample pipeline as the loader
runs it (DCT-scaled decode + crop + resize + flip), and the host-to-device copy where CUDA exists.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

PRESETS = ("train", "val", "none")


def preset_transforms(name: str, schema, size: int) -> dict:
    from .. import transforms as T

    if name not in PRESETS:
        raise ValueError(f"transforms preset {name!r} should be one of {', '.join(PRESETS)}")
    if name == "none":
        return {}
    chain = (
        [T.RandomResizedCrop(size), T.RandomHorizontalFlip()]
        if name == "train"
        else [T.Resize(int(round(size * 256 / 224))), T.CenterCrop(size)]
    )
    return {f.name: chain for f in schema if f.kind == "image"}


def run(
    path: Any,
    batch_size: int = 64,
    preset: str = "train",
    size: int = 224,
    max_workers: int | None = None,
    seconds: float = 1.0,
    storage_options: dict | None = None,
) -> dict:
    from .._front.autotune import choose, measure
    from .._fill.batcher import Batcher
    from ..fields import NotFastPath
    from .._front.dataset import Dataset
    from .._native import native
    from ..fast.order import Order

    plain = Dataset(path, storage_options=storage_options)  # a folder or a URL, with fastload.open's errors
    schema = plain.schema
    plain.close()
    ds = Dataset(path, transforms=preset_transforms(preset, schema, size), storage_options=storage_options)
    if ds.remote:  # every shard in the local cache first: the rates measure loading, not downloading
        for seg in ds.reader.segments:
            seg.open()
    try:
        batcher = Batcher(ds, batch_size, 0)
    except NotFastPath as e:
        raise ValueError(f"this dataset cannot take the fast path with --transforms {preset}: {e}") from None
    order = Order(len(ds), batch_size, kind="random", seed=0)
    top = max_workers if max_workers is not None else (os.cpu_count() or 1)
    threads = list(range(0, top + 1))
    rates = measure(batcher, order, threads, seconds * len(threads))
    result: dict[str, Any] = {
        "dataset": str(path),
        "samples": len(ds),
        "batch_size": batch_size,
        "preset": preset,
        "rates": rates,
        "fastest": max(rates, key=rates.__getitem__),
        "auto": choose(rates),
    }
    images = [f for f in ds.schema if f.kind == "image"]
    if images:
        f = images[0]
        idx = next(iter(order.batches(0, 0)))
        blobs = []
        t = time.perf_counter()
        at = ds.reader.locate(idx)
        for k in range(len(idx)):
            blobs.append(bytes(ds.reader.blob(at, f.name, k)))
        read = (time.perf_counter() - t) / len(idx)
        C = native()
        t = time.perf_counter()
        for b in blobs:
            try:
                C.decode_jpeg(b)
            except ValueError:
                pass  # raw images or corrupt data: counted in the time anyway
        decode = (time.perf_counter() - t) / len(idx)
        slot = batcher.new_slot()
        single = C.Pool(0)  # the calling thread alone: the per-sample cost, comparable with the two above
        t = time.perf_counter()
        batcher.fill(slot, idx, order.batch_rng(0, 0), pool=single)
        pipeline = (time.perf_counter() - t) / len(idx)
        result["split_ms"] = {
            "read bytes": 1e3 * read,
            "decode, full size": 1e3 * decode,
            "pipeline as run (decode at scale + crop + resize + flip)": 1e3 * pipeline,
        }
        if torch.cuda.is_available():
            host = slot.tensors[f.name]
            dev = torch.empty(host.shape, dtype=host.dtype, device="cuda")
            dev.copy_(host, non_blocking=True)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                dev.copy_(host, non_blocking=True)
            end.record()
            end.synchronize()
            secs = start.elapsed_time(end) / 1e3 / 10
            result["h2d_ms_per_batch"] = 1e3 * secs
            result["h2d_gb_s"] = host.numel() / secs / 1e9
    batcher.close()
    ds.close()
    return result


def report(r: dict) -> str:
    lines = [
        f"dataset   {r['dataset']} ({r['samples']:,} samples), batch {r['batch_size']}, "
        f"transforms preset '{r['preset']}'",
        "",
        "threads  samples/s  vs 1 thread",
    ]
    base = r["rates"].get(1) or max(r["rates"].values())
    fastest = max(r["rates"], key=r["rates"].get)  # read from the rates: the mark and the numbers cannot disagree
    auto = r.get("auto", fastest)
    for t, v in sorted(r["rates"].items()):
        mark = []
        if t == fastest:
            mark.append("fastest")
        if t == auto:
            mark.append(
                "num_workers='auto' picks this"
                + ("" if t == fastest else ": the fewest threads within 5% of the fastest")
            )
        lines.append(f"{t:>7}  {v:>9,.0f}  {v / base:>10.2f}x" + (f"   <- {', '.join(mark)}" if mark else ""))
    if "split_ms" in r:
        lines += ["", "per sample, one thread (ms)"]
        lines += [f"  {k:<58} {v:7.3f}" for k, v in r["split_ms"].items()]
    if "h2d_ms_per_batch" in r:
        lines += ["", f"copy to GPU: {r['h2d_ms_per_batch']:.3f} ms per batch ({r['h2d_gb_s']:.1f} GB/s, pinned)"]
    else:
        lines += ["", "copy to GPU: no CUDA device here"]
    return "\n".join(lines)


def plot_ready() -> None:
    """Raise the install hint now if --plot cannot be drawn (before minutes of measuring)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install matplotlib") from None


def plot(r: dict, path: str) -> Any:
    plot_ready()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ts = sorted(r["rates"])
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(ts, [r["rates"][t] for t in ts], marker="o")
    ax.set_xlabel("native threads (num_workers)")
    ax.set_ylabel("samples/s")
    ax.set_title(f"fastload bench: {os.path.basename(str(r['dataset']))}")
    ax.set_xticks(ts)
    # from zero: an axis that starts near the data draws a few percent of noise as a cliff
    ax.set_ylim(0, 1.1 * max(max(r["rates"].values()), 1.0))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return fig
