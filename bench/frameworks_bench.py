"""fastload inside PyTorch Lightning and Hugging Face accelerate, against the same loaders in a plain loop.

A user changes one import; Lightning's ``Trainer.fit`` or accelerate then drives the loader. This measures
whether that still runs at the plain loop's speed, on the fast path, and how far ahead of torch's
DataLoader it stays inside each framework:

  loaders  fastload.DataLoader over the packed photos, and torch.utils.data.DataLoader + pillow-simd over
           the JPEG files (ImageFolder's listing, torchvision's RandomResizedCrop algorithm written out
           with PIL: there is no torchvision here); both RandomResizedCrop 224 + flip, batch 64, shuffle,
           drop_last, num_workers=2 (persistent for torch), uint8 batches
  ways     plain   a hand-written loop: forward, backward, optimizer step
           lightning  ``Trainer(accelerator="cpu", devices=1).fit``; the time runs from the first
                  epoch's start to the last one's end (callbacks), so Trainer setup is not counted
           accelerate ``Accelerator(cpu=True)``: ``fastload.accelerate.prepare`` for fastload (the
                  documented drop-in), ``accelerator.prepare`` for torch; the same loop with
                  ``accelerator.backward``
  step     the same tiny model everywhere (a linear layer over every 32nd pixel of each image,
           a strided view), so that the loader is what is measured; this is a data-loading benchmark, not a
           training one; the main process runs it on one torch thread (``torch.set_num_threads(1)``) for
           every row: with torch's default of one OpenMP thread per CPU, the threads spinning after each of
           the step's ops took a core from the loader (fastload's plain loop fell from ~6,000 to ~3,700
           images/s on 2 CPUs), which measures torch's thread pool, not the loader
  data     bench/photos.py's real photographs (1,800 files, long side 180-640)

Each configuration runs ``--epochs`` epochs per round; rounds alternate (so drift on a shared machine hits
every row alike) after one warm-up round, and each row is the median over rounds. "fast path" is what the
loader the framework actually iterated reports (``loader.fast_path``).

    python bench/frameworks_bench.py [--rounds 5] [--epochs 2] [--out bench/results/frameworks_cpu2.md]
"""

from __future__ import annotations

import logging
import math
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastload
from _common import (BATCH, SIZE, WORKERS, alternate, command, crop_flip, heading, medians, packed_photos, parser,
                     photo_folder, publish, spread)

CLASSES, STRIDE = 12, 32


class Tiny(torch.nn.Module):
    """A linear layer over every STRIDE-th pixel of each (N, 3, H, W) image: a strided view, so only those
    pixels are read, whatever the batch's memory layout; cheap, with a real backward and step."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3 * math.ceil(SIZE / STRIDE) ** 2, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.lin(images[:, :, ::STRIDE, ::STRIDE].float().flatten(1).div_(255))


def loss_of(model, batch) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), torch.as_tensor(batch[1]).long() % CLASSES)


def timed_loop(loader, model, opt, epochs: int, backward=torch.Tensor.backward):
    """The hand-written loop: ``epochs`` epochs of forward, ``backward(loss)`` and an optimizer step."""
    def run() -> tuple[float, int, bool]:
        n, t = 0, time.perf_counter()
        for _ in range(epochs):
            for batch in loader:
                opt.zero_grad(set_to_none=True)
                backward(loss_of(model, batch))
                opt.step()
                n += batch[0].shape[0]
        return time.perf_counter() - t, n, getattr(loader, "fast_path", False)
    return run


def in_plain(loader, epochs: int):
    model = Tiny()
    return timed_loop(loader, model, torch.optim.SGD(model.parameters(), lr=0.01), epochs)


def in_lightning(loader, epochs: int):
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = Tiny()

        def training_step(self, batch, batch_idx):
            return loss_of(self.model, batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Clock(L.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == 0:
                self.t0, self.n = time.perf_counter(), 0
                self.fast = getattr(trainer.train_dataloader, "fast_path", False)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.n += batch[0].shape[0]

        def on_train_epoch_end(self, trainer, pl_module):
            self.t1 = time.perf_counter()

    def run() -> tuple[float, int, bool]:
        clock = Clock()
        trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            num_sanity_val_steps=0, callbacks=[clock])
        trainer.fit(Module(), train_dataloaders=loader)
        return clock.t1 - clock.t0, clock.n, clock.fast
    return run


def in_accelerate(loader, epochs: int, accelerator):
    from fastload.accelerate import prepare

    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if isinstance(loader, fastload.DataLoader):
        model, opt, loader = prepare(accelerator, model, opt, loader)
    else:
        model, opt, loader = accelerator.prepare(model, opt, loader)
    return timed_loop(loader, model, opt, epochs, accelerator.backward)


def loaders(data: Path) -> dict:
    """name -> a function making a fresh loader (each way gets its own: prepare marks a loader)."""
    from peers._common import pil_train_transform
    from peers._torchdata import ImageFiles

    folder = photo_folder(data)
    transform, _ = pil_train_transform(SIZE, use_torchvision=False)

    def fast():  # the packed copy of the same files that settings_bench and the other photo scripts read
        ds = packed_photos(data, folder, crop_flip())
        return fastload.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS, drop_last=True)

    def plain_torch():
        return torch.utils.data.DataLoader(ImageFiles(str(folder), transform), batch_size=BATCH, shuffle=True,
                                           num_workers=WORKERS, drop_last=True, persistent_workers=True)
    return {"fastload": fast, "torch DataLoader + pillow-simd": plain_torch}


def main() -> None:
    args = parser(__doc__, rounds=5, epochs=2, out=True).parse_args()
    torch.set_num_threads(1)  # see the docstring: the tiny step's OpenMP threads would compete with the loader
    import lightning  # noqa: F401  (it sets its loggers up on import; quieten them after)
    from accelerate import Accelerator

    warnings.filterwarnings("ignore", module="lightning")  # e.g. "consider more workers" on 2 CPUs
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)

    accelerator = Accelerator(cpu=True)
    ways = {"plain loop": in_plain, "Lightning Trainer.fit": in_lightning,
            "accelerate": lambda loader, e: in_accelerate(loader, e, accelerator)}
    configs = {(way, name): make_way(make(), args.epochs)
               for name, make in loaders(args.data).items() for way, make_way in ways.items()}
    # each way times itself (Lightning's from its first epoch's start): a round's result is (seconds, images,
    # whether the loader it iterated was on the fast path)
    timings = alternate(configs, args.rounds)
    rates = {k: [r.result[1] / r.result[0] for r in v] for k, v in timings.items()}
    fast = {k: {r.result[2] for r in v} for k, v in timings.items()}
    med = medians(rates)
    names = list(dict.fromkeys(name for _, name in configs))  # fastload first, then torch
    lines = [heading("fastload inside Lightning and accelerate"), "",
             (f"`{command()}`: {args.epochs} epochs of 1,800 real photos per round (RandomResizedCrop 224 + "
              f"flip, batch {BATCH}, num_workers={WORKERS}); medians of {args.rounds} alternating rounds after a "
              f"warm-up round; ratios within this run. torch {torch.__version__}; the step runs on 1 torch thread."),
             "",
             "| way | loader | images/s (median) | min-max | vs plain loop | fastload vs torch | fast path |",
             "|---|---|---:|---:|---:|---:|---|"]
    for way in ways:
        torch_rate = med[(way, names[1])]
        for name in names:
            k = (way, name)
            vs_torch = f"{med[k] / torch_rate:.2f}x" if name == names[0] else ""
            lines.append(f"| {way} | {name} | {spread(rates[k])} | "
                         f"{med[k] / med[('plain loop', name)]:.2f} | {vs_torch} | "
                         f"{'/'.join(sorted(map(str, fast[k]))) if name == names[0] else 'n/a'} |")
    publish(lines, args.out)


if __name__ == "__main__":
    main()
