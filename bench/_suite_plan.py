"""The benchmark suite's plan (bench/suite.py): its cases, the (peer, config) jobs of each in table order, where
each peer's packed copy of a dataset lives, and the generated source datasets.

Nothing here runs a job; _suite_run.py does, _suite_report.py writes the tables.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
VENVS = BENCH / ".venvs"
CASES = ("pack", "photos", "overlap", "raw", "tiny", "varlen")
DATASET_OF = {"photos": "photos", "overlap": "photos", "raw": "raw", "tiny": "tiny", "varlen": "varlen"}
GENERATOR = 1  # bump when the array generators change

SIZES = {  # full run / --quick
    "full": {"per_class": 200, "raw": 4096, "tiny": 65536, "varlen": 32768, "repeat": 3, "min_time": 0.5,
             "max_time": 4.0, "pack_budget": 20.0},
    "quick": {"per_class": 12, "raw": 512, "tiny": 8192, "varlen": 4096, "repeat": 1, "min_time": 0.05,
              "max_time": 2.0, "pack_budget": 0.0},
}
BATCH = {"photos": 64, "overlap": 64, "raw": 256, "tiny": 4096, "varlen": 256}
BATCH_QUICK = {"photos": 32, "overlap": 32, "raw": 64, "tiny": 512, "varlen": 64}  # >= 1 batch per worker

# Which peer packs which dataset (pack case; the loader cases read these outputs).
PACKS = {
    "fastload": ("photos", "raw", "tiny", "varlen"),
    "wds": ("photos", "raw", "tiny", "varlen"),
    "ffcv": ("photos", "raw", "tiny", "varlen"),
    "litdata": ("raw", "tiny", "varlen"),
}


def packed_path(data: Path, peer: str, dataset: str, mode: str = "") -> Path:
    name = dataset + (f"-{mode}" if mode else "")
    return data / peer / (name + ".beton" if peer == "ffcv" else name)


# --------------------------------------------------------------------------------------- jobs

def each(peer: str, *counts: int, key: str = "num_workers", **config) -> list[tuple[str, dict]]:
    """A peer's jobs at each of ``counts`` workers (or threads: ``key``), ``config`` added to each."""
    return [(peer, {key: n, **config}) for n in counts]


def loader_jobs(case: str, quick: bool) -> list[tuple[str, dict]]:
    """(peer, config) for a loader case, in table order."""
    fl = lambda path, w: ("fastload", {"path": path, "num_workers": w})  # noqa: E731
    if quick:  # a smoke run: every peer once where it is fastest to check, fastload's paths once
        fast, torch2 = fl("fast", 2), ("torch-simd", {"num_workers": 2})
        return {
            "photos": [fast, fl("generic", 2), torch2, ("torch-pillow", {"num_workers": 2}),
                       ("dali", {"num_threads": 2}), ("ffcv", {"num_workers": 2}), ("wds", {"num_workers": 2})],
            "overlap": [fast, torch2],
            "raw": [fast, torch2],
            "tiny": [fast, fl("generic", 2), torch2, ("wds", {"num_workers": 2}), ("ffcv", {"num_workers": 2}),
                     ("litdata", {"num_workers": 2})],
            "varlen": [fast, torch2],
        }[case]
    if case == "photos":
        return [fl("fast", 0), fl("fast", 1), fl("fast", 2), fl("generic", 2),
                *each("torch-simd", 0, 2, 4), *each("torch-simd", 2, files=True),
                *each("torch-simd", 2, pin_memory=True), *each("torch-pillow", 0, 2, 4),
                *each("dali", 1, 2, key="num_threads"), *each("ffcv", 1, 2), *each("wds", 2, 4)]
    if case == "overlap":
        return [fl("fast", 0), fl("fast", 2), fl("generic", 2),
                ("torch-simd", {"num_workers": 0}), ("torch-simd", {"num_workers": 2}),
                ("torch-pillow", {"num_workers": 2}), ("dali", {"num_threads": 2}), ("ffcv", {"num_workers": 2}),
                ("wds", {"num_workers": 2})]
    if case in ("raw", "tiny"):
        return [fl("fast", 0), fl("fast", 2), fl("generic", 2),
                *each("torch-simd", 0, 2, fetch="sample"), *each("torch-simd", 0, fetch="batch"),
                *each("wds", 0, 2), *each("ffcv", 1, 2), *each("litdata", 0, 2)]
    if case == "varlen":
        return [fl("fast", 0), fl("fast", 2), fl("generic", 2),
                ("torch-simd", {"num_workers": 0}), ("torch-simd", {"num_workers": 2}),
                ("wds", {"num_workers": 2}), ("ffcv", {"num_workers": 2}), ("litdata", {"num_workers": 2})]
    raise ValueError(case)


def pack_jobs(quick: bool) -> list[tuple[str, dict]]:
    jobs = [("fastload", {"dataset": "photos", "mode": "passthrough"}),
            ("fastload", {"dataset": "photos", "mode": "header"}),
            ("fastload", {"dataset": "photos", "mode": "jpeg"}),
            ("wds", {"dataset": "photos"}), ("ffcv", {"dataset": "photos"})]
    for ds in ("raw", "tiny", "varlen"):
        jobs += [("fastload", {"dataset": ds}), ("wds", {"dataset": ds}), ("ffcv", {"dataset": ds}),
                 ("litdata", {"dataset": ds})]
    if quick:
        jobs = [j for j in jobs if j[1]["dataset"] in ("photos", "tiny") and j[1].get("mode", "passthrough") ==
                "passthrough"]
    return jobs


def packs_needed(cases: list[str], quick: bool) -> set[tuple[str, str]]:
    """(peer, dataset) of every packed copy that the loader cases among ``cases`` read."""
    return {(peer, DATASET_OF[case]) for case in cases if case != "pack" for peer, _ in loader_jobs(case, quick)
            if DATASET_OF[case] in PACKS.get(peer, ())}


def prepare_jobs(needed: set[tuple[str, str]]) -> list[tuple[str, dict]]:
    """The pack jobs that make the ``needed`` copies, at each writer's default settings. Taken from the full run's
    list: --quick leaves raw and varlen out of its pack *case*, not out of the loader cases that read them."""
    return [(peer, cfg) for peer, cfg in pack_jobs(quick=False)
            if cfg.get("mode", "") in ("", "passthrough") and (peer, cfg["dataset"]) in needed]


def config_text(peer: str, cfg: dict) -> str:
    parts = []
    for k, v in cfg.items():
        if k == "files":
            parts.append("the generic row's Dataset (no torchvision)")
            continue
        if k in ("dataset",):
            continue
        if k == "path":
            parts.insert(0, f"{v} path")
        elif k == "num_threads":
            parts.append(f"threads={v}")
        elif k == "num_workers":
            parts.append(("threads" if peer == "fastload" and cfg.get("path") == "fast" else "num_workers") + f"={v}")
        elif k == "pin_memory":
            parts.append("pin_memory" if v else "")
        elif k == "fetch":
            parts.append("whole-batch fetch" if v == "batch" else "")
        elif k == "mode":
            parts.append({"passthrough": "JPEG bytes kept (check=decode)", "header": "JPEG bytes kept (check=header)",
                          "jpeg": "re-encode q90"}[v])
        else:
            parts.append(f"{k}={v}")
    return ", ".join(p for p in parts if p)


# --------------------------------------------------------------------------------------- datasets

def generate(data: Path, sizes: dict) -> dict:
    """Build (or reuse) the sources; returns {name: path}."""
    import numpy as np

    from photos import build_photo_folder

    data.mkdir(parents=True, exist_ok=True)
    photos = BENCH / "data" / f"photos_{sizes['per_class']}"
    info = build_photo_folder(photos, per_class=sizes["per_class"], seed=0, progress=False)
    print(f"  photos: {info['count']} JPEGs, {info['total_bytes'] / 1e6:.1f} MB in {photos}"
          f"{' (reused)' if info['reused'] else ''}", flush=True)
    out = {"photos": str(photos)}

    def arrays(name: str, n: int, make) -> None:
        d = data / f"{name}_{n}"
        stamp = d / ".stamp.json"
        want = {"generator": GENERATOR, "n": n}
        if not (stamp.exists() and json.loads(stamp.read_text()) == want):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            t = time.perf_counter()
            total = 0
            for field, arr in make(np.random.default_rng(0), n).items():
                np.save(d / f"{field}.npy", arr)
                total += arr.nbytes
            stamp.write_text(json.dumps(want))
            print(f"  {name}: generated {n:,} samples, {total / 1e6:,.0f} MB in {time.perf_counter() - t:.1f} s",
                  flush=True)
        else:
            total = sum(f.stat().st_size for f in d.glob("*.npy"))
            print(f"  {name}: {n:,} samples, {total / 1e6:,.0f} MB (reused)", flush=True)
        out[name] = str(d)

    arrays("raw", sizes["raw"], lambda rng, n: {
        "images": rng.integers(0, 256, (n, 3, 224, 224), dtype=np.uint8),
        "labels": rng.integers(0, 1000, n, dtype=np.int64)})
    arrays("tiny", sizes["tiny"], lambda rng, n: {
        "tokens": rng.integers(0, 50000, (n, 48), dtype=np.int32),
        "labels": rng.integers(0, 2, n, dtype=np.int64)})

    def varlen(rng, n):
        lengths = rng.integers(16, 513, n)
        lengths[0] = 512  # the longest possible row is present: every format pads to 512
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return {"tokens": rng.integers(0, 50000, int(offsets[-1]), dtype=np.int32), "offsets": offsets,
                "labels": rng.integers(0, 2, n, dtype=np.int64)}

    arrays("varlen", sizes["varlen"], varlen)
    return out


def source_bytes(sources: dict, dataset: str) -> tuple[int, int]:
    """(samples, bytes) of a source dataset."""
    if dataset == "photos":
        stamp = json.loads((Path(sources["photos"]) / ".photos.json").read_text())
        return len(stamp["files"]), sum(r["bytes"] for r in stamp["files"])
    d = Path(sources[dataset])
    n = len(__import__("numpy").load(d / "labels.npy", mmap_mode="r"))
    return n, sum(f.stat().st_size for f in d.glob("*.npy"))

