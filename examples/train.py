"""Train a small CNN on the photo dataset, reading it with torch's DataLoader or fastload's.

The task: tell which of the 12 source photographs (``bench/photos.py``) a JPEG crop comes from. The
train split is the photo ImageFolder built with seed 0, the validation split the one built with
seed 1 (other crops of the same photographs: held-out images of the same classes).

``--loader fastload`` packs each split once (``fastload.pack``) and reads it with::

    fastload.open(packed, transforms={"image": [T.RandomResizedCrop(S), T.RandomHorizontalFlip()]})
    fastload.DataLoader(ds, batch_size=B, shuffle=True, num_workers=N, seed=seed)

``--loader torch`` is what a user writes without fastload: a map-style Dataset over the JPEG files
that decodes with PIL, and ``torch.utils.data.DataLoader(..., shuffle=True, num_workers=N)``.
torchvision is not installed here, so the transforms run through ``fastload.transforms.apply_pil``:
the same arithmetic as torchvision's ``RandomResizedCrop`` (scale (0.08, 1), ratio (3/4, 4/3), 10
attempts then the centre fallback), ``RandomHorizontalFlip``, ``Resize`` (shorter side) and
``CenterCrop``, executed with PIL (crop, antialiased bilinear resize, flip), as torchvision's
``F.resized_crop`` does on PIL images. Each loader draws its own random crops; only the arithmetic
is shared, so the two runs see statistically identical, not identical, augmentations.

Both yield uint8 (B, 3, S, S) images; the loop converts to float channels_last and normalizes.
Validation uses ``[T.Resize(S / 0.875), T.CenterCrop(S)]``.

``--augment`` adds the torchvision "new recipe"'s augmentations after the crop and flip:
``T.TrivialAugmentWide()`` and ``T.RandomErasing(0.25)`` (issue 21's CPU benchmark recipe). fastload
runs them natively in its decode threads; the torch loader's Dataset runs them per sample through
``apply_pil`` too, which executes the same drawn plan with fastload's PIL reference engine
(torchvision's v1 PIL formulas: ImageEnhance / ImageOps / Image.transform). The comparison then asks
whether the native engine trains a model as well as the reference formulas do.

The model gets ``--threads`` intra-op threads, by default the cores the ``--workers`` leave free (at
least one): on a small machine torch's default (all cores) makes OpenMP's spinning threads fight the
loader's workers for the same cores, and the measured throughput then mostly measures that fight.
The throughput printed is the whole training loop's (model included), over the epochs after the
first, with the share of it spent waiting for the next batch.

    python examples/train.py --loader fastload              # one run
    python examples/train.py --loader torch --seed 1
    python examples/train.py --seeds 0,1,2                  # both loaders per seed, summary table
    python examples/train.py --seeds 0,1,2 --augment        # the same with TrivialAugmentWide + RandomErasing

``--recipe torchvision|torchvision-v2|timm|timm-ra`` trains with a recipe built by that library's OWN objects
instead (needs torchvision, and timm for ``timm`` and ``timm-ra``), passing the same objects to both loaders: torch's
DataLoader runs them per sample, fastload converts them to its native engine, and a recipe that would leave its fast
path is an error. The recipes and what each loader does with them: ``examples/_recipes.py``.

    python examples/train.py --seeds 0,1,2,3,4 --recipe timm

``--out`` (default ``bench/data/train_example``, git-ignored) holds the photo folders, the packed
datasets and ``results.csv`` (one row per run). ``--train-folder``/``--val-folder`` use existing
ImageFolder trees instead of building the photo dataset (the smoke test does this).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import math
import os
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("fastload") is None:  # run from a clone without `pip install -e .`
    sys.path.insert(0, str(ROOT))

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402

if str(Path(__file__).resolve().parent) not in sys.path:  # loaded by its path (the tests), not run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _recipes import RECIPES, Recipe, library_recipe, require_fast_path  # noqa: E402

DEFAULT_OUT = ROOT / "bench" / "data" / "train_example"
# ImageNet statistics, on the 0..255 scale, shaped to broadcast over NCHW.
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255


def augment_transforms() -> list:
    """The augmentations ``--augment`` adds after the crop and flip (both loaders)."""
    return [T.TrivialAugmentWide(), T.RandomErasing(0.25)]


def train_transforms(size: int, augment: bool = False) -> list:
    return [T.RandomResizedCrop(size), T.RandomHorizontalFlip()] + (augment_transforms() if augment else [])


def val_transforms(size: int) -> list:
    return [T.Resize(round(size / 0.875)), T.CenterCrop(size)]


# ----------------------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Splits:
    train_folder: Path
    val_folder: Path
    train_packed: Path
    val_packed: Path
    classes: list[str]


def _pack_once(folder: Path, dest: Path, rebuilt: bool) -> None:
    """Pack ``folder`` into ``dest`` unless a complete pack of the same tree is already there."""
    if (dest / "manifest.json").exists() and not rebuilt:
        return
    t0 = time.perf_counter()
    summary = fastload.pack(folder, dest, overwrite=dest.exists(), workers=1)
    print(f"packed {folder} -> {dest}: {summary.samples} samples in {time.perf_counter() - t0:.1f} s", flush=True)


def _classes(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def prepare_data(
    out: Path, per_class: int, val_per_class: int, train_folder: Path | None = None, val_folder: Path | None = None
) -> Splits:
    """Build (or reuse) the photo folders and their packed copies under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    if (train_folder is None) != (val_folder is None):
        raise ValueError(
            f"{train_folder=} and {val_folder=}: give both --train-folder and --val-folder, or neither "
            f"(to build the photo dataset)"
        )
    if train_folder is None:
        sys.path.insert(0, str(ROOT / "bench"))
        from photos import build_photo_folder

        train_folder, val_folder = out / f"photos_train_{per_class}", out / f"photos_val_{val_per_class}"
        rebuilt = []
        for folder, count, seed in ((train_folder, per_class, 0), (val_folder, val_per_class, 1)):
            info = build_photo_folder(folder, per_class=count, seed=seed, workers=1, progress=False)
            rebuilt.append(not info["reused"])
    else:
        rebuilt = [True, True]  # a folder we did not build may have changed: pack afresh
    train_packed, val_packed = out / (train_folder.name + ".fastload"), out / (val_folder.name + ".fastload")
    _pack_once(train_folder, train_packed, rebuilt[0])
    _pack_once(val_folder, val_packed, rebuilt[1])
    classes = _classes(train_folder)
    if _classes(val_folder) != classes:
        raise ValueError(
            f"the train classes {classes} and the validation classes {_classes(val_folder)} differ; "
            f"both folders need the same class subfolders"
        )
    return Splits(train_folder, val_folder, train_packed, val_packed, classes)


class PilImageFolder(torch.utils.data.Dataset):
    """ImageFolder over JPEG files, decoded with PIL, transformed with ``fastload.transforms.apply_pil``
    (augmentations included: the PIL reference engine runs the sample's drawn operations).

    Augmentation randomness comes from a numpy Generator seeded with ``torch.initial_seed()`` of the
    process using it: the loader's seed in the main process, torch's per-worker seed in a worker. So
    a run is reproducible from ``--seed`` and each worker draws its own stream, as with torchvision.
    """

    def __init__(self, root: Path, transforms: list):
        self.classes = _classes(root)
        index = {c: i for i, c in enumerate(self.classes)}
        self.files = sorted(
            p for c in self.classes for p in (root / c).iterdir() if p.suffix.lower() in (".jpg", ".jpeg")
        )
        self.labels = [index[p.parent.name] for p in self.files]
        self.pipeline = T.ImagePipeline(transforms)
        self._rng: np.random.Generator | None = None
        self._rng_seed: int | None = None

    def __len__(self) -> int:
        return len(self.files)

    def _generator(self) -> np.random.Generator:
        seed = torch.initial_seed()
        if self._rng is None or self._rng_seed != seed:
            self._rng, self._rng_seed = np.random.default_rng(seed), seed
        return self._rng

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        with Image.open(self.files[i]) as img:
            out = T.apply_pil(self.pipeline, img.convert("RGB"), self._generator())
        return torch.from_numpy(np.array(out)).permute(2, 0, 1), self.labels[i]


def make_loaders(
    kind: str,
    splits: Splits,
    size: int,
    batch_size: int,
    workers: int,
    seed: int,
    augment: bool = False,
    recipe: Recipe | None = None,
):
    """(train loader, validation loader) of one kind; both yield (B, 3, size, size) images and int64 labels:
    uint8 with fastload's own transforms (``augment``: the training split also gets ``augment_transforms()``),
    normalized float32 with a library ``recipe``, whose objects both kinds are given unchanged: fastload converts
    them, torch's loader runs them per sample on torchvision's ImageFolder."""
    if recipe is None:
        train_tf, val_tf = train_transforms(size, augment), val_transforms(size)
    else:
        train_tf, val_tf = recipe.train, recipe.val
    if kind == "fastload":
        if recipe is not None:
            require_fast_path(recipe)
        train = fastload.open(splits.train_packed, transforms={"image": train_tf})
        val = fastload.open(splits.val_packed, transforms={"image": val_tf})
        if list(train.classes) != splits.classes:
            raise ValueError(
                f"{splits.train_packed} has classes {train.classes}, the folder {splits.classes}: "
                f"repack it (delete {splits.train_packed})"
            )
        return (
            fastload.DataLoader(
                train, batch_size=batch_size, shuffle=True, num_workers=workers, drop_last=True, seed=seed
            ),
            fastload.DataLoader(val, batch_size=batch_size, shuffle=False, num_workers=workers),
        )
    if kind == "torch":
        if recipe is None:
            train_set = PilImageFolder(splits.train_folder, train_tf)
            val_set = PilImageFolder(splits.val_folder, val_tf)
        else:
            from torchvision.datasets import ImageFolder

            train_set = ImageFolder(str(splits.train_folder), transform=train_tf)
            if list(train_set.classes) != splits.classes:
                raise ValueError(
                    f"{splits.train_folder}: ImageFolder's classes {train_set.classes}, ours {splits.classes}"
                )
            val_set = ImageFolder(str(splits.val_folder), transform=val_tf)
        extra = {"persistent_workers": True} if workers > 0 else {}
        return (
            torch.utils.data.DataLoader(
                train_set,
                batch_size=batch_size,
                shuffle=True,
                num_workers=workers,
                drop_last=True,
                generator=torch.Generator().manual_seed(seed),
                **extra,
            ),
            torch.utils.data.DataLoader(val_set, batch_size=batch_size, shuffle=False, num_workers=workers, **extra),
        )
    raise ValueError(f"loader={kind!r} should be 'torch' or 'fastload'")


# ---------------------------------------------------------------------------------------- model


def conv_bn(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class SmallCNN(nn.Module):
    """Five 3x3 conv-BN-ReLU layers (four of them stride 2), global average pooling, a linear head."""

    def __init__(self, num_classes: int, width: int = 32):
        super().__init__()
        w = width
        self.features = nn.Sequential(
            conv_bn(3, w, 2),
            conv_bn(w, 2 * w, 2),
            conv_bn(2 * w, 2 * w, 1),
            conv_bn(2 * w, 4 * w, 2),
            conv_bn(4 * w, 8 * w, 2),
        )
        self.head = nn.Linear(8 * w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


def to_input(images: torch.Tensor) -> torch.Tensor:
    """uint8 (B, 3, H, W) -> normalized float32, channels_last; float images (a library recipe's, normalized by
    its ``Normalize``) only change layout."""
    if images.is_floating_point():
        return images.contiguous(memory_format=torch.channels_last)
    x = images.to(memory_format=torch.channels_last).float()
    return x.sub_(MEAN).div_(STD)


# ------------------------------------------------------------------------------------- training


@dataclass
class RunResult:
    loader: str
    seed: int
    epochs: int
    accuracy: float  # final validation accuracy, 0..1
    img_per_s: float  # training throughput over the epochs after the first
    data_wait: float  # share of that training time spent waiting for batches
    seconds: float  # the whole run, validation included
    epoch_img_per_s: list[float] = field(default_factory=list)
    recipe: str = "fastload"


def evaluate(model: nn.Module, loader) -> float:
    model.eval()
    correct = total = 0
    with torch.inference_mode():
        for images, labels in loader:
            correct += int((model(to_input(images)).argmax(1) == labels).sum())
            total += labels.shape[0]
    return correct / max(total, 1)


def train_run(
    kind: str, seed: int, splits: Splits, args: argparse.Namespace, recipe: Recipe | None = None
) -> RunResult:
    """One training run. With a library ``recipe``, fastload leaving its fast path is an error (a
    ``FastPathWarning`` raised), not a warning: the run would no longer compare what it says it compares."""
    if recipe is None or kind != "fastload":
        return _train_run(kind, seed, splits, args, recipe)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastload.FastPathWarning)
        return _train_run(kind, seed, splits, args, recipe)


def _train_run(kind: str, seed: int, splits: Splits, args: argparse.Namespace, recipe: Recipe | None) -> RunResult:
    torch.manual_seed(seed)
    model = SmallCNN(len(splits.classes)).to(memory_format=torch.channels_last)
    train_loader, val_loader = make_loaders(
        kind, splits, args.image_size, args.batch_size, args.workers, seed, args.augment, recipe
    )
    steps = len(train_loader) * args.epochs
    if steps == 0:
        raise ValueError(f"no training batches: {len(train_loader.dataset)} samples < batch_size={args.batch_size}")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps, pct_start=0.25)
    loss_fn = nn.CrossEntropyLoss()
    print(
        f"-- {kind} loader, seed {seed}: {len(train_loader.dataset)} train / {len(val_loader.dataset)} val "
        f"images, {len(splits.classes)} classes, {args.image_size}px, batch {args.batch_size}, "
        f"{args.workers} workers{', TrivialAugmentWide + RandomErasing(0.25)' if args.augment else ''}"
        f"{f', recipe: {recipe.name} own objects' if recipe is not None else ''}",
        flush=True,
    )
    start = time.perf_counter()
    rates, waits, walls, images_seen = [], [], [], []
    acc = 0.0
    for epoch in range(args.epochs):
        model.train()
        n, loss_sum, wait = 0, 0.0, 0.0
        t0 = time.perf_counter()
        it = iter(train_loader)
        while True:
            w0 = time.perf_counter()
            batch = next(it, None)
            wait += time.perf_counter() - w0
            if batch is None:
                break
            images, labels = batch
            loss = loss_fn(model(to_input(images)), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.item() * labels.shape[0]
            n += labels.shape[0]
        wall = time.perf_counter() - t0
        acc = evaluate(model, val_loader)
        rates.append(n / wall)
        waits.append(wait)
        walls.append(wall)
        images_seen.append(n)
        print(
            f"  epoch {epoch + 1}/{args.epochs}  loss {loss_sum / n:.3f}  train {n / wall:7.0f} img/s "
            f"(waiting for data {100 * wait / wall:4.1f}%)  val acc {100 * acc:5.1f}%",
            flush=True,
        )
    steady = slice(1, None) if args.epochs > 1 else slice(None)  # the first epoch starts workers
    rate = sum(images_seen[steady]) / sum(walls[steady])
    result = RunResult(
        kind,
        seed,
        args.epochs,
        acc,
        rate,
        sum(waits[steady]) / sum(walls[steady]),
        time.perf_counter() - start,
        rates,
        recipe.name if recipe is not None else "fastload",
    )
    print(f"  final val accuracy {100 * acc:.1f}%  ({kind}, seed {seed}; train {rate:.0f} img/s)", flush=True)
    return result


# -------------------------------------------------------------------------------------- summary


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Welch's t-test of ``b``'s mean against ``a``'s: (t, degrees of freedom, two-sided p)."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        return (0.0 if statistics.fmean(a) == statistics.fmean(b) else math.inf), math.nan, math.nan
    t = (statistics.fmean(b) - statistics.fmean(a)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return t, df, _t_two_sided(abs(t), df)


def _t_two_sided(t: float, df: float, steps: int = 4000) -> float:
    """P(|T| >= t) for Student's t with ``df`` degrees of freedom: 1 - the density's integral over [-t, t]
    (Simpson's rule; the standard library has no t distribution and the example needs no scipy)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    h = t / steps
    ys = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(steps + 1)]
    area = h / 3 * (ys[0] + ys[-1] + 4 * sum(ys[1:-1:2]) + 2 * sum(ys[2:-1:2]))
    return max(0.0, 1 - 2 * area)


def summary_table(results: list[RunResult]) -> str:
    kinds = [k for k in ("torch", "fastload") if any(r.loader == k for r in results)]
    lines = [
        "| loader | seeds | val accuracy (mean ± std) | per seed | train img/s (mean) | waiting for data |",
        "|---|---:|---:|---|---:|---:|",
    ]
    rate = {}
    for k in kinds:
        rs = [r for r in results if r.loader == k]
        m, s = _mean_std([100 * r.accuracy for r in rs])
        rate[k] = statistics.fmean(r.img_per_s for r in rs)
        per_seed = ", ".join(f"{r.seed}: {100 * r.accuracy:.1f}" for r in rs)
        lines.append(
            f"| {k} | {len(rs)} | {m:.1f} ± {s:.1f} % | {per_seed} | {rate[k]:,.0f} | "
            f"{100 * statistics.fmean(r.data_wait for r in rs):.0f}% |"
        )
    if len(kinds) == 2:
        by = {(r.loader, r.seed): r.accuracy for r in results}
        diffs = [
            100 * (by["fastload", s] - by["torch", s])
            for s in sorted({r.seed for r in results})
            if ("fastload", s) in by and ("torch", s) in by
        ]
        dm, ds = _mean_std(diffs) if diffs else (math.nan, math.nan)
        lines.append("")
        lines.append(
            f"throughput fastload / torch: {rate['fastload'] / rate['torch']:.2f}x; "
            f"accuracy fastload - torch: {dm:+.1f} points (per-seed differences: std {ds:.1f})"
        )
        accs = {k: [100 * r.accuracy for r in results if r.loader == k] for k in kinds}
        if min(len(v) for v in accs.values()) > 1:
            t, df, p = welch(accs["torch"], accs["fastload"])
            lines.append(f"Welch's t-test, fastload vs torch accuracy: t = {t:+.2f}, df = {df:.1f}, p = {p:.2f}")
    return "\n".join(lines)


def write_csv(path: Path, results: list[RunResult]) -> None:
    rows = [asdict(r) | {"epoch_img_per_s": " ".join(f"{x:.1f}" for x in r.epoch_img_per_s)} for r in results]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loader", choices=("torch", "fastload"), default="fastload")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--seeds",
        default=None,
        help="comma-separated seeds, e.g. 0,1,2: run both loaders per seed and print a summary table",
    )
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=4e-3)
    ap.add_argument("--per-class", type=int, default=100, help="training images per class (photo dataset)")
    ap.add_argument("--val-per-class", type=int, default=50, help="validation images per class (photo dataset)")
    ap.add_argument("--workers", type=int, default=2, help="num_workers of both loaders")
    ap.add_argument(
        "--augment",
        action="store_true",
        help="train with TrivialAugmentWide + RandomErasing(0.25) after the crop and flip",
    )
    ap.add_argument(
        "--recipe",
        choices=RECIPES,
        default="fastload",
        help="the training recipe: fastload's own transforms (default), or one built by torchvision's / timm's own "
        "objects, the same objects passed to both loaders",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads for the model (default: the cores left after --workers, at least 1)",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="data and results.csv go here")
    ap.add_argument("--train-folder", type=Path, default=None, help="an existing ImageFolder instead of the photos")
    ap.add_argument("--val-folder", type=Path, default=None)
    args = ap.parse_args(argv)
    for name in ("epochs", "image_size", "batch_size", "per_class", "val_per_class"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}={getattr(args, name)} should be >= 1")
    if args.workers < 0:
        ap.error(f"--workers={args.workers} should be >= 0")
    if args.threads is not None and args.threads < 1:
        ap.error(f"--threads={args.threads} should be >= 1")
    if args.augment and args.recipe != "fastload":
        ap.error(f"--augment adds fastload's own augmentations; --recipe {args.recipe} brings its own: use one")
    return args


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def main(argv: list[str] | None = None) -> list[RunResult]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads if args.threads is not None else max(1, _cores() - args.workers))
    # one set of objects for every run, both loaders: what differs between them is only who runs the objects
    recipe = library_recipe(args.recipe, args.image_size) if args.recipe != "fastload" else None
    notes = require_fast_path(recipe) if recipe is not None else []
    for note in notes:
        print(f"fastload warned converting --recipe {args.recipe} (kept: the runs measure it): {note}", flush=True)
    splits = prepare_data(args.out, args.per_class, args.val_per_class, args.train_folder, args.val_folder)
    if args.seeds is not None:
        try:
            seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        except ValueError:
            raise SystemExit(f"--seeds={args.seeds!r} should be comma-separated integers, e.g. 0,1,2") from None
        runs = [(kind, s) for s in seeds for kind in ("torch", "fastload")]  # interleaved: load drifts hit both
    else:
        runs = [(args.loader, args.seed)]
    results = [train_run(kind, seed, splits, args, recipe) for kind, seed in runs]
    write_csv(args.out / "results.csv", results)
    if args.seeds is not None:
        print(
            f"\n== summary: {args.epochs} epochs, {args.image_size}px, {args.workers} workers, "
            f"torch threads {torch.get_num_threads()}"
            f"{', augment: TrivialAugmentWide + RandomErasing(0.25)' if args.augment else ''}"
            f"{f', recipe: {args.recipe} own objects in both loaders' if recipe is not None else ''}; "
            f"img/s = training loop (model included), epochs 2+"
        )
        print(summary_table(results), flush=True)
        for note in notes:
            print(f"fastload warned converting the recipe (its effect is in fastload's numbers): {note}", flush=True)
    return results


if __name__ == "__main__":
    main()
