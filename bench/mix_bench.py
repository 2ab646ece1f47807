"""MixUp/CutMix's cost in the loop (issue 21: "MixUp/CutMix add < 2% to the loop"), on CPU.

  recipe + ToDtype/Normalize           fastload.DataLoader with augment_bench's recipe (RRC 224 + flip +
                                       TrivialAugmentWide + RandomErasing(0.25)), float32 normalized batches
  ... + RandomChoice([CutMix, MixUp])  the same with batch_transforms (alpha 1.0, 1000 classes), run in the
                                       caller's thread fused into the images' native uint8 -> float32
                                       ToDtype/Normalize pass (fast/collate.py Collator.collate_mixed), soft
                                       labels (64, 1000)

What the ratio measures is the mix's whole cost in the loop: its plan, the blend or box inside the one
pass both loaders make over the float batch, and the soft labels. The report says in how many batches the
mix ran after the pipeline instead (a pass of its own: a dtype or layout the native pass does not take),
so a figure from a run where the fused pass was left is not mistaken for the fused one.

Same photos, batch 64, num_workers=2, persistent; alternating rounds after a warm-up round, medians; the ratio is
within this run. Run it on a quiet machine:

    python bench/mix_bench.py [--rounds 5] [--epochs 1] [--out bench/results/mix_cpu2.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastload  # noqa: E402
from augment_bench import BATCH, SIZE, WORKERS, drain, recipe, rounds  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fastload.fast.collate import Collator  # noqa: E402

PLAIN, MIXED = "recipe + ToDtype/Normalize", "... + RandomChoice([CutMix, MixUp])"


def loaders(data: Path) -> dict:
    from photos import build_photo_folder
    from settings_bench import build

    folder = data / "photos_150"
    build_photo_folder(folder, per_class=150, seed=0, progress=False)
    tf = {"image": [T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip()] + recipe() +
          [T.ToDtype(torch.float32, scale=True), T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]}
    plain = build(data / "settings_photos", folder, transforms=tf)
    mixed = fastload.open(plain.path, transforms=tf, batch_transforms=[
        T.RandomChoice([T.CutMix(alpha=1.0, num_classes=1000), T.MixUp(alpha=1.0, num_classes=1000)])])
    common = dict(batch_size=BATCH, shuffle=True, num_workers=WORKERS, drop_last=True, persistent_workers=True)
    return {PLAIN: fastload.DataLoader(plain, **common), MIXED: fastload.DataLoader(mixed, **common)}


def count_unfused() -> list[int]:
    """Counts the batches whose mix ran after the pipeline (``Collator.mix_output``: its own output buffer)."""
    count = [0]
    real = Collator.mix_output

    def counted(self, images):
        count[0] += 1
        return real(self, images)

    Collator.mix_output = counted
    return count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("bench/data"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="markdown table")
    args = ap.parse_args()
    configs = {name: drain(loader, args.epochs) for name, loader in loaders(args.data).items()}
    unfused = count_unfused()
    rates, cpu = rounds(configs, args.rounds)
    med = {k: statistics.median(v) for k, v in rates.items()}
    cmd = "python bench/mix_bench.py " + " ".join(sys.argv[1:])
    lines = [f"# MixUp/CutMix in the loop ({os.cpu_count()} CPUs), {time.strftime('%Y-%m-%d')}", "",
             f"`{cmd.strip()}`: medians of {args.rounds} alternating rounds of {args.epochs} epoch(s); torch "
             f"{torch.__version__}.", "", "| loader | images/s (median) | min-max | ms/batch |", "|---|---:|---:|---:|"]
    for name in configs:
        lines.append(f"| {name} | {med[name]:,.0f} | {min(rates[name]):,.0f}-{max(rates[name]):,.0f} | "
                     f"{BATCH * 1e3 / med[name]:.2f} |")
    added = med[PLAIN] / med[MIXED] - 1
    lines += ["", f"The mix adds {added:.1%} to the loop's time per batch (target < 2%)."]
    if unfused[0]:
        lines += ["", f"NOT FUSED: in {unfused[0]} batches the mix ran after ToDtype/Normalize, a pass of its own "
                      f"(not the fused path's figure)."]
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
