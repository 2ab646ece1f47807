"""Count the calls that cross a module boundary inside fastload for one batch of the fast path.

A batch of a small packed dataset (an image field with a crop, a fixed-size column) is taken with
``num_workers=0`` (the calling thread fills it, so one thread's profile sees the whole path) after a few
warm-up batches; ``sys.setprofile`` records every Python call whose caller and callee are both fastload
modules and differ. The report lists each hop (caller module -> callee module.function) and, per module,
how many times the batch entered it. The target of issue 20: every module on the batch path entered once
per batch, the calls going one way (no module entered again after the batch has left it).

    python tests/fast/count_hops.py [--verbose]   (tests/fast/test_hops.py checks it)
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path

import numpy as np


def _module(frame) -> str | None:
    name = frame.f_globals.get("__name__", "")
    return name if name == "fastload" or name.startswith("fastload.") else None


def hops_of_one_batch(loader_kwargs: dict | None = None) -> list[tuple[str, str, str]]:
    """(caller module, callee module, callee function) for each boundary-crossing call of one ``next()``."""
    import fastload
    from fastload import transforms as T

    with tempfile.TemporaryDirectory() as tmp:
        from PIL import Image

        for i in range(64):  # an ImageFolder of 2 classes: a JPEG image field and an int label
            d = Path(tmp) / "src" / f"class_{i % 2}"
            d.mkdir(parents=True, exist_ok=True)
            pixels = np.random.default_rng(i).integers(0, 255, (48, 64, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(d / f"{i:03d}.jpg")
        fastload.pack(Path(tmp) / "src", Path(tmp) / "ds", workers=0)
        ds = fastload.open(Path(tmp) / "ds", transforms={"image": [T.RandomResizedCrop(32), T.RandomHorizontalFlip()]})
        loader = fastload.DataLoader(ds, batch_size=8, shuffle=True, num_workers=0, seed=0, **(loader_kwargs or {}))
        it = iter(loader)
        for _ in range(3):
            next(it)  # the iteration has started; slots, pools and plans exist
        hops: list[tuple[str, str, str]] = []

        def profile(frame, event, arg):
            if event != "call":
                return
            callee = _module(frame)
            caller = _module(frame.f_back) if frame.f_back is not None else None
            if callee and caller and callee != caller:
                hops.append((caller, callee, frame.f_code.co_name))

        sys.setprofile(profile)
        try:
            next(it)
        finally:
            sys.setprofile(None)
        del it
        return hops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--verbose", action="store_true", help="list every hop")
    args = parser.parse_args()
    hops = hops_of_one_batch()
    entered = collections.Counter(callee for _, callee, _ in hops)
    modules = {m for h in hops for m in h[:2]}
    if args.verbose:
        for caller, callee, fn in hops:
            print(f"  {caller} -> {callee}.{fn}")
    print(f"{len(hops)} calls across module boundaries, through {len(modules)} modules")
    for m, k in entered.most_common():
        print(f"  {k:3d}  {m}")


if __name__ == "__main__":
    main()
