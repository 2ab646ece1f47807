"""Train with fastload under PyTorch Lightning: return a ``fastload.DataLoader`` from ``train_dataloader``.

Nothing else changes. With ``devices=2`` Lightning re-creates the loader with a ``DistributedSampler``
(and ``collate_fn=default_collate``); fastload keeps the fast path with that sampler driving the order
(each rank its disjoint share, reshuffled each epoch by Lightning's ``set_epoch``), and Lightning saves
the loader's ``state_dict`` in every checkpoint, so a checkpoint taken mid-epoch resumes at the next batch::

    python examples/lightning_train.py PACKED_DIR --devices 2 --strategy ddp --epochs 2
    python examples/lightning_train.py PACKED_DIR --devices 2 --strategy ddp --resume last.ckpt

``PACKED_DIR`` is a packed image dataset (``fastload pack FOLDER PACKED_DIR``). CPU only here
(``accelerator="cpu"``, gloo); on GPUs pass ``--accelerator gpu``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

if importlib.util.find_spec("fastload") is None:  # run from a clone without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import lightning as L  # noqa: E402

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402


class PackedImages(L.LightningDataModule):
    def __init__(self, path: str, image_size: int = 32, batch_size: int = 16, num_workers: int = 1, seed: int = 0):
        super().__init__()
        self.path, self.image_size, self.batch_size = path, image_size, batch_size
        self.num_workers, self.seed = num_workers, seed

    def train_dataloader(self) -> fastload.DataLoader:
        ds = fastload.open(
            self.path, transforms={"image": [T.RandomResizedCrop(self.image_size), T.RandomHorizontalFlip()]}
        )
        return fastload.DataLoader(
            ds, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers, seed=self.seed
        )


class SmallCNN(L.LightningModule):
    def __init__(self, num_classes: int, lr: float = 0.05):
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, num_classes),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images.float().div_(255))  # uint8 NCHW (channels_last) from the loader

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        images, labels = batch[0], batch[1]  # (image, label, ...) as the dataset's fields
        return F.cross_entropy(self(images), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def make_trainer(args: argparse.Namespace, callbacks: list | None = None) -> L.Trainer:
    return L.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy=args.strategy,
        max_epochs=args.epochs,
        callbacks=callbacks or [],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.root,
        num_sanity_val_steps=0,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", help="a packed image dataset (fastload pack FOLDER DIR)")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--strategy", default="ddp", help="ddp, ddp_spawn, auto ...")
    ap.add_argument("--accelerator", default="cpu")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=1, help="fastload decode threads per rank")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--root", default="lightning_out", help="checkpoints go here")
    ap.add_argument("--resume", default=None, help="a checkpoint to resume from (mid-epoch works)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    L.seed_everything(args.seed)
    data = PackedImages(args.data, args.image_size, args.batch_size, args.workers, args.seed)
    classes = fastload.open(args.data).classes or []
    make_trainer(args).fit(SmallCNN(max(len(classes), 2)), datamodule=data, ckpt_path=args.resume)


if __name__ == "__main__":
    main()
