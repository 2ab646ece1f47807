"""Where a torch DataLoader worker's time goes per batch under ``fastload.Dataset.__getitems__``: one process,
one thread (as torch sets in its workers), posing as worker 0 so that ``default_collate`` allocates shared
memory as it does in a worker; the photos and transforms of getitems_bench.py (RandomResizedCrop 224 + flip,
batch 64). Each stage is the median of ``--repeat`` timed calls after one untimed call.

  decode                  ``ds.__getitems__(indices)``: Batcher.fill (read, decode, crop, resize, flip into the
                          slot) and the per-sample rows
  torch's collate         ``default_collate`` of the rows as plain tuples (before fastload/_front/getitems_shm.py):
                          torch.stack of 64 CHW views of the NHWC slot into a fresh shared-memory segment
  pooled collate          ``default_collate`` of the rows as ``__getitems__`` returns them in a worker: one
                          native NHWC -> NCHW pass into a reused shared-memory buffer
  pickle for the queue    what the worker's queue feeder does with each batch (the file descriptors' dup)

The main process's side (receiving the descriptors, mapping, unmapping) is in getitems_bench.py's ceiling rows.

    python bench/getitems_stages.py [--repeat 15] [--out bench/results/getitems_stages_cpu2.md]
"""

from __future__ import annotations

import statistics
import sys
import time
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import torch
import torch.multiprocessing  # noqa: F401  (registers the tensor reductions the worker's queue uses)
from torch.utils.data import default_collate
from torch.utils.data._utils import worker as torch_worker

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BATCH, command, crop_flip, heading, packed_photos, parser, photo_folder, publish  # noqa: E402


def median_ms(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    args = parser(__doc__, repeat=15, out=True).parse_args()
    torch.set_num_threads(1)
    ds = packed_photos(args.data, photo_folder(args.data), crop_flip())
    torch_worker._worker_info = torch_worker.WorkerInfo(id=0, num_workers=1, seed=0, dataset=ds)
    idx = list(range(BATCH))
    rows = ds.__getitems__(idx)
    plain = [tuple(r) for r in rows]
    fresh, pooled = default_collate(plain), default_collate(rows)
    assert type(pooled).__name__ == "SharedList", type(pooled)  # the pool's path, not torch's
    stages = {
        "decode (ds.__getitems__)": median_ms(lambda: ds.__getitems__(idx), args.repeat),
        "torch's collate (stack into a fresh shared-memory batch)": median_ms(lambda: default_collate(plain),
                                                                            args.repeat),
        "pooled collate (one native pass into a reused buffer)": median_ms(lambda: default_collate(rows), args.repeat),
        "pickle for the queue, torch's batch": median_ms(lambda: ForkingPickler.dumps(fresh), args.repeat),
        "pickle for the queue, the pooled batch (+ its lease table)": median_ms(lambda: ForkingPickler.dumps(pooled),
                                                                               args.repeat),
    }
    decode = stages["decode (ds.__getitems__)"]
    lines = [heading("Per-batch stages of __getitems__ in a DataLoader worker"), "",
             f"`{command()}`: batch {BATCH}, one thread, medians of {args.repeat} calls. torch {torch.__version__}.",
             "", "| stage | ms per batch | vs decode |", "|---|---:|---:|"]
    lines += [f"| {name} | {ms:.2f} | {ms / decode:.2f}x |" for name, ms in stages.items()]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
