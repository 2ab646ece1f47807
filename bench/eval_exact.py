"""fastload's evaluation recipes against torchvision's and timm's own objects on a folder of photos: for every sample,
the difference in pixel levels between ``fastload.open(folder, transforms=...)`` and torchvision's
``ImageFolder(folder, transform=...)`` with the same transform object, through ``ds[i]`` and through the loader.

Recipes: torchvision's classic evaluation ``Compose([Resize(256), CenterCrop(224), ToTensor(), Normalize(...)])``
and timm's ``create_transform(224)`` (``Resize(256), CenterCrop(224), MaybeToTensor, Normalize``; bilinear, its
default, and bicubic, what most timm models' data configs ask for). The
normalized floats are compared in levels: ``|a - b| * std * 255``, rounded. Samples whose resize shrinks them 2x or
more are decoded by libjpeg at 1/2, 1/4 or 1/8 of their size (DCT scaling, the native decoder's default), which is not
PIL's full-size decode: they are counted apart ("DCT-scaled"), the rest are the ones fastload computes exactly.
``--decoder exact`` (``fastload.DataLoader(decoder='exact')``) decodes every JPEG at full size: the loader's samples
are then PIL's too. The loader's CPU time per image (the process's, over one extra pass of the loader alone, its
threads included) is printed for the decoder asked for: run once per decoder to compare them, on a quiet machine.

Needs torchvision and timm (the test-only venv of scripts/timm_test_venv.sh), with PYTHONPATH at the checkout whose
fastload it measures:

    PYTHONPATH=. bench/.venvs/timm/bin/python bench/eval_exact.py bench/data/photos_150 [--count N] [--decoder exact]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

import fastload

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def recipes() -> dict:
    import timm.data
    import torchvision.transforms as tv

    return {
        "torchvision classic eval": lambda: tv.Compose(
            [tv.Resize(256), tv.CenterCrop(224), tv.ToTensor(), tv.Normalize(MEAN, STD)]
        ),
        "timm eval": lambda: timm.data.create_transform(224),  # create_transform's default: bilinear
        "timm eval bicubic": lambda: timm.data.create_transform(224, interpolation="bicubic"),  # most models' config
    }


def levels(a: torch.Tensor, b: torch.Tensor, std: torch.Tensor) -> np.ndarray:
    """|a - b| of normalized CHW floats, in uint8 levels per pixel (max over channels)."""
    return torch.round((a.float() - b.float()).abs() * std[:, None, None] * 255).amax(0).numpy()


def dct_scaled(path: str, size: int = 256) -> bool:
    """Whether ``Resize(size)`` shrinks the image 2x or more in both axes (the native decoder then decodes it
    DCT-scaled: csrc/batch.cc ``choose_dct_denom``)."""
    from PIL import Image

    w, h = Image.open(path).size
    nh, nw = (int(size * h / w), size) if w <= h else (size, int(size * w / h))
    return h >= 2 * nh and w >= 2 * nw


def cpu_time(ds, indices: list, batch_size: int, decoder: str, passes: int) -> float:
    """The process's CPU time (every thread's: the loader's decode threads too) per image over ``passes`` passes of
    the loader alone over samples ``indices``, after one pass that warms it up."""
    loader = fastload.DataLoader(
        ds, batch_size=batch_size, sampler=indices, num_workers=2, decoder=decoder, persistent_workers=True
    )
    if loader.fast_path_reason is not None:
        raise SystemExit(f"the timed loader does not take the fast path: {loader.fast_path_reason}")
    for _ in loader:
        pass
    cpu = time.process_time()
    for _ in range(passes):
        for _ in loader:
            pass
    return (time.process_time() - cpu) / (passes * len(indices))


def compare(folder: Path, make, count: int, batch_size: int, decoder: str = "native") -> dict:
    import torchvision

    tv = torchvision.datasets.ImageFolder(str(folder), transform=make())
    ds = fastload.open(folder, transforms={"image": make()})
    n = min(count, len(tv)) if count else len(tv)
    std = torch.tensor(STD)
    ref = []
    for i in range(n):
        image, label = tv[i]
        ref.append((image, label))
    item_max, item_mean, differing = [], [], 0
    scaled = np.array([dct_scaled(tv.samples[i][0]) for i in range(n)])
    for i in range(n):
        got = ds[i]
        if int(got[1]) != ref[i][1]:
            raise SystemExit(f"sample {i}: label {int(got[1])} != torchvision's {ref[i][1]}")
        d = levels(got[0], ref[i][0], std)
        item_max.append(d.max())
        item_mean.append(d.mean())
        differing += bool(d.max())
    loader_max, loader_full, loader_differing, loader_mean, k = 0.0, 0.0, 0, [], 0
    loader = fastload.DataLoader(ds, batch_size=batch_size, shuffle=False, num_workers=2, decoder=decoder)
    for images, _ in loader:
        for j in range(images.shape[0]):
            if k >= n:
                break
            diff = levels(images[j], ref[k][0], std)
            d = float(diff.max())
            loader_max = max(loader_max, d)
            loader_full = loader_full if scaled[k] else max(loader_full, d)
            loader_differing += d > 0
            loader_mean.append(float(diff.mean()))
            k += 1
        if k >= n:
            break
    everything = list(range(n))
    cpu_per_image = cpu_time(ds, everything, batch_size, decoder, passes=3)
    shrunk = np.flatnonzero(scaled).tolist()
    cpu_shrunk = cpu_time(ds, shrunk, batch_size, decoder, passes=20) if shrunk else 0.0
    item_max, item_mean = np.array(item_max), np.array(item_mean)
    full = ~scaled
    return {
        "samples": n,
        "differing": differing,
        "max": float(item_max.max()),
        "mean": float(item_mean.mean()),
        "worst sample mean": float(item_mean.max()),
        "loader max": loader_max,
        "loader differing": loader_differing,
        "loader mean": float(np.mean(loader_mean)),
        "loader cpu ms": cpu_per_image * 1000,
        "loader cpu ms shrunk": cpu_shrunk * 1000,
        "full": int(full.sum()),
        "full differing": int((item_max[full] > 0).sum()),
        "full max": float(item_max[full].max(initial=0)),
        "full mean": float(item_mean[full].mean()) if full.any() else 0.0,
        "loader full max": loader_full,
        "scaled differing": int((item_max[scaled] > 0).sum()),
        "scaled max": float(item_max[scaled].max(initial=0)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--count", type=int, default=0, help="the first N samples (0: all)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--decoder", default="native", help="the loader's decoder= ('native', 'exact')")
    args = ap.parse_args()
    print(f"fastload from {Path(fastload.__file__).parent}; the loader's decoder={args.decoder!r}")
    for name, make in recipes().items():
        r = compare(args.folder, make, args.count, args.batch_size, args.decoder)
        print(
            f"{name}: {r['samples']} samples, {r['differing']} differ; ds[i] max |diff| {r['max']:.0f} levels, "
            f"mean {r['mean']:.4f} (worst sample's mean {r['worst sample mean']:.3f})\n"
            f"  loader: {r['loader differing']} differ, max {r['loader max']:.0f}, mean {r['loader mean']:.4f}; "
            f"CPU time {r['loader cpu ms']:.2f} ms per image, on the DCT-scaled ones {r['loader cpu ms shrunk']:.2f}\n"
            f"  decoded at full size: {r['full']} samples, {r['full differing']} differ, max {r['full max']:.0f}, "
            f"mean {r['full mean']:.4f}, loader max {r['loader full max']:.0f}\n"
            f"  DCT-scaled: {r['samples'] - r['full']} samples, {r['scaled differing']} differ, "
            f"max {r['scaled max']:.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
