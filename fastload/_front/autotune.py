"""``num_workers="auto"``: pick the native thread count by measuring, once per dataset and machine.

A short run (about ``budget_s`` seconds in all) fills real batches of the loader's own dataset,
transforms and batch size with each candidate thread count, and keeps the fastest (the smaller count
when within 5%). The choice is cached in ``$XDG_CACHE_HOME/fastload/autotune.json`` (default
``~/.cache``) under a key of the dataset's shards, transforms, batch size and machine, so later
loaders start at once. The loader says what it chose on stderr.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

from .._version import __version__


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fastload" / "autotune.json"


def _key(dataset, batch_size: int) -> str:
    members = getattr(dataset, "members", None)  # fastload.mix: its datasets' keys, and how it mixes them
    if members is not None:
        parts = [_key(ds, batch_size) for ds in members.values()] + [repr(dataset.mixing)]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]
    m = dataset.manifest
    parts = [
        os.path.realpath(dataset.path),
        m.layout,
        str(m.num_samples),
        ",".join(s.xxh3_64 for s in m.shards),
        repr(sorted((k, repr(v)) for k, v in dataset.transforms.items())),
        str(batch_size),
        platform.node(),
        str(os.cpu_count()),
        platform.machine(),
        __version__,
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def candidates(cpus: int) -> list[int]:
    out = {0, 1, cpus}
    k = 2
    while k < cpus:
        out.add(k)
        k *= 2
    return sorted(out)


def measure(batcher, order, threads: list[int], budget_s: float) -> dict[int, float]:
    """samples/s of ``batcher`` filling batches of ``order`` (epoch 0) with each thread count."""
    from .._fill.batcher import copy_helpers_for
    from .._native import native

    slot = batcher.new_slot()
    batches = list(order.batches(0, 0))
    if not batches:
        return {t: 0.0 for t in threads}
    per = budget_s / len(threads)
    rates = {}
    for t in threads:
        pool = native().Pool(t)  # handed to fill: the batcher's own pool is left as it is
        pool.copy_helpers = copy_helpers_for(t)  # as the loader would run t threads (0: large copies with helpers)
        batcher.fill(slot, batches[0], order.batch_rng(0, 0), pool)  # warm-up: scratch buffers, page cache
        n, b, start = 0, 1, time.perf_counter()
        while True:
            idx = batches[b % len(batches)]
            batcher.fill(slot, idx, order.batch_rng(0, b % len(batches)), pool)  # idx's own draws
            n += len(idx)
            b += 1
            elapsed = time.perf_counter() - start
            if elapsed >= per and b > 2:
                break
        rates[t] = n / elapsed
    return rates


def choose(rates: dict[int, float]) -> int:
    best = max(rates.values())
    return min(t for t, r in rates.items() if r >= 0.95 * best)


def autotune(batcher, order, dataset, batch_size: int, budget_s: float = 1.5) -> int:
    key = _key(dataset, batch_size)
    path = cache_path()
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    if not isinstance(cache, dict):  # valid JSON but not ours (a list, a number): start a fresh cache
        cache = {}
    hit = cache.get(key)
    if isinstance(hit, dict) and isinstance(hit.get("num_workers"), int):
        chosen, how = hit["num_workers"], "cached"
        rates = hit.get("rates", {})
    else:
        rates = measure(batcher, order, candidates(os.cpu_count() or 1), budget_s)
        chosen, how = choose(rates), "measured"
        cache[key] = {
            "num_workers": chosen,
            "rates": {str(k): v for k, v in rates.items()},
            "dataset": str(dataset.path),
            "time": time.time(),
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(cache, indent=1))
            os.replace(tmp, path)
        except OSError as e:  # a read-only home must not stop training, but every loader would measure again
            warnings.warn(
                f"fastload: num_workers='auto' could not save its measurement to {path} ({e}); each "
                f"new loader will measure again (set XDG_CACHE_HOME to a writable folder to keep it)",
                RuntimeWarning,
                stacklevel=2,
            )
    shown = ", ".join(f"{k}: {float(v):,.0f}/s" for k, v in sorted(rates.items(), key=lambda kv: int(kv[0])))
    sys.stderr.write(f"fastload: num_workers='auto' chose {chosen} thread(s) ({how}; samples/s by threads: {shown})\n")
    return chosen
