"""Per-operation cost of the native augmentation kernels on 224 x 224 tiles, and the per-batch Python planning.

Single thread (a ``_C.Pool(0)``: the calling thread), medians over many repetitions so that it reads the same on
a loaded machine. Each repetition restores 64 tiles from a copy and runs one operation over all of them through
``_C.augment_tiles``; the copy-only time is subtracted. TrivialAugmentWide's mean is the average over its 14
operations (one drawn uniformly per image); RandomErasing(0.25) counts a quarter of its cost.

    python bench/augment_micro.py [--reps 40] [--csv out.csv]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

N, H, W = 64, 224, 224
_OPS = ("brightness", "contrast", "saturation", "hue", "grayscale", "solarize", "posterize", "invert",
        "equalize", "autocontrast", "sharpness", "erase", "gaussian_blur", "erase_random")


def tiles(seed: int = 0) -> np.ndarray:
    """Photo-like tiles: smooth gradients plus noise (equalize and autocontrast see a spread of values)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:H, 0:W].astype(np.float32)
    base = np.stack([x / W * 200, y / H * 180, (x + y) / (W + H) * 220], -1)
    out = base[None] + rng.normal(0, 20, (N, H, W, 3))
    return np.clip(out, 0, 255).astype(np.uint8)


def arrays(op: str | None, f=(0.0,) * 4, i=(0,) * 4, affine=None) -> tuple:
    m = np.tile(np.array([1.0, 0, 0, 0, 1.0, 0]), (N, 1)) if affine is None else np.tile(np.asarray(affine), (N, 1))
    geo = (np.zeros(N, np.uint8), np.full(N, affine is not None, np.uint8), m, np.zeros(N, np.uint8),
           np.zeros((N, 3)))
    if op is None:
        steps = (np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros((0, 4)),
                 np.zeros((0, 4), np.int64))
    else:
        steps = (np.array([_OPS.index(op)], np.int64), np.array([0, N], np.int64), np.arange(N, dtype=np.int64),
                 np.tile(np.asarray(f, np.float64), (N, 1)), np.tile(np.asarray(i, np.int64), (N, 1)))
    return geo + steps


def affine_about_centre(angle: float = 0.0, shear=(0.0, 0.0), translate=(0.0, 0.0)) -> list[float]:
    """The inverse matrix torchvision's _get_inverse_affine_matrix gives, centre of a 224 tile."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    cx, cy = W * 0.5, H * 0.5
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = [d, -b, 0.0, -c, a, 0.0]
    tx, ty = translate
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty) + cx
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty) + cy
    return m


# (label, weight in the recipe, arrays): TrivialAugmentWide's 14 picks at mid magnitudes, then RandomErasing.
def cases() -> list[tuple[str, float, tuple]]:
    t = 1.0 / 14
    return [
        ("Identity", t, arrays(None)),
        ("ShearX", t, arrays(None, affine=affine_about_centre(shear=(math.degrees(math.atan(0.5)), 0)))),
        ("ShearY", t, arrays(None, affine=affine_about_centre(shear=(0, math.degrees(math.atan(0.5)))))),
        ("TranslateX", t, arrays(None, affine=affine_about_centre(translate=(16.0, 0)))),
        ("TranslateY", t, arrays(None, affine=affine_about_centre(translate=(0, 16.0)))),
        ("Rotate", t, arrays(None, affine=affine_about_centre(angle=67.5))),
        ("Brightness", t, arrays("brightness", f=(1.5, 0, 0, 0))),
        ("Color", t, arrays("saturation", f=(1.5, 0, 0, 0))),
        ("Contrast", t, arrays("contrast", f=(1.5, 0, 0, 0))),
        ("Sharpness", t, arrays("sharpness", f=(1.5, 0, 0, 0))),
        ("Posterize", t, arrays("posterize", i=(5, 0, 0, 0))),
        ("Solarize", t, arrays("solarize", f=(128.0, 0, 0, 0))),
        ("AutoContrast", t, arrays("autocontrast")),
        ("Equalize", t, arrays("equalize")),
        ("RandomErasing", 0.25, arrays("erase", i=(40, 50, 100, 90), f=(0.0, 0.0, 0.0, 0))),
    ]


def median_us(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return float(np.median(times)) * 1e6


def python_overhead(reps: int) -> dict[str, float]:
    """Per-batch planning and array building for the recipe, per image (µs)."""
    import fastload.transforms as T
    from fastload._augment.engine_native import augment_arrays
    from fastload._augment.plan import plan_batch

    aug = [T.TrivialAugmentWide(), T.RandomErasing(0.25)]
    out_hw = np.full((N, 2), (H, W), np.int32)
    rng = np.random.default_rng(0)
    plan = plan_batch(aug, out_hw, rng)
    return {"plan": median_us(lambda: plan_batch(aug, out_hw, rng), reps) / N,
            "arrays": median_us(lambda: augment_arrays(plan), reps) / N}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--csv", default=None)
    args = ap.parse_args(argv)
    from fastload import _C

    pool = _C.Pool(0)
    src = tiles()
    work = src.copy()
    copy_us = median_us(lambda: np.copyto(work, src), args.reps)
    rows, mean = [], 0.0
    for label, weight, a in cases():
        def run(a=a):
            np.copyto(work, src)
            _C.augment_tiles(pool, work, a)
        us = max(median_us(run, args.reps) - copy_us, 0.0) / N
        rows.append((label, weight, us))
        mean += weight * us
        print(f"{label:14s} {us:8.1f} µs/tile")
    py = python_overhead(args.reps)
    print(f"{'python plan':14s} {py['plan']:8.1f} µs/image (per batch of {N} / {N})")
    print(f"{'python arrays':14s} {py['arrays']:8.1f} µs/image")
    total = mean + py["plan"] + py["arrays"]
    print(f"recipe mean: native {mean:.1f} µs + python {py['plan'] + py['arrays']:.1f} µs = {total / 1e3:.3f} ms/image")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("case,weight,us_per_image\n")
            for label, weight, us in rows:
                f.write(f"{label},{weight:.4f},{us:.2f}\n")
            f.write(f"python_plan,1,{py['plan']:.2f}\npython_arrays,1,{py['arrays']:.2f}\n")


if __name__ == "__main__":
    main()
