"""Train with fastload under Hugging Face accelerate: ``fastload.accelerate.prepare`` instead of
``accelerator.prepare`` keeps fastload's loader on its fast path in every process.

    accelerate launch --multi_gpu --num_processes 2 examples/accelerate_train.py PACKED_DIR --epochs 2
    ... PACKED_DIR --save-at 1:3 --state st      # save the state after 3 batches of epoch 1
    ... PACKED_DIR --resume st                   # go on from there

On a machine without GPUs, set ``ACCELERATE_USE_CPU=true``: the processes then train on the CPU over gloo
(``accelerate launch --cpu --num_processes 2`` starts a single process unless launched through mpirun).

Each process reads its own disjoint shard of fastload's order (rank = process index), reshuffled every
epoch. ``accelerator.save_state`` saves the loader's position with the model and optimizer;
``accelerator.load_state`` restores it, and the loop goes on from the batch after the one saved, in
the same epoch (no ``skip_first_batches``). ``PACKED_DIR`` is a packed image dataset
(``fastload pack FOLDER PACKED_DIR``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

if importlib.util.find_spec("fastload") is None:  # run from a clone without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from accelerate import Accelerator  # noqa: E402

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fastload.accelerate import prepare  # noqa: E402


def small_cnn(num_classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, num_classes),
    )


def train(args: argparse.Namespace, on_batch: Callable | None = None) -> None:
    accelerator = Accelerator()
    ds = fastload.open(
        args.data, transforms={"image": [T.RandomResizedCrop(args.image_size), T.RandomHorizontalFlip()]}
    )
    loader = fastload.DataLoader(
        ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, seed=args.seed, drop_last=True
    )
    torch.manual_seed(args.seed)
    model = small_cnn(max(len(ds.classes or []), 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer, loader = prepare(accelerator, model, optimizer, loader)
    if args.resume:
        accelerator.load_state(args.resume)  # model, optimizer, RNGs and the loader's position
    position = loader.state_dict()
    epoch, start = position["epoch"], position["batches_done"]
    # accelerator.print: the main process only, as each process would print the same lines
    accelerator.print(
        f"-- fastload under accelerate: {len(ds)} samples, {accelerator.num_processes} process(es), "
        f"batch {args.batch_size} per process, {len(loader)} batches per process and epoch, fast path "
        f"{loader.fast_path}" + (f"; resumed at epoch {epoch + 1}, batch {start}" if args.resume else "")
    )
    save_at = tuple(int(v) for v in args.save_at.split(":")) if args.save_at else None
    while epoch < args.epochs:
        t0, seen, loss_sum = time.perf_counter(), 0, torch.zeros(())
        for step, batch in enumerate(loader, start):
            images, labels = batch[0], batch[1]
            loss = F.cross_entropy(model(images.float().div_(255)), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss_sum += loss.detach().cpu() * len(labels)  # summed here, read once an epoch (no sync per step)
            seen += len(labels)
            if on_batch is not None:
                on_batch(accelerator, loader, epoch, step, batch)
            if save_at == (epoch, step + 1):  # after step + 1 batches of this epoch
                accelerator.save_state(args.state)
                accelerator.print(f"  state saved to {args.state} after {step + 1} batches of epoch {epoch + 1}")
        wall = time.perf_counter() - t0
        accelerator.print(
            f"  epoch {epoch + 1}/{args.epochs}  loss {float(loss_sum) / max(seen, 1):.3f}  "
            f"train {seen / max(wall, 1e-9):7.0f} img/s per process ({seen} images on this one)"
        )
        epoch, start = epoch + 1, 0
    accelerator.wait_for_everyone()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", help="a packed image dataset (fastload pack FOLDER DIR)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=1, help="fastload decode threads per process")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-at", default=None, help="EPOCH:BATCHES: save the state after that many batches")
    ap.add_argument("--state", default="accelerate_state", help="where --save-at saves")
    ap.add_argument("--resume", default=None, help="a state saved by --save-at to go on from")
    return ap.parse_args(argv)


if __name__ == "__main__":
    train(parse_args())
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()  # before exit: gloo's threads left to process exit can abort a rank
