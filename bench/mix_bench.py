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

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastload  # noqa: E402
from _common import (BATCH, LOADER_OPTIONS, command, crop_flip, drain, heading, image_rounds, medians,  # noqa: E402
                     packed_photos, parser, photo_folder, publish, spread)
from augment_bench import recipe  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fastload.fast.collate import Collator  # noqa: E402

PLAIN, MIXED = "recipe + ToDtype/Normalize", "... + RandomChoice([CutMix, MixUp])"


def loaders(data: Path) -> dict:
    images = crop_flip() + recipe() + [T.ToDtype(torch.float32, scale=True),
                                       T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]
    plain = packed_photos(data, photo_folder(data), images)
    mixed = fastload.open(plain.path, transforms={"image": images}, batch_transforms=[
        T.RandomChoice([T.CutMix(alpha=1.0, num_classes=1000), T.MixUp(alpha=1.0, num_classes=1000)])])
    return {PLAIN: fastload.DataLoader(plain, **LOADER_OPTIONS), MIXED: fastload.DataLoader(mixed, **LOADER_OPTIONS)}


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
    args = parser(__doc__, rounds=5, epochs=1, out=True).parse_args()
    configs = {name: drain(loader, args.epochs) for name, loader in loaders(args.data).items()}
    unfused = count_unfused()
    rates, _ = image_rounds(configs, args.rounds)
    med = medians(rates)
    lines = [heading("MixUp/CutMix in the loop"), "",
             f"`{command()}`: medians of {args.rounds} alternating rounds of {args.epochs} epoch(s); torch "
             f"{torch.__version__}.", "", "| loader | images/s (median) | min-max | ms/batch |", "|---|---:|---:|---:|"]
    for name in configs:
        lines.append(f"| {name} | {spread(rates[name])} | {BATCH * 1e3 / med[name]:.2f} |")
    added = med[PLAIN] / med[MIXED] - 1
    lines += ["", f"The mix adds {added:.1%} to the loop's time per batch (target < 2%)."]
    if unfused[0]:
        lines += ["", f"NOT FUSED: in {unfused[0]} batches the mix ran after ToDtype/Normalize, a pass of its own "
                      f"(not the fused path's figure)."]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
