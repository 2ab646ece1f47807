"""GPU benchmarks (issue: GPU side). Needs a CUDA device; prints why and exits 0 without one.

  h2d       host-to-device bandwidth: fastload's pinned slot, a pageable tensor, and one large pinned
            cudaMemcpyAsync (the peak), timed with CUDA events
  overlap   a training step (a ResNet-style CNN defined here, AMP, channels_last) fed by
            fastload.DataLoader(device="cuda") vs the same step on synthetic data already on the GPU,
            and vs torch's DataLoader(pin_memory=True) + .to(non_blocking=True); the ratio of loop
            time to the synthetic loop is the input-pipeline overhead (target <= 1.03)
  decode    images/s of DALI mixed (GPU) decoding vs fastload's CPU decoding on all cores

    python bench/gpu_bench.py [--per-class 200] [--batch-size 128] [--out bench/results/gpu_<name>.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def h2d(lines: list[str]) -> None:
    dev = torch.device("cuda")
    nbytes = 256 * 3 * 224 * 224
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    big = torch.empty(8 * nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(8 * nbytes, dtype=torch.uint8, device=dev)

    def bw(src: torch.Tensor, reps: int = 20) -> float:
        out = dst[: src.numel()]
        out.copy_(src, non_blocking=True)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(reps):
            start.record()
            out.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return src.numel() / statistics.median(times) / 1e9

    lines += ["## H2D bandwidth (GB/s, median of 20)", "", "| source | GB/s |", "|---|---:|",
              f"| fastload pinned slot (batch 256 x 3x224x224 uint8) | {bw(pinned):.1f} |",
              f"| pageable tensor, same size | {bw(pageable):.1f} |",
              f"| one 8x larger pinned cudaMemcpyAsync (peak) | {bw(big):.1f} |", ""]


class Net(torch.nn.Module):
    """A small ResNet-style network (no torchvision needed)."""

    def __init__(self, classes: int, width: int = 64):
        super().__init__()
        def block(cin, cout, stride):
            return torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False), torch.nn.BatchNorm2d(cout),
                                       torch.nn.ReLU(inplace=True), torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                                       torch.nn.BatchNorm2d(cout), torch.nn.ReLU(inplace=True))
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, width, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(width),
                                        torch.nn.ReLU(inplace=True), torch.nn.MaxPool2d(3, 2, 1),
                                        block(width, width, 1), block(width, 2 * width, 2),
                                        block(2 * width, 4 * width, 2), block(4 * width, 8 * width, 2),
                                        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                        torch.nn.Linear(8 * width, classes))

    def forward(self, x):
        return self.body(x)


def overlap(lines: list[str], packed: Path, photos: Path, batch: int, steps: int) -> None:
    from loader_bench import PilFolder

    dev = torch.device("cuda")
    ds = fastload.open(packed)
    classes = len(ds.classes)
    model = Net(classes).to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")

    def step(x, y):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    def timed(batches) -> float:
        it = iter(batches)
        for _ in range(5):
            step(*next(it))
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(steps):
            step(*next(it))
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / steps

    def forever(make):
        while True:
            yield from make()

    x = torch.randn(batch, 3, 224, 224, device=dev).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, classes, (batch,), device=dev)
    synthetic = timed(forever(lambda: [(x, y)] * 10))
    tfs = {"image": [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToDtype(torch.float32, scale=True),
                     T.Normalize(MEAN, STD)]}
    fl = fastload.DataLoader(fastload.open(packed, transforms=tfs), batch_size=batch, shuffle=True, drop_last=True,
                             num_workers=os.cpu_count(), device="cuda")
    fastload_t = timed(forever(lambda: iter(fl)))
    norm_m = torch.tensor(MEAN, device=dev).view(1, 3, 1, 1)
    norm_s = torch.tensor(STD, device=dev).view(1, 3, 1, 1)
    tl = torch.utils.data.DataLoader(PilFolder(photos), batch_size=batch, shuffle=True, drop_last=True,
                                     num_workers=os.cpu_count(), pin_memory=True, persistent_workers=True)

    def torch_batches():
        for xb, yb in tl:
            xb = xb.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last).float().div_(255)
            yield (xb - norm_m) / norm_s, yb.to(dev, non_blocking=True)

    torch_t = timed(forever(torch_batches))
    lines += ["## Overlap: training step time / synthetic-data step time", "",
              f"batch {batch}, {steps} steps, AMP fp16, channels_last, ResNet-style CNN defined in bench/gpu_bench.py", "",
              "| input | s/step | vs synthetic |", "|---|---:|---:|",
              f"| synthetic, already on the GPU | {synthetic:.4f} | 1.00 |",
              f"| fastload.DataLoader(device='cuda') | {fastload_t:.4f} | {fastload_t / synthetic:.3f} |",
              f"| torch DataLoader(pin_memory=True) | {torch_t:.4f} | {torch_t / synthetic:.3f} |", ""]


def decode(lines: list[str], packed: Path, batch: int) -> None:
    from fastload.decoders.dali import DaliDecoder
    from fastload._native import native

    raw = fastload.open(packed, decode=False)
    n = (len(raw) // batch) * batch
    blobs = [raw[i][0] for i in range(n)]
    hw = fastload.open(packed)  # image sizes come from the meta column
    pipe = T.ImagePipeline([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])
    metas = []
    for i in range(n):
        seg, local = hw.locate(i)
        metas.append(seg.row("image", "meta", local))
    metas = np.array(metas, dtype=np.int64)
    plan = pipe.plan(metas[:, 0], metas[:, 1], np.random.default_rng(0))
    out_gpu = torch.empty((batch, 224, 224, 3), dtype=torch.uint8, device="cuda")
    dec = DaliDecoder(batch, (224, 224), device_id=0, num_threads=os.cpu_count())

    def run_dali():
        for b in range(0, n, batch):
            dec.decode(blobs[b:b + batch], plan.crops[b:b + batch], plan.flips[b:b + batch], out_gpu)
        torch.cuda.synchronize()

    C = native()
    pool = C.Pool(os.cpu_count())
    out_cpu = np.empty((batch, 224, 224, 3), np.uint8)

    def run_cpu():
        for b in range(0, n, batch):
            sl = slice(b, b + batch)
            C.decode_batch(pool, blobs[sl], np.arange(batch), np.zeros(batch, np.int64),
                           np.array([len(x) for x in blobs[sl]]), metas[sl, 2].astype(np.uint8),
                           metas[sl, :2].astype(np.int32), plan.crops[sl], plan.flips[sl], out_cpu)

    rates = {}
    for name, fn in (("DALI mixed (GPU decode)", run_dali), (f"fastload CPU, {os.cpu_count()} threads", run_cpu)):
        fn()
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        rates[name] = n / statistics.median(ts)
    lines += ["## Decode: RandomResizedCrop 224 + flip, images/s", "", "| decoder | img/s |", "|---|---:|"]
    lines += [f"| {k} | {v:,.0f} |" for k, v in rates.items()] + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("bench/data"))
    ap.add_argument("--per-class", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_bench: no CUDA device here (torch.cuda.is_available() is False); nothing to measure")
        return
    from photos import build_photo_folder

    name = torch.cuda.get_device_name()
    photos = args.data / f"photos_{args.per_class}"
    packed = args.data / f"photos_{args.per_class}.fastload"
    build_photo_folder(photos, per_class=args.per_class, seed=0, progress=False)
    if not (packed / "manifest.json").exists():
        fastload.pack(photos, packed, overwrite=True)
    lines = [f"# GPU results: {name}, {time.strftime('%Y-%m-%d')}", "",
             f"torch {torch.__version__}, CUDA {torch.version.cuda}, {os.cpu_count()} CPU cores", ""]
    h2d(lines)
    overlap(lines, packed, photos, args.batch_size, args.steps)
    try:
        decode(lines, packed, args.batch_size)
    except ImportError as e:
        lines += [f"DALI decode skipped: {e}", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
