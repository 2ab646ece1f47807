"""LitData for ``bench/remote_bench.py``: the same photographs, optimized into LitData chunks, read from
local disk and from the benchmark's S3 server with a cold and a warm cache. Runs in LitData's venv::

    PYTHONPATH=bench bench/.venvs/litdata/bin/python -m peers.litdata_remote SPEC.json

Items are ``{"image": JPEG bytes, "label": int}`` (LitData's ``bytes`` serializer); ``__getitem__``
decodes with PIL and applies ``_common.pil_train_transform(224)`` (RandomResizedCrop + flip, the
torch peers' pipeline), in ``StreamingDataLoader`` worker processes (2). ``batch_decode=0``: per-item
reads, as the suite's LitData peer uses with workers (see litdata_peer.py).

LitData 0.2.76 downloads chunks with obstore, whose client refuses plain-HTTP endpoints unless told
``allow_http``, and LitData does not tell it for an ``http://`` ``endpoint_url`` (every S3-compatible
server on localhost): this runner adds ``allow_http`` to LitData's obstore client options, so that
LitData reads with its own fast path rather than failing or falling back to boto3.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

from ._common import image_files, pil_train_transform

def _item(path_label: tuple[str, int]) -> dict:
    path, label = path_label
    with open(path, "rb") as fh:
        return {"image": fh.read(), "label": int(label)}


def optimize_step(spec: dict) -> dict:
    import litdata

    files, labels, _ = image_files(spec["photos"])
    shutil.rmtree(spec["out"], ignore_errors=True)
    litdata.optimize(fn=_item, inputs=[(f, int(c)) for f, c in zip(files, labels)], output_dir=spec["out"], chunk_bytes=spec["chunk_bytes"],
                     num_workers=1, mode="overwrite")
    return {"version": litdata.__version__, "samples": len(files)}


def epochs_step(spec: dict) -> dict:
    import io

    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming import downloader
    from PIL import Image

    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True  # see the module docstring

    transform, _ = pil_train_transform(224)

    class Photos(StreamingDataset):
        def __getitem__(self, index):
            item = super().__getitem__(index)
            return transform(Image.open(io.BytesIO(item["image"])).convert("RGB")), item["label"]

    opts = {"endpoint_url": spec["endpoint"], "aws_access_key_id": spec["key"],
            "aws_secret_access_key": spec["secret"]}
    bs = spec["batch_size"]

    def epoch(input_dir: str, cache_dir: str | None) -> tuple[float, int]:
        t = time.perf_counter()
        kw = {} if cache_dir is None else {"cache_dir": cache_dir, "storage_options": opts}
        ds = Photos(input_dir, shuffle=True, drop_last=True, batch_decode=0, **kw)
        loader = StreamingDataLoader(ds, batch_size=bs, num_workers=2)
        n = sum(len(labels) for _, labels in loader)
        return time.perf_counter() - t, n

    work = spec["work"]
    os.makedirs(work, exist_ok=True)
    warm = os.path.join(work, "warm")
    epoch(spec["local"], None)  # warm-up
    epoch(spec["url"], warm)
    times: dict[str, list] = {"local": [], "cold": [], "warm": []}
    n = 0
    for r in range(spec["repeat"]):
        dt, n = epoch(spec["local"], None)
        times["local"].append(dt)
        cold = os.path.join(work, f"cold{r}")
        times["cold"].append(epoch(spec["url"], cold)[0])
        shutil.rmtree(cold, ignore_errors=True)
        times["warm"].append(epoch(spec["url"], warm)[0])
    return {"times": times, "samples": n}


def main(argv: list[str]) -> int:
    with open(argv[0]) as fh:
        spec = json.load(fh)
    result = optimize_step(spec) if spec["step"] == "optimize" else epochs_step(spec)
    print("@@RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
