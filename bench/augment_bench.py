"""The torchvision "new recipe"'s augmentation on CPU: fastload's loader (native, fused with decoding) against torch's
DataLoader running the same operations per sample with pillow-simd, on the same photos with the same workers.

  fastload recipe            ``fastload.DataLoader``: RandomResizedCrop 224 + flip + TrivialAugmentWide +
                             RandomErasing(0.25), planned per batch, executed by the native decoder's threads on each
                             output tile right after decoding it
  fastload RRC + flip        the same loader without the two augmentations: the recipe's added CPU time per image is
                             the difference of the two rows' CPU seconds per image (the process's, threads included)
  torch DataLoader + pillow-simd recipe
                             worker processes: PIL open + convert, torchvision's RandomResizedCrop algorithm written out
                             with PIL (bench/peers' torch baseline), flip, then TrivialAugmentWide + RandomErasing drawn
                             per sample and run by fastload's PIL engine (``engine_pil.run_pil``: torchvision's v1 PIL
                             formulas, ImageEnhance / ImageOps / Image.transform), then a uint8 tensor
  torch DataLoader + pillow-simd RRC + flip
                             the same without the augmentations (its own added cost, for comparison)
  torch DataLoader + albumentations (OpenCV)
                             bench/peers/albu_augment.py in its own venv (``bash bench/setup_peers.sh albumentations``),
                             a subprocess that runs one round per request: cv2.imread, A.RandomResizedCrop + flip +
                             albumentations' closest equivalent of TrivialAugmentWide (it has none: an A.OneOf over its
                             versions of the 14 operations with TrivialAugmentWide's ranges; see that file) +
                             A.Erasing(p=0.25); skipped, saying why, when the venv is missing

All: batch 64, shuffle, drop_last, num_workers=2 (worker processes for torch's loader, decode threads for fastload's),
persistent workers, uint8 batches; bench/photos.py's real photographs (1,800 files, long side 180-640), packed once
into bench/data/settings_photos (_common.packed_photos). Each configuration runs ``--epochs`` epochs per round;
rounds alternate after one warm-up round (drift on a shared machine hits every row alike); each row is the median
over rounds; ratios are within this run. The issue's targets: fastload recipe >= 2x torch's recipe with pillow-simd
and >= 1.5x torch's DataLoader + albumentations; the added CPU time <= 25% of RRC + flip's.

    python bench/augment_bench.py [--rounds 5] [--epochs 1] [--out bench/results/augment_cpu2.md] [--csv ...]
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastload  # noqa: E402
from _common import (BATCH, LOADER_OPTIONS, SIZE, WORKERS, command, crop_flip, drain, heading,  # noqa: E402
                     image_rounds, medians, packed_photos, parser, photo_folder, publish, spread, write_csv)
from fastload import transforms as T  # noqa: E402

FL_RECIPE, FL_PLAIN = "fastload recipe", "fastload RRC + flip"
PIL_RECIPE, PIL_PLAIN = "torch DataLoader + pillow-simd recipe", "torch DataLoader + pillow-simd RRC + flip"
ALBU = "torch DataLoader + albumentations (OpenCV)"
BENCH = Path(__file__).resolve().parent
ALBU_VENV = BENCH / ".venvs" / "albumentations"


def recipe() -> list:
    return [T.TrivialAugmentWide(), T.RandomErasing(0.25)]


class PilRecipe:
    """The torch user's per-sample transform: RandomResizedCrop (torchvision's algorithm, PIL resize) and flip, then
    ``augment`` drawn for this one image (from Python's ``random``, which torch seeds per worker) and run by the PIL
    reference engine; returns a uint8 (3, H, W) tensor."""

    def __init__(self, augment: list):
        self.augment = augment

    def __call__(self, img):
        from PIL import Image

        from fastload._augment.engine_pil import run_pil
        from fastload._augment.plan import plan_batch
        from peers._common import rrc_params

        top, left, h, w = rrc_params(img.width, img.height, random)
        img = img.resize((SIZE, SIZE), Image.BILINEAR, box=(left, top, left + w, top + h))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        if self.augment:
            plan = plan_batch(self.augment, np.array([[SIZE, SIZE]]), np.random.default_rng(random.getrandbits(63)))
            arr = run_pil(img, plan, 0)
        else:
            arr = np.asarray(img, dtype=np.uint8)
        return torch.from_numpy(arr.copy()).permute(2, 0, 1)


def loaders(data: Path) -> dict:
    """name -> a loader over the same photos (see the module docstring)."""
    from peers._torchdata import ImageFiles

    folder = photo_folder(data)
    augmented = packed_photos(data, folder, crop_flip() + recipe())
    plain = packed_photos(data, folder, crop_flip())
    return {FL_RECIPE: fastload.DataLoader(augmented, **LOADER_OPTIONS),
            FL_PLAIN: fastload.DataLoader(plain, **LOADER_OPTIONS),
            PIL_RECIPE: torch.utils.data.DataLoader(ImageFiles(str(folder), PilRecipe(recipe())), **LOADER_OPTIONS),
            PIL_PLAIN: torch.utils.data.DataLoader(ImageFiles(str(folder), PilRecipe([])), **LOADER_OPTIONS)}


class AlbuPeer:
    """bench/peers/albu_augment.py --serve in the albumentations venv: each call runs one round there (``epochs``
    epochs of its own persistent loader) and returns the images it loaded."""

    def __init__(self, folder: Path, epochs: int, python: Path = ALBU_VENV / "bin" / "python"):
        self.proc = subprocess.Popen([str(python), str(BENCH / "peers" / "albu_augment.py"), "--data", str(folder),
                                      "--epochs", str(epochs), "--serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.versions = self._reply("ready")["versions"]

    def _reply(self, key: str) -> dict:
        for line in self.proc.stdout:  # JSON lines; anything else a library prints is passed on
            try:
                msg = json.loads(line)
            except ValueError:
                msg = None
            if isinstance(msg, dict) and key in msg:
                return msg
            print(f"[{ALBU}] {line.rstrip()}", flush=True)
        raise RuntimeError(f"{ALBU}: the peer exited (status {self.proc.wait()}) before answering {key!r}; "
                           f"its error is above")

    def __call__(self) -> int:
        self.proc.stdin.write("round\n")
        self.proc.stdin.flush()
        return int(self._reply("round")["images"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def albu_peer(folder: Path, epochs: int) -> AlbuPeer | None:
    """The albumentations row, or None with the reason printed (no venv, or it does not start)."""
    python = ALBU_VENV / "bin" / "python"
    if not python.exists():
        skip = ALBU_VENV.with_suffix(".skip")
        why = skip.read_text().strip() if skip.exists() else "no venv"
        print(f"skipping {ALBU!r}: {why} ({python} missing; run `bash bench/setup_peers.sh albumentations`)",
              flush=True)
        return None
    try:
        return AlbuPeer(folder, epochs, python)
    except (OSError, RuntimeError) as e:
        print(f"skipping {ALBU!r}: {e}", flush=True)
        return None


def main() -> None:
    args = parser(__doc__, rounds=5, epochs=1, out=True, csv=True).parse_args()
    configs = {name: drain(loader, args.epochs) for name, loader in loaders(args.data).items()}
    albu = albu_peer(args.data / "photos_150", args.epochs)
    if albu is not None:
        configs[ALBU] = albu
    try:
        rates, cpu = image_rounds(configs, args.rounds)
    finally:
        if albu is not None:
            albu.close()
    med, cpu_med = medians(rates), medians(cpu)
    added = cpu_med[FL_RECIPE] - cpu_med[FL_PLAIN]
    lines = [heading("The new recipe's augmentation on CPU"), "",
             (f"`{command()}`: {args.epochs} epoch(s) of 1,800 real photos per round (batch {BATCH}, "
              f"num_workers={WORKERS}, persistent); medians of {args.rounds} alternating rounds after a warm-up round; "
              f"ratios within this run. torch {torch.__version__}."),
             "", f"| loader | images/s (median) | min-max | vs {PIL_RECIPE} | CPU ms/image (this process) |",
             "|---|---:|---:|---:|---:|"]
    for name in configs:
        note = ("" if name.startswith("fastload") else " (another process: not counted)" if name == ALBU
                else " (workers not counted)")
        lines.append(f"| {name} | {spread(rates[name])} | {med[name] / med[PIL_RECIPE]:.2f}x | "
                     f"{cpu_med[name] * 1e3:.2f}{note} |")
    torch_added = 1e3 / med[PIL_RECIPE] - 1e3 / med[PIL_PLAIN]
    lines += ["", f"fastload: the augmentation (TrivialAugmentWide + RandomErasing(0.25)) adds {added * 1e3:.3f} ms of "
                  f"CPU per image, {added / cpu_med[FL_PLAIN]:.0%} of RRC + flip's {cpu_med[FL_PLAIN] * 1e3:.3f} ms; "
                  f"torch's loader with pillow-simd spends {torch_added:.3f} ms more "
                  f"wall time per image with it.",
              "", f"fastload recipe / {PIL_RECIPE}: {med[FL_RECIPE] / med[PIL_RECIPE]:.2f}x (target >= 2x)"]
    if ALBU in med:
        lines += ["", f"fastload recipe / {ALBU}: {med[FL_RECIPE] / med[ALBU]:.2f}x (target >= 1.5x); albumentations "
                      f"has no TrivialAugmentWide: its row runs the closest equivalent (bench/peers/albu_augment.py). "
                      + ", ".join(f"{k} {v}" for k, v in albu.versions.items())]
    else:
        lines += ["", f"{ALBU}: not measured (its venv is missing: `bash bench/setup_peers.sh albumentations`)"]
    publish(lines, args.out)
    write_csv(args.csv, ((name, r, f"{v:.1f}", f"{c:.6f}") for name, values in rates.items()
                         for r, (v, c) in enumerate(zip(values, cpu[name]))),
              ["loader", "round", "images_per_s", "cpu_s_per_image"])


if __name__ == "__main__":
    main()
