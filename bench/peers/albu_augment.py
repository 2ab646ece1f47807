"""torch's DataLoader + albumentations (OpenCV): issue 21's recipe (RandomResizedCrop 224 + flip + TrivialAugmentWide
+ RandomErasing(0.25)) as an albumentations user writes it, for bench/augment_bench.py's row
"torch DataLoader + albumentations (OpenCV)". Runs in its own venv (``bash bench/setup_peers.sh albumentations``:
torch's CPU wheel, albumentations, opencv-python-headless), never in the project's .venv.

    bench/.venvs/albumentations/bin/python bench/peers/albu_augment.py --check
    bench/.venvs/albumentations/bin/python bench/peers/albu_augment.py --data PHOTOS [--rounds 5] [--epochs 1]
    ... --serve: one round per stdin line "round" (augment_bench.py drives it this way, alternating it with its own
        loaders; its first round is the warm-up), until "quit" or end of input

Per sample, in torch's worker processes (2, persistent; batch 64, shuffle, drop_last, default collate of uint8 CHW
tensors): ``cv2.imread`` + ``cv2.cvtColor(BGR2RGB)``, then ``A.Compose`` of

* ``A.RandomResizedCrop((224, 224))`` (torchvision's scale and ratio; OpenCV's bilinear resize) and
  ``A.HorizontalFlip()``;
* **not TrivialAugmentWide**: albumentations has none. The closest it has is written out below (``TRIVIAL``): an
  ``A.OneOf`` over its equivalents of torchvision's 14 operations, uniformly, with TrivialAugmentWide's magnitude
  ranges (shear ±atan(0.99) = ±44.7°, translate ±32 px, rotate ±135°, enhance factors 1 ± 0.99, posterize 2-8
  bits, solarize threshold 0-255), nearest interpolation and fill 0 as torchvision's defaults. Differences:
  magnitudes are drawn from the continuous range, not from 31 bins with a random sign; Brightness / Color /
  Contrast are ``A.ColorJitter``'s (torchvision's formulas on one factor), Sharpness is ``A.Sharpen`` (it only
  sharpens: torchvision's factor < 1 blurs), Equalize is ``A.Equalize(mode="pil")``;
* ``A.Erasing(p=0.25)`` (torchvision's RandomErasing: one rectangle, area 2-33%, aspect 0.3-3.3, filled with 0);
* ``ToTensorV2()`` (HWC -> CHW, no scaling: uint8 batches like fastload's).

OpenCV's own thread pool is switched off in the workers (``cv2.setNumThreads(0)``, as albumentations' docs advise
for DataLoader workers): the row then uses its 2 worker processes as the other rows use 2 workers or threads.
Output: one JSON object per line, ``{"round": r, "images": n, "seconds": s, "images_per_s": x}``, and a last
``{"summary": ...}`` line with the median and the library versions (``--serve``: ``{"ready": ...}`` first).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: peers._common (stdlib + numpy)

BATCH, WORKERS, SIZE = 64, 2, 224
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")  # albumentations asks PyPI for a newer version at import


def check() -> dict:
    import albumentations
    import cv2
    import numpy
    import torch

    recipe()  # the transforms exist with these arguments in the installed version
    return {"albumentations": albumentations.__version__, "opencv": cv2.__version__, "torch": torch.__version__,
            "numpy": numpy.__version__}


def trivial_augment_wide():
    """albumentations' closest equivalent of torchvision's TrivialAugmentWide (see the module docstring)."""
    import albumentations as A
    import cv2

    shear = math.degrees(math.atan(0.99))  # torchvision: shear=[degrees(atan(magnitude)), 0]
    geo = dict(interpolation=cv2.INTER_NEAREST, border_mode=cv2.BORDER_CONSTANT, fill=0, p=1.0)
    one = (0.01, 1.99)  # enhance factor 1 + m, m in [-0.99, 0.99]
    ops = [
        A.NoOp(p=1.0),                                                          # Identity
        A.Affine(shear={"x": (-shear, shear), "y": (0, 0)}, **geo),             # ShearX
        A.Affine(shear={"x": (0, 0), "y": (-shear, shear)}, **geo),             # ShearY
        A.Affine(translate_px={"x": (-32, 32), "y": (0, 0)}, **geo),            # TranslateX
        A.Affine(translate_px={"x": (0, 0), "y": (-32, 32)}, **geo),            # TranslateY
        A.Affine(rotate=(-135, 135), **geo),                                    # Rotate
        A.ColorJitter(brightness=one, contrast=0, saturation=0, hue=0, p=1.0),  # Brightness
        A.ColorJitter(brightness=0, contrast=0, saturation=one, hue=0, p=1.0),  # Color
        A.ColorJitter(brightness=0, contrast=one, saturation=0, hue=0, p=1.0),  # Contrast
        A.Sharpen(alpha=(0.0, 0.99), lightness=(1.0, 1.0), p=1.0),              # Sharpness (sharpening only)
        A.Posterize(num_bits=(2, 8), p=1.0),                                    # Posterize
        A.Solarize(threshold_range=(0.0, 1.0), p=1.0),                          # Solarize (threshold / 255)
        A.AutoContrast(p=1.0),                                                  # AutoContrast
        A.Equalize(mode="pil", p=1.0),                                          # Equalize
    ]
    return A.OneOf(ops, p=1.0)


def recipe():
    import albumentations as A
    from albumentations.pytorch import ToTensorV2

    return A.Compose([A.RandomResizedCrop((SIZE, SIZE), scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)),
                      A.HorizontalFlip(p=0.5), trivial_augment_wide(),
                      A.Erasing(scale=(0.02, 0.33), ratio=(0.3, 3.3), fill=0, p=0.25), ToTensorV2()])


class OpenCvFiles:
    """ImageFolder (the same listing as the other peers) decoded by ``cv2.imread``, transformed by ``recipe()``.
    A map-style Dataset (torch accepts any object with ``__len__`` / ``__getitem__``)."""

    def __init__(self, root: str):
        from peers._common import image_files

        self.paths, self.labels, _ = image_files(root)
        self.transform = recipe()

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        import cv2

        bgr = cv2.imread(self.paths[i], cv2.IMREAD_COLOR)
        if bgr is None:
            raise ValueError(f"cv2.imread could not read {self.paths[i]} (sample {i})")
        return self.transform(image=cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))["image"], self.labels[i]


def _worker_init(_worker_id: int) -> None:
    import cv2

    cv2.setNumThreads(0)
    cv2.ocl.setUseOpenCL(False)


def make_loader(root: str):
    import torch

    return torch.utils.data.DataLoader(OpenCvFiles(root), batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                                       drop_last=True, persistent_workers=True, worker_init_fn=_worker_init)


def one_round(loader, epochs: int, r: int) -> dict:
    t, n = time.perf_counter(), 0
    for _ in range(epochs):
        for images, _labels in loader:
            n += images.shape[0]
    s = time.perf_counter() - t
    return {"round": r, "images": n, "seconds": round(s, 4), "images_per_s": round(n / s, 1)}


def _emit(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="print the library versions and exit")
    ap.add_argument("--data", help="the photo ImageFolder (bench/augment_bench.py's photos_150)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--serve", action="store_true", help="one round per stdin line 'round' (after a warm-up round)")
    args = ap.parse_args(argv)
    if args.check:
        _emit(check())
        return 0
    if not args.data or not Path(args.data).is_dir():
        ap.error(f"--data={args.data!r} should be an ImageFolder directory (class subfolders of JPEG files)")
    if args.rounds < 1 or args.epochs < 1:
        ap.error(f"--rounds={args.rounds} and --epochs={args.epochs} should be >= 1")
    versions = check()
    loader = make_loader(args.data)
    if len(loader) == 0:
        ap.error(f"--data={args.data}: fewer than {BATCH} images, no full batch")
    if args.serve:
        _emit({"ready": True, "versions": versions})
        r = 0
        for line in sys.stdin:
            if line.strip() == "quit":
                break
            if line.strip() != "round":
                _emit({"error": f"unknown command {line.strip()!r}: send 'round' or 'quit'"})
                continue
            _emit(one_round(loader, args.epochs, r))
            r += 1
        return 0
    one_round(loader, args.epochs, -1)  # warm-up: worker processes, page cache
    rates = []
    for r in range(args.rounds):
        result = one_round(loader, args.epochs, r)
        rates.append(result["images_per_s"])
        _emit(result)
    _emit({"summary": {"images_per_s_median": statistics.median(rates), "rounds": args.rounds,
                       "epochs": args.epochs, "batch_size": BATCH, "num_workers": WORKERS, "versions": versions}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
