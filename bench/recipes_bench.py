"""The recipes people train with, built by torchvision's and timm's OWN objects, and the data they already have
(Parquet, WebDataset tar): torch's DataLoader running them per sample against fastload (issue 30 item 5).

Recipes (each row group runs the same transform object in every loader):

  tv classic     torchvision ``Compose([RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(), Normalize])``
  tv v2 recipe   torchvision.transforms.v2: RandomResizedCrop(176), flip, TrivialAugmentWide, PILToTensor,
                 ToDtype(float32, scale=True), Normalize, RandomErasing(0.1)
  timm train     ``timm.data.create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5",
                 re_prob=0.25, interpolation="bilinear")`` (the DeiT/ViT recipe)
  timm eval      ``timm.data.create_transform(224)`` (Resize, CenterCrop, ToTensor, Normalize: deterministic)

Loaders per recipe:

  torch          ``torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(folder, transform=recipe))``
                 (per sample, PIL: pillow-simd in this project's venv)
  fastload       ``fastload.DataLoader(fastload.open(folder, transforms={"image": recipe}))``
  one import     ``fastload.DataLoader(torchvision.datasets.ImageFolder(folder, transform=recipe))``: the script
                 with only its DataLoader import changed

plus ``timm.data.create_loader`` against ``fastload.timm.create_loader`` (same arguments; skipped, saying why,
when fastload has no ``fastload.timm``), and one row per new source with the tv classic recipe: a Hugging Face
style Parquet file (image struct ``{bytes, path}`` + ClassLabel) read by a map-style Dataset with pyarrow + PIL,
and WebDataset tar shards (``{key}.jpg`` + ``{key}.cls``) read by ``webdataset`` when installed, else by a
tarfile-reading IterableDataset (shards split over workers), against ``fastload.open(source, ...)``.

All: batch ``--batch-size`` (64), ``--workers`` (2: processes for torch, decode threads for fastload), shuffle
(not for the tar IterableDataset), drop_last, persistent workers. Data: synthetic photo-like JPEGs (smooth colour
fields, edges, texture and noise, about 500 x 375, 8 classes) built once under ``--data``, or bench/photos.py's
real photographs with ``--photos N`` (N per class; needs its pinned wheels). Each group's loaders alternate
rounds after a warm-up round; rows are medians; ratios are within the group and this run.

Rows are isolated by waiting, not by stopping workers: a row's loader keeps its persistent workers (processes for
torch, threads for fastload) from round to round, as a training script's loader does, so worker start-up stays out
of every timed round. Its workers go idle once an epoch is drained (torch's persistent workers prefetch only when
the next ``iter()`` resets them, inside that row's own window), and after each round (and the warm-up) the bench
waits, untimed, until this process and all its child processes use under 15% of a core (``_common.settle``), so
the next row's window never starts while the previous row's loader still runs. The report gives the most CPU any
row's loader used after its own window (the /proc reads that measure it count too: about 0.01 s a sample), and
names a row that was still busy after 5 s (then the next row's timing shared the CPU with it).

Agreement, per row: per-channel mean / std over every batch the row loaded (every 8th pixel row and column),
their largest difference from the group's torch row, and the total-variation distance between the row's label
histogram (every label it yielded) and torch's. On the deterministic recipe (timm eval) the first samples are
also compared pixel for pixel: ``fastload.open(...)[i]`` against ``ImageFolder[i]``.

    python bench/recipes_bench.py [--count 600] [--rounds 3] [--out bench/results/recipes_cpu2.md] [--csv ...]
    python bench/recipes_bench.py --quick        # the smallest mode (what tests/test_recipes_bench.py runs)

Needs torchvision and timm: in this project, the test-only venv of scripts/timm_test_venv.sh
(``bench/.venvs/timm/bin/python bench/recipes_bench.py``), with PYTHONPATH at the checkout whose fastload it
measures.
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
import tarfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastload  # noqa: E402
from _common import alternate, command, heading, medians, parser, publish, settle, spread, write_csv  # noqa: E402

CLASSES = 8


# ------------------------------------------------------------------------------------------- data

def photo_like(rng: np.random.Generator, cls: int) -> np.ndarray:
    """An RGB uint8 picture with a photograph's structure at about 500 x 375: a smooth colour field tinted by
    the class, a few soft-edged shapes, a textured band and sensor noise (so JPEG sizes and decode cost are a
    photo's, not a flat image's)."""
    h, w = int(rng.integers(350, 400)), int(rng.integers(470, 530))
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.array([(cls * 37) % 256, (cls * 91 + 60) % 256, (cls * 53 + 120) % 256], np.float32)
    img = np.empty((h, w, 3), np.float32)
    for c in range(3):
        fx, fy, ph = rng.uniform(0.5, 3.0, 3) * (math.pi / w, math.pi / h, 1.0)
        img[..., c] = base[c] * 0.6 + 60 * np.sin(fx * x + ph) * np.cos(fy * y) + rng.uniform(-30, 30)
    for _ in range(int(rng.integers(2, 6))):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(20, 120)
        mask = 0.5 - 0.5 * np.tanh((np.hypot(y - cy, x - cx) - r) / 6)
        img += mask[..., None] * rng.uniform(-90, 90, 3).astype(np.float32)
    band = (y > rng.uniform(0, h * 0.7)) & (y < rng.uniform(h * 0.7, h))
    img += band[..., None] * rng.normal(0, 18, (h, w, 1)).astype(np.float32)
    img += rng.normal(0, 6, (h, w, 3)).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def synthetic_folder(data: Path, count: int) -> Path:
    """An ImageFolder of ``count`` photo-like JPEGs in 8 classes under ``data``, built once (a stamp written
    last marks it complete) and reused."""
    from PIL import Image

    folder = data / f"recipes_synth_{count}"
    stamp = folder / ".complete"
    if stamp.exists():
        return folder
    rng = np.random.default_rng(0)
    for i in range(count):
        cls = i % CLASSES
        (folder / f"class_{cls}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo_like(rng, cls)).save(folder / f"class_{cls}" / f"{i:05d}.jpg",
                                                   quality=int(rng.integers(80, 95)))
    stamp.write_text(json.dumps({"count": count, "classes": CLASSES}))
    return folder


def folder_samples(folder: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """(classes, [(file, label)]) in ImageFolder's order."""
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    return classes, [(f, k) for k, c in enumerate(classes) for f in sorted((folder / c).glob("*.jpg"))]


def parquet_file(folder: Path) -> Path:
    """The folder's JPEGs as Hugging Face writes an image dataset: an Image struct ``{bytes, path}`` and a
    ClassLabel, its names in the schema metadata (bytes untouched), next to the folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = folder.with_name(folder.name + ".parquet")
    if path.exists():
        return path
    classes, samples = folder_samples(folder)
    features = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": classes}}
    schema = pa.schema([("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                        ("label", pa.int64())], metadata={"huggingface": json.dumps({"info": {"features": features}})})
    table = pa.table({"image": [{"bytes": f.read_bytes(), "path": f.name} for f, _ in samples],
                      "label": [k for _, k in samples]}, schema=schema)
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp, row_group_size=64)
    tmp.rename(path)
    return path


def tar_shards(folder: Path, shards: int = 4) -> Path:
    """The folder's JPEGs as WebDataset shards (``{key}.jpg`` + ``{key}.cls``), samples dealt round-robin, in a
    folder next to it."""
    out = folder.with_name(folder.name + "_wds")
    if (out / ".complete").exists():
        return out
    out.mkdir(exist_ok=True)
    _, samples = folder_samples(folder)
    for s in range(shards):
        with tarfile.open(out / f"shard-{s:03d}.tar", "w") as tf:
            for i, (f, k) in enumerate(samples[s::shards]):
                for name, data in ((f"{s:03d}_{i:05d}.jpg", f.read_bytes()), (f"{s:03d}_{i:05d}.cls", b"%d" % k)):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    (out / ".complete").write_text(str(shards))
    return out


# ---------------------------------------------------------------------------------------- recipes

def recipes() -> dict[str, Callable[[], Any]]:
    """name -> a builder of the recipe object, exactly as its training script builds it."""
    import timm.data
    import torchvision.transforms as tv1
    from torchvision.transforms import v2

    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    return {
        "tv classic": lambda: tv1.Compose([tv1.RandomResizedCrop(224), tv1.RandomHorizontalFlip(), tv1.ToTensor(),
                                           tv1.Normalize(mean, std)]),
        "tv v2 recipe": lambda: v2.Compose([v2.RandomResizedCrop(176), v2.RandomHorizontalFlip(),
                                            v2.TrivialAugmentWide(), v2.PILToTensor(),
                                            v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std),
                                            v2.RandomErasing(0.1)]),
        "timm train": lambda: timm.data.create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5",
                                                         re_prob=0.25, interpolation="bilinear"),
        "timm eval": lambda: timm.data.create_transform(224),
    }


class ParquetRows(torch.utils.data.Dataset):
    """What a Hugging Face user's Dataset does per item: the table read with pyarrow (memory-mapped, once per
    process), one row's image bytes decoded with PIL, the transform applied."""

    def __init__(self, path: Path, transform):
        self.path, self.transform, self.table = path, transform, None
        import pyarrow.parquet as pq

        self.n = pq.ParquetFile(path).metadata.num_rows

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        from PIL import Image
        import pyarrow.parquet as pq

        if self.table is None:
            self.table = pq.read_table(self.path, memory_map=True)
        row = self.table.slice(i, 1).to_pylist()[0]
        img = Image.open(io.BytesIO(row["image"]["bytes"])).convert("RGB")
        return self.transform(img), row["label"]

    def __getstate__(self):
        return {**self.__dict__, "table": None}


class TarSamples(torch.utils.data.IterableDataset):
    """A tar-reading IterableDataset as people write one without webdataset: each worker takes every
    ``num_workers``-th shard, groups members by key, decodes the jpg with PIL and applies the transform."""

    def __init__(self, shards: list[Path], transform):
        self.shards, self.transform = shards, transform

    def __iter__(self):
        from PIL import Image

        info = torch.utils.data.get_worker_info()
        mine = self.shards[info.id::info.num_workers] if info else self.shards
        for shard in mine:
            sample: dict[str, bytes] = {}
            with tarfile.open(shard) as tf:
                for member in tf:
                    key, ext = member.name.split(".", 1)
                    sample[ext] = tf.extractfile(member).read()
                    if "jpg" in sample and "cls" in sample:
                        img = Image.open(io.BytesIO(sample.pop("jpg"))).convert("RGB")
                        yield self.transform(img), int(sample.pop("cls"))


def webdataset_loader(shards: list[Path], transform, options: dict):
    """``webdataset`` reading the shards, when it is installed (else None)."""
    try:
        import webdataset as wds
    except ImportError:
        return None
    ds = (wds.WebDataset([str(s) for s in shards], shardshuffle=False, empty_check=False)
          .decode("pil").to_tuple("jpg", "cls").map_tuple(transform, int))
    return torch.utils.data.DataLoader(ds, **{k: v for k, v in options.items() if k != "shuffle"})


# ----------------------------------------------------------------------------------------- timing

class Stats:
    """A row's agreement figures: per-channel sums over every batch (every 8th pixel row and column, so that the
    statistics cost nothing next to loading), every label's count."""

    def __init__(self, classes: int):
        self.n, self.s, self.s2, self.labels, self.dtype = 0, 0.0, 0.0, np.zeros(classes, np.int64), None

    def batch(self, images: torch.Tensor, labels) -> None:
        counts = np.bincount(np.asarray(labels).ravel(), minlength=self.labels.size)
        if counts.size > self.labels.size:  # never dropped silently: a label past the folder's classes is a bug
            raise ValueError(f"a batch has label {counts.size - 1}, but the folder has {self.labels.size} classes")
        self.labels += counts
        self.dtype = str(images.dtype).replace("torch.", "")
        x = images[:, :, ::8, ::8].to(torch.float64)
        self.n += x.numel() // x.shape[1]
        self.s = self.s + x.sum(dim=(0, 2, 3)).numpy()
        self.s2 = self.s2 + (x * x).sum(dim=(0, 2, 3)).numpy()

    def mean(self) -> np.ndarray:
        return self.s / self.n

    def std(self) -> np.ndarray:
        return np.sqrt(np.maximum(self.s2 / self.n - self.mean() ** 2, 0))

    def hist(self) -> np.ndarray:
        return self.labels / max(self.labels.sum(), 1)


def drain(loader, epochs: int, stats: Stats) -> Callable[[], int]:
    def run() -> int:
        n = 0
        for _ in range(epochs):
            for images, labels in loader:
                stats.batch(images, labels)
                n += images.shape[0]
        return n
    return run


def exact_check(folder: Path, make, count: int = 8) -> str:
    """The deterministic recipe's first ``count`` samples, fastload's against torchvision's ImageFolder."""
    import torchvision

    tv = torchvision.datasets.ImageFolder(str(folder), transform=make())
    fl = fastload.open(folder, transforms={"image": make()})
    diffs = []
    for i in range(min(count, len(tv))):
        a, la = tv[i]
        b, lb = fl[i][0], int(fl[i][1])
        if la != lb:
            return f"sample {i}: label {lb} != torchvision's {la}"
        diffs.append(float((a.float() - b.float()).abs().max()))
    return f"first {len(diffs)} samples: max |fastload - torchvision| = {max(diffs):.3g}"


def run_group(name: str, configs: dict[str, Callable[[], Any]], rounds: int, epochs: int, classes: int,
              skipped: list[str]) -> list[dict]:
    """Build the group's loaders, alternate their rounds, return one row per loader (the torch row first); none,
    with the reason in ``skipped``, where a loader loaded nothing."""
    stats = {k: Stats(classes) for k in configs}
    runs = {}
    for k, make in configs.items():
        loader = make()
        if loader is None:
            continue
        runs[k] = drain(loader, epochs, stats[k])
    print(f"[{name}] {', '.join(runs)}: warm-up + {rounds} round(s)", flush=True)
    after: dict[str, list[tuple[float, bool]]] = {k: [] for k in runs}
    timings = alternate(runs, rounds, between=lambda k: after[k].append(settle()))
    empty = [k for k, v in timings.items() if not all(r.result for r in v)]
    if empty:  # e.g. an IterableDataset's worker shares smaller than one drop_last batch
        skipped.append(f"{name}: {', '.join(empty)} loaded no sample in a round (fewer samples than one drop_last "
                       f"batch, per worker for an IterableDataset): a larger --count or a smaller --batch-size")
        return []
    rates = {k: [r.result / r.wall for r in v] for k, v in timings.items()}
    med = medians(rates)
    base = next(iter(runs))
    rows = []
    for k in runs:
        st, ref = stats[k], stats[base]
        rows.append({"group": name, "loader": k, "rates": rates[k], "median": med[k], "ratio": med[k] / med[base],
                     "dtype": st.dtype, "mean": st.mean(), "std": st.std(),
                     "dmean": float(np.abs(st.mean() - ref.mean()).max()),
                     "dstd": float(np.abs(st.std() - ref.std()).max()),
                     "tv": 0.5 * float(np.abs(st.hist() - ref.hist()).sum()), "labels": st.labels.tolist(),
                     "after_s": max(c for c, _ in after[k]), "busy": not all(quiet for _, quiet in after[k])})
    return rows


# ------------------------------------------------------------------------------------------- main

def main() -> None:
    ap = parser(__doc__, rounds=3, epochs=1, batch_size=64, out=True, csv=True)
    ap.add_argument("--count", type=int, default=600, help="synthetic photo-like JPEGs (8 classes)")
    ap.add_argument("--photos", type=int, default=None, help="use bench/photos.py's real photos, N per class")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", default=None, help="comma-separated groups to run (default: all)")
    ap.add_argument("--quick", action="store_true", help="smallest mode: 96 images, batch 16, 1 round")
    ap.add_argument("--note", default="", help="a line the report carries (e.g. the machine's load)")
    args = ap.parse_args()
    if args.quick:
        args.count, args.batch_size, args.rounds = 96, 16, 1
    import timm
    import timm.data
    import torchvision

    if args.photos:
        from _common import photo_folder
        folder = photo_folder(args.data, args.photos)
    else:
        folder = synthetic_folder(args.data, args.count)
    # fastload.open's pack-once cache, for the one-import rows' packs too: under --data, not in ~/.cache
    os.environ["FASTLOAD_CACHE_DIR"] = str((args.data / "recipes_cache").resolve())
    classes, samples = folder_samples(folder)
    n_images, n_classes = len(samples), len(classes)  # 8 synthetic classes; bench/photos.py's photos have 12
    options = dict(batch_size=args.batch_size, shuffle=True, num_workers=args.workers, drop_last=True,
                   persistent_workers=True)
    made = recipes()
    groups: dict[str, dict[str, Callable[[], Any]]] = {}
    for r, make in made.items():
        groups[r] = {
            "torch DataLoader + ImageFolder": lambda m=make: torch.utils.data.DataLoader(
                torchvision.datasets.ImageFolder(str(folder), transform=m()), **options),
            "fastload.open + fastload.DataLoader": lambda m=make: fastload.DataLoader(
                fastload.open(folder, transforms={"image": m()}), **options),
            "fastload.DataLoader(ImageFolder) (one import)": lambda m=make: fastload.DataLoader(
                torchvision.datasets.ImageFolder(str(folder), transform=m()), **options),
        }
    skipped: list[str] = []
    timm_args = dict(input_size=(3, 224, 224), batch_size=args.batch_size, is_training=True,
                     auto_augment="rand-m9-mstd0.5", re_prob=0.25, interpolation="bilinear",
                     num_workers=args.workers, use_prefetcher=False, device=torch.device("cpu"))
    try:
        import fastload.timm as fl_timm
    except ImportError as e:
        fl_timm = None
        skipped.append(f"timm loader (timm.data.create_loader vs fastload.timm.create_loader): no fastload.timm "
                       f"in this fastload ({e})")
    if fl_timm is not None:
        groups["timm loader"] = {
            "timm.data.create_loader": lambda: timm.data.create_loader(
                timm.data.ImageDataset(str(folder)), **timm_args),
            "fastload.timm.create_loader": lambda: fl_timm.create_loader(
                timm.data.ImageDataset(str(folder)), **timm_args),
        }
    classic = made["tv classic"]
    try:
        import pyarrow  # noqa: F401
        pq_path = parquet_file(folder)
        groups["Parquet (tv classic)"] = {
            "torch DataLoader + pyarrow/PIL Dataset": lambda: torch.utils.data.DataLoader(
                ParquetRows(pq_path, classic()), **options),
            "fastload.open(parquet) + fastload.DataLoader": lambda: fastload.DataLoader(
                fastload.open(pq_path, transforms={"image": classic()}), **options),
        }
    except ImportError as e:
        skipped.append(f"Parquet: {e}")
    shard_dir = tar_shards(folder)
    shards = sorted(shard_dir.glob("*.tar"))
    iter_options = {k: v for k, v in options.items() if k != "shuffle"}
    wds_name = "torch DataLoader + webdataset" if webdataset_loader(shards, classic(), options) is not None else \
        "torch DataLoader + tarfile IterableDataset"
    groups["WebDataset tar (tv classic)"] = {
        wds_name: lambda: (webdataset_loader(shards, classic(), options)
                           or torch.utils.data.DataLoader(TarSamples(shards, classic()), **iter_options)),
        "fastload.open(tar shards) + fastload.DataLoader": lambda: fastload.DataLoader(
            fastload.open(shard_dir / "shard-{000..003}.tar", transforms={"jpg": classic()}),
            **options),
    }
    if args.only:
        wanted = set(args.only.split(","))
        groups = {k: v for k, v in groups.items() if k in wanted}

    rows, exact = [], None
    for name, configs in groups.items():
        rows += run_group(name, configs, args.rounds, args.epochs, n_classes, skipped)
        if name == "timm eval":
            exact = exact_check(folder, made["timm eval"])

    source = (f"bench/photos.py's photos ({args.photos} per class)" if args.photos else
              f"{n_images} synthetic photo-like JPEGs (about 500 x 375, {CLASSES} classes)")
    lines = [heading("Recipes built by torchvision's and timm's own objects, and the new sources"), ""]
    if args.note:
        lines += [f"**{args.note}**", ""]
    lines += [(f"`{command()}`: {args.epochs} epoch(s) of {source} per round, batch {args.batch_size}, "
               f"{args.workers} workers (processes for torch, threads for fastload), shuffle, drop_last, persistent; "
               f"medians of {args.rounds} alternating round(s) after a warm-up round, within each group. "
               f"torch {torch.__version__}, torchvision {torchvision.__version__}, timm {timm.__version__}, "
               f"fastload from {Path(fastload.__file__).parent}."), "",
              "Agreement: per-channel mean/std over every batch the row loaded, warm-up included (every 8th pixel row "
              "and column); "
              "Δ = largest channel difference from the group's first row; TV = total-variation distance of the "
              "label histogram from the first row's (0 = same distribution).", "",
              "| group | loader | samples/s (median) | min-max | vs first row | out dtype | mean (R,G,B) | "
              "std (R,G,B) | Δmean | Δstd | label TV |",
              "|---|---|---:|---:|---:|---|---|---|---:|---:|---:|"]
    for r in rows:
        fmt = lambda v: ", ".join(f"{x:.3f}" for x in v)  # noqa: E731
        lines.append(f"| {r['group']} | {r['loader']} | {spread(r['rates'])} | {r['ratio']:.2f}x | {r['dtype']} | "
                     f"{fmt(r['mean'])} | {fmt(r['std'])} | {r['dmean']:.3f} | {r['dstd']:.3f} | {r['tv']:.3f} |")
    if rows:
        worst = max(rows, key=lambda r: r["after_s"])
        lines += ["", f"Isolation: after each round of a row, the next starts once this process and its workers are "
                      f"idle; the most CPU a row's loader used after its own window: {worst['after_s']:.2f} s "
                      f"({worst['group']}: {worst['loader']})."]
    lines += [f"- NOT ISOLATED: {r['group']}: {r['loader']} was still busy 5 s after a round: the next row's timing "
              f"shares the CPU with it" for r in rows if r["busy"]]
    if exact:
        lines += ["", f"timm eval (deterministic), fastload.open(...)[i] vs ImageFolder[i]: {exact}"]
    if skipped:
        lines += ["", "Not measured:"] + [f"- {s}" for s in skipped]
    lines += ["", "Issue 30's targets: every recipe >= 2.5x torch's DataLoader at 2 workers; fastload.timm's loader "
                  ">= 2x timm.data.create_loader; statistics and label distributions matching."]
    publish(lines, args.out)
    write_csv(args.csv, ({"group": r["group"], "loader": r["loader"], "round": i, "samples_per_s": f"{v:.1f}",
                          "ratio_median": f"{r['ratio']:.3f}", "dtype": r["dtype"],
                          "mean": " ".join(f"{x:.4f}" for x in r["mean"]),
                          "std": " ".join(f"{x:.4f}" for x in r["std"]), "dmean": f"{r['dmean']:.4f}",
                          "dstd": f"{r['dstd']:.4f}", "label_tv": f"{r['tv']:.4f}",
                          "cpu_after_window_s": f"{r['after_s']:.3f}",
                          "labels": " ".join(map(str, r["labels"]))}
                         for r in rows for i, v in enumerate(r["rates"])))


if __name__ == "__main__":
    main()
