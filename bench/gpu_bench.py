"""GPU benchmarks (issue: GPU side). Needs a CUDA device; prints why and exits 0 without one.

  h2d       host-to-device bandwidth: fastload's pinned slot, a pageable tensor, and one large pinned
            cudaMemcpyAsync (the peak), timed with CUDA events
  overlap   a training step (torchvision ResNet-50, AMP, channels_last; the small CNN below without
            torchvision) fed by fastload.DataLoader(device="cuda") vs the same step on synthetic data
            already on the GPU, and vs torch's DataLoader(pin_memory=True) + .to(non_blocking=True); the
            ratio of loop time to the synthetic loop is the input-pipeline overhead (target <= 1.03)
  loaders   loader-only images/s with the batch on the GPU (RandomResizedCrop 224 + flip + normalize):
            DALI's own pipeline (readers.file + decoders.image_random_crop "mixed" + resize + flip +
            crop_mirror_normalize), fastload with decoder native / nvjpeg / dali / auto, in one run
  correct   ResNet-18 trains between batches (the GPU lags the host); every batch of
            fastload.DataLoader(device="cuda") is compared with the CPU loader's batch for the same seed
  decode    images/s of DALI mixed (GPU) decoding vs fastload's CPU decoding on all cores

    python bench/gpu_bench.py [--per-class 400] [--batch-size 256] [--out bench/results/gpu_<name>.md]
    python bench/gpu_bench.py --quick          gpu-check's sizes (40 photos a class, batch 128, 20 timed steps,
                                               2 rounds, 12 batches compared): every section, ResNet-50 included
    --sections photos,loaders,decode           only these sections (photos is added when one needs it)
    --decoders dali,auto                       the loaders table's fastload rows (DALI's own pipeline always runs):
                                               gpu-check's DALI lease runs only the DALI comparison

Without --out the results go to bench/results/gpu_<device name>.md. The file is written whatever could not
run (a missing DALI or torchvision is named in it), again after every section, so a run stopped part-way
(SIGTERM: gpu_check.sh's time limit) leaves what ran and names what did not. It ends with the goals
(loader-only >= 1.2x DALI's own pipeline; ResNet-50 AMP step within 3% of synthetic data), each "met",
"NOT met" or "not measured" with the reason. Exit status: 0 without a CUDA device and when parts could not
run for a missing package; 1 when the correctness check found a batch that differs or the run was stopped.
Photos come from bench/photos.py's carried wheels, never downloaded; without them, synthetic JPEGs made here.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402
from _gpu_report import Report, Stopped, availability, run_sections  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

#: The issue's goals, by the section that measures each; the results file gives every one a verdict.
GOALS = {
    "loaders": "loader-only images/s with the batch on the GPU: fastload >= 1.2x DALI's own pipeline on the same photos",
    "overlap": "ResNet-50 AMP training step fed by fastload.DataLoader(device='cuda') within 3% of synthetic data",
}
DECODERS = ("native", "nvjpeg", "dali", "auto")
SECTIONS = ("H2D bandwidth", "photos", "correctness", "loaders", "overlap", "decode")
#: --quick: gpu-check's sizes (its bench step's time limit is set for these)
QUICK = {"per_class": 40, "batch_size": 128, "steps": 20, "reps": 2, "compare": 12}
#: Fewer batches than this in an epoch: each epoch's start-up weighs on the rates (gpu_check's quick sizes).
SHORT_EPOCH = 20


CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # "<quota> <period>" or "max <period>" (cgroup v2)


def cpu_cores() -> int:
    """The cores this process may use: its affinity mask, capped by a cgroup v2 CPU quota. In a container
    ``os.cpu_count()`` is the host's (hundreds), and that many workers would swamp the cores it was given."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return n


def h2d(lines: list[str], batch: int) -> None:
    dev = torch.device("cuda")
    nbytes = batch * 3 * 224 * 224
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
              f"| fastload pinned slot (batch {batch} x 3x224x224 uint8) | {bw(pinned):.1f} |",
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


def make_model(name: str, classes: int) -> tuple[torch.nn.Module, str]:
    try:
        import torchvision
    except Exception as e:  # noqa: BLE001  (missing, or built for another torch: RuntimeError at import)
        return Net(classes), f"ResNet-style CNN defined in bench/gpu_bench.py (torchvision unusable: {e})"
    return getattr(torchvision.models, name)(num_classes=classes), f"torchvision {name}"


def overlap(lines: list[str], packed: Path, photos: Path, batch: int, steps: int) -> dict[str, str]:
    """The overlap table; returns the 3% goal's verdict (not measured when torchvision's ResNet-50 is not
    the model that ran)."""
    import gc

    from loader_bench import PilFolder

    dev = torch.device("cuda")
    workers = cpu_cores()
    ds = fastload.open(packed)
    classes = len(ds.classes)
    model, model_name = make_model("resnet50", classes)
    model = model.to(dev, memory_format=torch.channels_last)
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
    # persistent, as torch's below: with quick sizes an epoch is a few batches, and a loader that started
    # its workers again every epoch would be timed starting processes, not feeding the step
    fl = fastload.DataLoader(fastload.open(packed, transforms=tfs), batch_size=batch, shuffle=True, drop_last=True,
                             num_workers=workers, device="cuda", persistent_workers=True)
    per_epoch = len(fl)
    fastload_t = timed(forever(fl.__iter__))
    del fl  # its workers go before torch's start: both on the same cores would slow the second one timed
    gc.collect()
    norm_m = torch.tensor(MEAN, device=dev).view(1, 3, 1, 1)
    norm_s = torch.tensor(STD, device=dev).view(1, 3, 1, 1)
    tl = torch.utils.data.DataLoader(PilFolder(photos), batch_size=batch, shuffle=True, drop_last=True,
                                     num_workers=workers, pin_memory=True, persistent_workers=True)

    def torch_batches():
        for xb, yb in tl:
            xb = xb.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last).float().div_(255)
            yield (xb - norm_m) / norm_s, yb.to(dev, non_blocking=True)

    torch_t = timed(forever(torch_batches))
    ratio = fastload_t / synthetic
    lines += ["## Overlap: training step time / synthetic-data step time", "",
              f"batch {batch}, {steps} timed steps after 5 warm-up steps, epochs of {per_epoch} batches, AMP fp16, "
              f"channels_last, {model_name}, {workers} loader workers", "",
              "| input | s/step | vs synthetic |", "|---|---:|---:|",
              f"| synthetic, already on the GPU | {synthetic:.4f} | 1.00 |",
              f"| fastload.DataLoader(device='cuda') | {fastload_t:.4f} | {ratio:.3f} |",
              f"| torch DataLoader(pin_memory=True) | {torch_t:.4f} | {torch_t / synthetic:.3f} |", ""]
    if not model_name.startswith("torchvision resnet50"):
        return {"overlap": f"not measured: the step was not ResNet-50 ({model_name}); its ratio was {ratio:.3f}"}
    verdict = f"{'met' if ratio <= 1.03 else 'NOT met'} ({ratio:.3f} of the synthetic step time)"
    if per_epoch < SHORT_EPOCH:
        verdict += f"; quick size: epochs of {per_epoch} batches, so epoch starts weigh on it"
    return {"overlap": verdict}


def decode_inputs(packed: Path, batch: int) -> tuple[list[bytes], np.ndarray, object]:
    """Whole batches of the packed JPEGs: their bytes, meta rows (height, width, kind) and one
    RandomResizedCrop 224 + flip plan for all of them (seed 0)."""
    raw = fastload.open(packed, decode=False)
    n = (len(raw) // batch) * batch
    if n == 0:
        raise ValueError(f"{packed} has {len(raw)} samples, fewer than one batch of {batch}")
    blobs = [raw[i][0] for i in range(n)]
    hw = fastload.open(packed)  # image sizes come from the meta column
    metas = []
    for i in range(n):
        seg, local = hw.locate(i)
        metas.append(seg.row("image", "meta", local))
    metas = np.array(metas, dtype=np.int64)
    pipe = T.ImagePipeline([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])
    return blobs, metas, pipe.plan(metas[:, 0], metas[:, 1], np.random.default_rng(0))


def native_decode_run(blobs: list[bytes], metas: np.ndarray, plan, batch: int, threads: int):
    """One pass of the native core's decode_batch over ``blobs`` in batches, on ``threads`` threads."""
    from fastload._native import native

    C = native()
    pool = C.Pool(threads)
    out = np.empty((batch, 224, 224, 3), np.uint8)

    def run() -> None:
        for b in range(0, len(blobs), batch):
            sl = slice(b, b + batch)
            failed = C.decode_batch(pool, blobs[sl], np.arange(batch), np.zeros(batch, np.int64),
                                    np.array([len(x) for x in blobs[sl]]), metas[sl, 2].astype(np.uint8),
                                    metas[sl, :2].astype(np.int32), plan.crops[sl], plan.flips[sl], out)
            if failed:
                raise RuntimeError(f"the native decoder failed samples {failed[:3]} of batch {b // batch}")

    return run


def decode(lines: list[str], packed: Path, batch: int) -> None:
    blobs, metas, plan = decode_inputs(packed, batch)
    n, threads = len(blobs), cpu_cores()
    runs = {f"fastload CPU, {threads} threads": native_decode_run(blobs, metas, plan, batch, threads)}
    try:
        from fastload.decoders.dali import DaliDecoder

        out_gpu = torch.empty((batch, 224, 224, 3), dtype=torch.uint8, device="cuda")
        dec = DaliDecoder(batch, (224, 224), device_id=0, num_threads=threads)

        def run_dali():
            for b in range(0, n, batch):
                dec.decode(blobs[b:b + batch], plan.take(b, b + batch), out_gpu)
            torch.cuda.synchronize()  # decode() only queues the copies on its stream: wait for all of it

        runs = {"DALI mixed (GPU decode)": run_dali, **runs}
    except Exception as e:  # noqa: BLE001  (a missing DALI: the CPU row is still measured)
        lines.append(f"DALI's decoder could not run: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    rates = {}
    for name, fn in runs.items():
        fn()
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        rates[name] = n / statistics.median(ts)
    lines += ["## Decode: RandomResizedCrop 224 + flip, images/s", "", "| decoder | img/s |", "|---|---:|"]
    lines += [f"| {k} | {v:,.0f} |" for k, v in rates.items()] + [""]


def dali_native(photos: Path, batch: int, threads: int, gpu: bool = True):
    """DALI's own pipeline as its documentation writes it for ImageNet training (GPU output). ``gpu=False``:
    the same graph in DALI's CPU-only mode (decoding on the CPU), which only tests use: it checks the calls
    against the installed DALI where no GPU is."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=0 if gpu else None, prefetch_queue_depth=2)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=str(photos), random_shuffle=True, name="files")
        images = fn.decoders.image_random_crop(jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=224, resize_y=224)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD],
                                          mirror=fn.random.coin_flip())
        return images, (labels.gpu() if gpu else labels)

    return dali_epochs(pipe(), batch, gpu)


def dali_epochs(p, batch: int, gpu: bool, depth: int = 2):
    """One epoch of a built-here DALI pipeline (reader named "files", ``prefetch_queue_depth=depth``) per call,
    each batch copied into a torch tensor as DALI's PyTorch plugin does; returns (images, seconds).

    The clock starts after the ``depth`` batches DALI prefetched while the other loaders ran: they were made
    for free, and in epochs of a few batches they would inflate DALI's rate (fastload's loaders start each
    epoch empty). Taking them leaves DALI's queue refilling, as in its steady state."""
    p.build()
    size = p.epoch_size("files")
    if size < batch:
        raise ValueError(f"DALI's reader found {size} images, fewer than one batch of {batch}")
    out = torch.empty((batch, 3, 224, 224), dtype=torch.float32, device="cuda" if gpu else "cpu")
    started = False

    def one_epoch() -> tuple[int, float]:
        from nvidia.dali.plugin.pytorch import feed_ndarray

        nonlocal started
        for _ in range(depth if started else 0):
            p.run()
        started = True
        if gpu:
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(size // batch):
            images, _ = p.run()
            feed_ndarray(images.as_tensor(), out, cuda_stream=torch.cuda.current_stream() if gpu else None)
        if gpu:
            torch.cuda.synchronize()
        return (size // batch) * batch, time.perf_counter() - t

    return one_epoch


def fastload_epochs(dl):
    """One epoch of a fastload loader with the batch on the GPU per call; returns (images, seconds)."""
    def one_epoch() -> tuple[int, float]:
        torch.cuda.synchronize()
        t = time.perf_counter()
        n = 0
        for x, _ in dl:
            n += x.shape[0]
        torch.cuda.synchronize()
        return n, time.perf_counter() - t

    return one_epoch


def alternate(runs: dict, reps: int) -> dict[str, list[float]]:
    """images/s of each run over ``reps`` rounds, the runs alternating so that drift hits every row alike."""
    rates: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(reps):
        for name, fn in runs.items():
            n, seconds = fn()
            rates[name].append(n / seconds)
    return rates


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def compare_loaders(ds, batch: int, threads: int, reps: int, dali_name: str, dali_make,
                    decoders: tuple[str, ...] = DECODERS) -> tuple[dict, list[str]]:
    """images/s over ``reps`` alternating epochs of DALI's own pipeline (``dali_make()`` -> its epoch runner,
    row ``dali_name``) and fastload over ``ds`` with each decoder; what could not build or run its warm-up epoch
    is left out and named in the notes (reported in the results, not hidden). Returns (rates, notes)."""
    runs, notes, made = {}, [], {}
    try:
        runs[dali_name] = dali_make()
    except Exception as e:  # noqa: BLE001
        notes.append(f"DALI's own pipeline could not run: {_first_line(e)}")
    for decoder in decoders:
        try:
            dl = fastload.DataLoader(ds, batch_size=batch, shuffle=True, drop_last=True, num_workers=threads,
                                     device="cuda", decoder=decoder, persistent_workers=True)
        except Exception as e:  # noqa: BLE001
            notes.append(f"fastload decoder={decoder!r} could not run: {type(e).__name__}: {e}")
            continue
        made[decoder] = dl
        runs[f"fastload decoder={decoder!r}"] = fastload_epochs(dl)
    for name, fn in list(runs.items()):
        try:
            fn()  # warm-up epoch (GPU decoders import and build on their first batch)
        except Exception as e:  # noqa: BLE001
            notes.append(f"{name} could not run: {_first_line(e)}")
            del runs[name]
    if "fastload decoder='auto'" in runs and made["auto"].stats().get("hybrid") is None:
        # 'auto' found no GPU decoder to pair: its row is the native threads alone, and says so
        runs["fastload decoder='auto' (no GPU decoder here: native threads alone)"] = runs.pop("fastload decoder='auto'")
    return alternate(runs, reps), notes


def loaders(lines: list[str], packed: Path, photos: Path, batch: int, reps: int = 3,
            decoders: tuple[str, ...] = DECODERS) -> dict[str, str]:
    """The loaders table; returns the 1.2x-DALI goal's verdict (not measured unless DALI's own pipeline and a
    fastload loader both ran)."""
    tfs = {"image": [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToDtype(torch.float32, scale=True),
                     T.Normalize(MEAN, STD)]}
    ds = fastload.open(packed, transforms=tfs)
    threads = cpu_cores()
    rates, notes = compare_loaders(ds, batch, threads, reps, "DALI pipeline (readers.file, mixed decode, resize, "
                                   "flip, normalize)", lambda: dali_native(photos, batch, threads), decoders)
    ref = statistics.median(rates[next(iter(rates))]) if rates else 1.0
    per_epoch = len(ds) // batch
    lines += ["## Loaders: batches on the GPU, RandomResizedCrop 224 + flip + normalize, images/s", "",
              f"batch {batch}, epochs of {per_epoch} batches, {threads} CPU threads, median of {reps} alternating "
              f"epochs", "", "| loader | img/s | vs first row |", "|---|---:|---:|"]
    lines += [f"| {k} | {statistics.median(v):,.0f} | {statistics.median(v) / ref:.2f} |" for k, v in rates.items()]
    lines += [""] + [f"- {n}" for n in notes] + ([""] if notes else [])
    dali = next((statistics.median(v) for k, v in rates.items() if k.startswith("DALI pipeline")), None)
    best = max(((statistics.median(v), k) for k, v in rates.items() if k.startswith("fastload")), default=None)
    if dali is None or best is None:
        return {"loaders": "not measured: " + ("DALI's own pipeline did not run" if dali is None else
                                               "no fastload loader ran") + " (see the loaders section)"}
    verdict = f"{'met' if best[0] >= 1.2 * dali else 'NOT met'} ({best[0] / dali:.2f}x, {best[1]})"
    if per_epoch < SHORT_EPOCH:
        verdict += f"; quick size: epochs of {per_epoch} batches, so epoch starts weigh on it"
    return {"loaders": verdict}


def correctness(lines: list[str], packed: Path, batch: int, batches: int = 36) -> None:
    """ResNet-18 (AMP bf16) trains between batches and ``torch.cuda._sleep`` adds lag every step, so the
    host runs ahead of the GPU; every batch is compared with the CPU loader's on the device (no host sync
    in the loop; the counts are read once). Raises AssertionError after writing its table if any differs."""
    model, model_name = make_model("resnet18", len(fastload.open(packed).classes))
    model = model.cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tfs = {"image": [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]}
    ds = fastload.open(packed, transforms=tfs)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    cycles_per_ms = 10_000_000 / max(start.elapsed_time(end), 1e-3)
    rows, wrong_total = [], 0
    for workers in (0, cpu_cores()):
        kw = dict(batch_size=batch, shuffle=True, drop_last=False, seed=7, num_workers=workers)
        ref = []
        for x, y in fastload.DataLoader(ds, **kw):
            ref.append((x.cuda(), y.cuda()))
            if len(ref) == batches:
                break
        torch.cuda.synchronize()
        wrong = torch.zeros((), dtype=torch.int64, device="cuda")
        n = 0
        for k, (x, y) in enumerate(fastload.DataLoader(ds, device="cuda", **kw)):
            if k == len(ref):
                break
            torch.cuda._sleep(int(10 * cycles_per_ms))  # lag: the host runs batches ahead
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x.float().div_(255)), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            rx, ry = ref[k]
            wrong += (x != rx).any() | (y != ry).any() if x.shape == rx.shape else 1
            n += 1
            del x, y
        bad = int(wrong) + (len(ref) - n)  # the one host sync; a missing batch counts too
        wrong_total += bad
        rows.append(f"| {workers} | {len(ref)} | {bad} |")
    lines += [f"## Correctness under a training load ({model_name}, AMP bf16, 10 ms lag a step, batch {batch})", "",
              "| num_workers | batches compared | batches different from the CPU loader's |", "|---:|---:|---:|"]
    lines += rows + [""]
    if wrong_total:
        raise AssertionError(f"{wrong_total} batches from DataLoader(device='cuda') differ from the CPU loader's")


def synthetic_photos(root: Path, classes: int = 10, per_class: int = 40, seed: int = 0) -> None:
    """A photo-like JPEG folder made here (smooth colour fields with edges, 300-640 px), for machines
    where bench/photos.py's source wheels are not carried in: no downloads."""
    from PIL import Image

    if (root / ".synthetic").exists():
        return
    rng = np.random.default_rng(seed)
    for c in range(classes):
        d = root / f"class_{c:02d}"
        d.mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            h, w = int(rng.integers(300, 480)), int(rng.integers(400, 640))
            small = rng.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
            img = Image.fromarray(small).resize((w, h), Image.BICUBIC)
            img.save(d / f"{k:05d}.jpg", quality=int(rng.integers(75, 95)))
    (root / ".synthetic").write_text("made by bench/gpu_bench.py\n")


def photo_folder(data: Path, per_class: int, lines: list[str]) -> Path:
    """bench/photos.py's real photographs where its wheels are here (never downloading), else synthetic."""
    # No network: a missing wheel fails at once, not after retries. Set for this call only: a caller in the same
    # process (a test session) must not inherit it (tests/test_wheel.py's fresh venv then found no index).
    had = os.environ.get("PIP_NO_INDEX")
    os.environ.setdefault("PIP_NO_INDEX", "1")
    photos = data / f"photos_{per_class}"
    try:
        from photos import build_photo_folder

        build_photo_folder(photos, per_class=per_class, seed=0, progress=False)
        return photos
    except Exception as e:  # noqa: BLE001  (reported in the results)
        synthetic = data / f"synthetic_{per_class}"
        synthetic_photos(synthetic, per_class=per_class)
        lines += [f"Photos: bench/photos.py could not build real photos ({type(e).__name__}: "
                  f"{str(e).splitlines()[0][:200]}); using synthetic JPEGs made here", ""]
        return synthetic
    finally:
        if had is None:
            os.environ.pop("PIP_NO_INDEX", None)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("bench/data"))
    ap.add_argument("--per-class", type=int, default=400)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--reps", type=int, default=3, help="alternating rounds of the loaders table")
    ap.add_argument("--compare", type=int, default=36, help="batches the correctness section compares")
    ap.add_argument("--quick", action="store_true", help=f"gpu-check's sizes: {QUICK}")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated, of: " + ", ".join(SECTIONS))
    ap.add_argument("--decoders", default=",".join(DECODERS), help="the loaders table's fastload rows")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    wanted = [t.strip() for t in args.sections.split(",") if t.strip()]
    decoders = tuple(d.strip() for d in args.decoders.split(",") if d.strip())
    bad = sorted(set(wanted) - set(SECTIONS)) + sorted(set(decoders) - set(DECODERS))
    if bad:
        ap.error(f"unknown sections or decoders {bad}: sections are {', '.join(SECTIONS)}; decoders "
                 f"{', '.join(DECODERS)}")
    if set(wanted) & {"correctness", "loaders", "overlap", "decode"}:
        wanted.append("photos")  # they read its photos
    lines = [f"# GPU results: {time.strftime('%Y-%m-%d')}", "",
             f"torch {torch.__version__}, CUDA {torch.version.cuda}, {cpu_cores()} CPU cores for this process "
             f"(os.cpu_count() {os.cpu_count()}); " + ", ".join(availability()), "",
             "Command: python bench/gpu_bench.py " + " ".join(sys.argv[1:] if argv is None else argv), ""]
    titles = [t for t in SECTIONS if t in wanted and t != "photos"]
    if not torch.cuda.is_available():
        report = Report(args.out or Path("bench/results/gpu_none.md"), lines, GOALS)
        lines += ["No CUDA device here (torch.cuda.is_available() is False): nothing measured.", ""]
        report.pending, report.why_pending, report.default = titles, "no CUDA device", "not measured: no CUDA device"
        report.save(echo=True)
        return
    name = torch.cuda.get_device_name()
    lines[0] = f"# GPU results: {name}, {time.strftime('%Y-%m-%d')}"
    out = args.out or Path("bench/results") / f"gpu_{re.sub(r'[^A-Za-z0-9]+', '_', name).strip('_')}.md"
    report = Report(out, lines, GOALS)
    data: dict[str, Path] = {}

    def prepare() -> None:
        args.data.mkdir(parents=True, exist_ok=True)
        photos = photo_folder(args.data, args.per_class, lines)
        packed = photos.with_name(photos.name + ".fastload")
        if not (packed / "manifest.json").exists():
            fastload.pack(photos, packed, overwrite=True)
        data.update(photos=photos, packed=packed)

    def need(key: str) -> Path:
        if key not in data:
            raise RuntimeError("no photos to read: the photos step could not run (see above)")
        return data[key]

    sections = [("H2D bandwidth", lambda: h2d(lines, args.batch_size)),
                ("photos", prepare),
                ("correctness", lambda: correctness(lines, need("packed"), args.batch_size, args.compare)),
                ("loaders", lambda: loaders(lines, need("packed"), need("photos"), args.batch_size, args.reps,
                                            decoders)),
                ("overlap", lambda: overlap(lines, need("packed"), need("photos"), args.batch_size, args.steps)),
                ("decode", lambda: decode(lines, need("packed"), args.batch_size))]
    sections = [(title, run) for title, run in sections if title in wanted]
    for key in GOALS:
        if key not in wanted:
            report.verdicts[key] = f"not measured: not asked for (--sections {args.sections})"
    try:
        failed = run_sections(report, sections)
    except Stopped as e:
        sys.exit(f"gpu_bench: {e}; what ran is in {out}")
    report.save(echo=True)
    if failed:
        sys.exit("gpu_bench: " + "; ".join(failed))


if __name__ == "__main__":
    main()
