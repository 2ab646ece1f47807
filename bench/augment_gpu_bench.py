"""Augmentation on the GPU (issue 21 item 6, the GPU row). Needs a CUDA device; writes a results file saying so
and exits 0 without one.

  engine    the batched torch engine (fastload/_augment/engine_torch.py ``run_torch``) per batch of 224x224
            uint8 tiles on the GPU, per recipe: GPU time (CUDA events) and the host's time per call (planning
            excluded; the columns' pinned upload included), median over rounds; plus the host's planning time
  loaders   loader-only images/s with the batch on the GPU, RandomResizedCrop 224 + flip + TrivialAugmentWide +
            RandomErasing(0.25) + normalize: fastload with decoder native (fused native engine) / nvjpeg / dali /
            auto (torch engine on the GPU decoders' rows), vs DALI's own pipeline with its
            ``auto_aug.trivial_augment.trivial_augment_wide`` on the same photos

    python bench/augment_gpu_bench.py [--batch-size 256] [--per-class 100] [--rounds 20] [--out FILE]

Without --out the results go to bench/results/augment_gpu_<device name>.md; a section that cannot run (no DALI,
no torchvision) says so in the file. Photos as bench/gpu_bench.py finds them (carried wheels, else synthetic).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402
from _gpu_report import availability, write  # noqa: E402
from gpu_bench import MEAN, STD, compare_loaders, cpu_cores, dali_epochs, photo_folder  # noqa: E402

RECIPES = {
    "TrivialAugmentWide + RandomErasing(0.25)": lambda: [T.TrivialAugmentWide(), T.RandomErasing(0.25)],
    "RandAugment (m9) + RandomErasing(0.25)": lambda: [T.RandAugment(magnitude=9),
                                                                  T.RandomErasing(0.25)],
    "ColorJitter(0.4, 0.4, 0.4, 0.1)": lambda: [T.ColorJitter(0.4, 0.4, 0.4, 0.1)],
    "ThreeAugment": lambda: [T.ThreeAugment()],
}


def tiles(batch: int, device: str, seed: int = 0) -> torch.Tensor:
    """Photo-like uint8 tiles (smooth colour fields), NCHW, on ``device``."""
    g = torch.Generator().manual_seed(seed)
    small = torch.randint(0, 256, (batch, 3, 15, 15), generator=g, dtype=torch.uint8).float()
    x = torch.nn.functional.interpolate(small, size=(224, 224), mode="bicubic", align_corners=False)
    return x.clamp_(0, 255).to(torch.uint8).to(device)


def engine(lines: list[str], batch: int, rounds: int, device: str) -> None:
    from fastload._augment.engine_torch import run_torch
    from fastload._augment.plan import plan_batch

    x = tiles(batch, device)
    hw = np.tile([224, 224], (batch, 1))
    rows = []
    for name, make in RECIPES.items():
        transforms = make()
        rng = np.random.default_rng(0)
        t = time.perf_counter()
        plans = [plan_batch(transforms, hw, rng) for _ in range(rounds + 3)]
        plan_ms = (time.perf_counter() - t) / len(plans) * 1e3
        for p in plans[:3]:  # warm-up: kernels, the caching allocators
            run_torch(x, p)
        gpu, host = [], []
        for p in plans[3:]:
            if device == "cuda":
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t = time.perf_counter()
            run_torch(x, p)
            host.append((time.perf_counter() - t) * 1e3)
            if device == "cuda":
                end.record()
                end.synchronize()
                gpu.append(start.elapsed_time(end))
        g = statistics.median(gpu) if gpu else float("nan")
        rows.append(f"| {name} | {g:.2f} | {g / batch * 1e3:.1f} | {statistics.median(host):.2f} | {plan_ms:.2f} |")
    lines += [f"## Batched torch engine on {device}: run_torch per batch of {batch} x 3x224x224 uint8", "",
              f"median of {rounds} batches (each its own plan); GPU time from CUDA events around the call, host "
              f"time of the call itself (launches + the columns' upload), planning on the host apart", "",
              "| recipe | GPU ms/batch | GPU us/image | host ms/call | plan ms/batch |", "|---|---:|---:|---:|---:|",
              *rows, ""]


def dali_trivial(photos: Path, batch: int, threads: int, gpu: bool = True):
    """DALI's own pipeline with its TrivialAugmentWide (GPU): decode + random crop, resize, flip, the policy,
    erasing left out (DALI has fn.erase, but not torchvision's RandomErasing draw), normalize. ``gpu=False``:
    DALI's CPU-only mode, for tests (the calls checked against the installed DALI where no GPU is)."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.auto_aug import trivial_augment

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=0 if gpu else None, prefetch_queue_depth=2,
                  enable_conditionals=True)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=str(photos), random_shuffle=True, name="files")
        images = fn.decoders.image_random_crop(jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=224, resize_y=224)
        images = fn.flip(images, horizontal=fn.random.coin_flip())
        images = trivial_augment.trivial_augment_wide(images)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD])
        return images, (labels.gpu() if gpu else labels)

    return dali_epochs(pipe(), batch, gpu)


def loaders(lines: list[str], packed: Path, photos: Path, batch: int, reps: int = 3) -> None:
    tfs = {"image": [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.TrivialAugmentWide(),
                     T.RandomErasing(0.25), T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)]}
    ds = fastload.open(packed, transforms=tfs)
    threads = cpu_cores()
    rates, notes = compare_loaders(ds, batch, threads, reps, "DALI pipeline with auto_aug trivial_augment_wide "
                                   "(no erasing)", lambda: dali_trivial(photos, batch, threads))
    lines += ["## Loaders with TrivialAugmentWide on the GPU, images/s", "",
              f"RandomResizedCrop 224 + flip + TrivialAugmentWide + RandomErasing(0.25) + normalize, batch {batch}, "
              f"{threads} CPU threads, median of {reps} alternating epochs", "", "| loader | img/s |", "|---|---:|"]
    lines += [f"| {k} | {statistics.median(v):,.0f} |" for k, v in rates.items()]
    lines += [""] + [f"- {n}" for n in notes] + ([""] if notes else [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("bench/data"))
    ap.add_argument("--per-class", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--engine-only", action="store_true", help="skip the loaders (no photos needed)")
    args = ap.parse_args()
    lines = [f"# Augmentation on the GPU: {time.strftime('%Y-%m-%d')}", "",
             f"torch {torch.__version__}, CUDA {torch.version.cuda}, {cpu_cores()} CPU cores for this process; "
             + ", ".join(availability()), "", "Command: python bench/augment_gpu_bench.py " + " ".join(sys.argv[1:]), ""]
    if not torch.cuda.is_available():
        lines += ["No CUDA device here (torch.cuda.is_available() is False): nothing measured."]
        write(lines, args.out or Path("bench/results/augment_gpu_none.md"))
        return
    name = torch.cuda.get_device_name()
    lines[0] = f"# Augmentation on the GPU: {name}, {time.strftime('%Y-%m-%d')}"
    sections = [("engine", lambda: engine(lines, args.batch_size, args.rounds, "cuda"))]
    if not args.engine_only:
        def run_loaders():
            args.data.mkdir(parents=True, exist_ok=True)
            photos = photo_folder(args.data, args.per_class, lines)
            packed = photos.with_name(photos.name + ".fastload")
            if not (packed / "manifest.json").exists():
                fastload.pack(photos, packed, overwrite=True)
            loaders(lines, packed, photos, args.batch_size)

        sections.append(("loaders", run_loaders))
    for title, run in sections:
        try:
            run()
        except Exception as e:  # noqa: BLE001  (say what could not run; the file is written anyway)
            traceback.print_exc()
            lines += [f"{title} could not run: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", ""]
    out = args.out or Path("bench/results") / f"augment_gpu_{re.sub(r'[^A-Za-z0-9]+', '_', name).strip('_')}.md"
    write(lines, out)


if __name__ == "__main__":
    main()
