"""A fastload dataset under torch's own DataLoader (``Dataset.__getitems__``), against torch's DataLoader over
pillow-simd, on the same photos with the same workers.

A script that keeps ``torch.utils.data.DataLoader`` (or a framework that rebuilds the loader: accelerate's
``DataLoaderShard``, HF Trainer, Ray Train) and only swaps the dataset for ``fastload.open(...)`` gets one
native batch decode per batch in each worker (``fastload/_front/getitems.py``). This measures what that is worth:

  torch DataLoader + fastload dataset   ``torch.utils.data.DataLoader(fastload.open(packed, transforms=...))``
  ... + items collated by torch          the same, with __getitems__'s items handed to default_collate as plain
                                        tuples (what every release before _getitems_shm did: torch stacks them
                                        into a fresh shared-memory batch per batch): the before row
  torch DataLoader + pillow-simd        the same loader over the JPEG files: ImageFolder's listing, PIL open +
                                        convert, torchvision's RandomResizedCrop algorithm written out with PIL
                                        (there is no torchvision here), flip; bench/peers' torch baseline
  accelerator.prepare(fastload.DataLoader)  accelerate's documented call on fastload's loader: rebuilt into its
                                        DataLoaderShard (which then calls __getitems__ in its workers)
  fastload.DataLoader (fast path)       for reference: the same dataset on fastload's own loader
  torch DataLoader, decoded up front    the ceiling: one batch decoded once and handed out again, so only
                                        torch's per-batch collate and shared-memory hand-over are timed
  ... collated from the slot            the same in each worker, but as __getitems__ returns it there: the
                                        ceiling of the first row (the pool's copy and the hand-over only)

All: RandomResizedCrop 224 + horizontal flip, batch 64, shuffle, drop_last, num_workers=2 (worker processes
for torch's loaders and accelerate's, decode threads for fastload's own), persistent workers, uint8 batches;
bench/photos.py's real photographs (1,800 files, long side 180-640), packed once into bench/data/settings_photos
(_common.packed_photos).

Each configuration runs ``--epochs`` epochs per round (the loop only takes the batches); rounds alternate
after one warm-up round (so drift on a shared machine hits every row alike), each row is the median over
rounds, and ratios are within this run.

    python bench/getitems_bench.py [--rounds 5] [--epochs 2] [--out bench/results/getitems_cpu2.md] [--csv ...]
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastload  # noqa: E402
from _common import (BATCH, LOADER_OPTIONS, SIZE, WORKERS, command, crop_flip, drain, heading,  # noqa: E402
                     image_rounds, medians, packed_photos, parser, photo_folder, publish, spread, write_csv)

TORCH_FASTLOAD = "torch DataLoader + fastload dataset"
TORCH_PLAIN = "torch DataLoader + fastload dataset, items collated by torch (before _getitems_shm)"
TORCH_PIL = "torch DataLoader + pillow-simd"
CEILING = "torch DataLoader, batches decoded once up front (its own per-batch cost: the ceiling of any dataset)"
CEILING_SHM = "torch DataLoader, a batch decoded once per worker, collated from the slot (the first row's ceiling)"


class Predecoded(torch.utils.data.Dataset):
    """The ceiling of any dataset under torch's DataLoader here: one batch of the fastload dataset's items,
    decoded once up front and handed out again for every batch (``__getitems__``), so a round costs only what
    torch's loader does per batch (default_collate into a fresh shared-memory batch in the worker, the
    file-descriptor hand-over, the main process's rebuild), never decoding."""

    def __init__(self, ds):
        self.n = len(ds)
        self.items = ds.__getitems__(list(range(BATCH)))

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, indices):
        return self.items[: len(indices)]


class PredecodedInWorker(torch.utils.data.Dataset):
    """The first row's ceiling: each worker decodes one batch once (``ds.__getitems__`` there) and hands the same
    rows out again, which default_collate writes from the slot into the worker's shared-memory pool
    (``fastload/_front/getitems_shm.py``); only that copy and torch's hand-over are timed."""

    def __init__(self, ds):
        self.ds, self.items = ds, None

    def __len__(self) -> int:
        return len(self.ds)

    def __getitems__(self, indices):
        if self.items is None:
            self.items = self.ds.__getitems__(list(range(BATCH)))
        return self.items if len(indices) == BATCH else list(self.items[: len(indices)])


class PlainItems(torch.utils.data.Dataset):
    """The fastload dataset with ``__getitems__``'s rows handed on as plain tuples/dicts: ``default_collate``
    stacks them itself, into a fresh shared-memory batch (the path before ``_getitems_shm``)."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitems__(self, indices):
        return [dict(r) if isinstance(r, dict) else tuple(r) for r in self.ds.__getitems__(indices)]


def loaders(data: Path) -> dict:
    """name -> a loader over the same photos (see the module docstring)."""
    from accelerate import Accelerator
    from peers._common import pil_train_transform
    from peers._torchdata import ImageFiles

    folder = photo_folder(data)
    transform, _ = pil_train_transform(SIZE, use_torchvision=False)
    ds = packed_photos(data, folder, crop_flip())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)  # the rebuild warning: that is the point here
        prepared = Accelerator(cpu=True).prepare(fastload.DataLoader(ds, **LOADER_OPTIONS))
    return {TORCH_FASTLOAD: torch.utils.data.DataLoader(ds, **LOADER_OPTIONS),
            TORCH_PLAIN: torch.utils.data.DataLoader(PlainItems(ds), **LOADER_OPTIONS),
            TORCH_PIL: torch.utils.data.DataLoader(ImageFiles(str(folder), transform), **LOADER_OPTIONS),
            "accelerator.prepare(fastload.DataLoader)": prepared,
            "fastload.DataLoader (fast path)": fastload.DataLoader(ds, **LOADER_OPTIONS),
            CEILING: torch.utils.data.DataLoader(Predecoded(ds), **LOADER_OPTIONS),
            CEILING_SHM: torch.utils.data.DataLoader(PredecodedInWorker(ds), **LOADER_OPTIONS)}


def main() -> None:
    args = parser(__doc__, rounds=5, epochs=2, out=True, csv=True).parse_args()
    configs = {name: drain(loader, args.epochs) for name, loader in loaders(args.data).items()}
    rates, _ = image_rounds(configs, args.rounds)
    med = medians(rates)
    lines = [heading("A fastload dataset under torch's DataLoader"), "",
             (f"`{command()}`: {args.epochs} epochs of 1,800 real photos per round (RandomResizedCrop {SIZE} + "
              f"flip, batch {BATCH}, num_workers={WORKERS}, persistent); medians of {args.rounds} alternating "
              f"rounds after a warm-up round; ratios within this run. torch {torch.__version__}."),
             "", f"| loader | images/s (median) | min-max | vs {TORCH_PIL} | vs the ceiling row |",
             "|---|---:|---:|---:|---:|"]
    for name in configs:
        lines.append(f"| {name} | {spread(rates[name])} | {med[name] / med[TORCH_PIL]:.2f}x "
                     f"| {med[name] / med[CEILING]:.2f}x |")
    publish(lines, args.out)
    write_csv(args.csv, ((name, r, f"{v:.1f}") for name, values in rates.items() for r, v in enumerate(values)),
              ["loader", "round", "images_per_s"])


if __name__ == "__main__":
    main()
