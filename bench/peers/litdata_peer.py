"""Lightning's LitData, with the pipeline of its documentation: ``litdata.optimize`` writes chunk files
(64 MB), ``StreamingDataset(dir, shuffle=True, drop_last=True)`` + ``StreamingDataLoader`` read them
(``num_workers`` processes; chunks are read in place from the local directory).

Pack (``optimize(fn, inputs=range(N), num_workers=2)``; every item a dict):
  raw   {"data": uint8 (3, 224, 224), "label": int};   tiny: {"data": int32 (48,), "label": int}
  varlen {"data": int32 (L,), "label": int}            (read with a padding collate_fn)
Config: {"num_workers": W} or, for pack, {"dataset": ...}. Array cases only (no image pipeline here).
Reads with ``batch_decode=0`` (per-item decoding) for raw and whenever num_workers > 0: LitData 0.2.76's
default ("auto") deserializes a window of about 100 neighbouring items per shuffled item, which reads ~200
items/s on raw (per item: ~13,000/s) and ~6,000/s on tiny with 2 workers (per item: ~50,000/s).
"""

from __future__ import annotations

import os

from ._common import load_arrays, measure_loader, measure_pack, pad_collate, versions

_SRC: dict = {}


def check() -> dict:
    import numpy
    import torch

    import litdata

    return {"litdata": litdata.__version__, "torch": torch.__version__, "numpy": numpy.__version__}


def _item(i: int) -> dict:
    import numpy as np

    kind = _SRC["kind"]
    if kind == "varlen":
        t, off = _SRC["tokens"], _SRC["offsets"]
        return {"data": np.array(t[off[i]:off[i + 1]]), "label": int(_SRC["labels"][i])}
    return {"data": np.array(_SRC["x"][i]), "label": int(_SRC["labels"][i])}


def run(spec: dict) -> dict:
    if spec["case"] == "pack":
        return pack(spec)
    import torch  # noqa: F401
    from litdata import StreamingDataLoader, StreamingDataset

    case, cfg = spec["case"], spec["config"]
    if case not in ("raw", "tiny", "varlen"):
        raise ValueError(f"litdata peer: case {case!r} is not benchmarked (array cases only)")
    w, bs = int(cfg.get("num_workers", 0)), int(spec["batch_size"])
    collate = None
    if case == "varlen":
        pad = pad_collate(512)

        def collate(items):
            return pad([(it["data"], it["label"]) for it in items])

    def make():
        # batch_decode=0 (per item) where LitData 0.2.76's default ("auto") is pathological here: raw (150 KB
        # items; "auto" deserializes a window of ~100 neighbours per shuffled item: ~200 items/s vs ~13,000/s)
        # and any num_workers > 0 (tiny, 2 workers: ~6,000/s vs ~50,000/s). Otherwise the default, faster there.
        per_item = case == "raw" or w > 0
        extra = {"batch_decode": 0} if per_item else {}
        ds = StreamingDataset(os.path.abspath(spec["data"]["packed"]), shuffle=True, drop_last=True,
                              seed=int(spec.get("seed", 0)), **extra)
        kw = {"collate_fn": collate} if collate else {}
        return StreamingDataLoader(ds, batch_size=bs, num_workers=w, drop_last=True,
                                   persistent_workers=w > 0, **kw)

    def count(batch) -> int:
        labels = batch["label"] if isinstance(batch, dict) else batch[-1]
        return int(labels.shape[0])

    out = measure_loader(make, lambda loader, e: loader, count, spec)
    out["versions"] = versions("litdata", "torch", "numpy")
    per_item = case == "raw" or w > 0
    out["pipeline"] = "StreamingDataset(shuffle=True" + (", batch_decode=0" if per_item else "") + \
        ") + StreamingDataLoader"
    if per_item:
        out["note"] = "batch_decode=0: LitData's default decode windows are 10-60x slower here"
    return out


def pack(spec: dict) -> dict:
    from litdata import optimize

    cfg, data = spec["config"], spec["data"]
    dataset, workers = cfg["dataset"], int(cfg.get("workers", os.cpu_count() or 1))
    if dataset not in ("raw", "tiny", "varlen"):
        raise ValueError(f"litdata pack: dataset {dataset!r} is not benchmarked")
    arrays = load_arrays(data[dataset])
    _SRC.clear()
    _SRC.update(kind=dataset, labels=arrays["labels"])
    if dataset == "varlen":
        _SRC.update(tokens=arrays["tokens"], offsets=arrays["offsets"])
    else:
        _SRC["x"] = arrays["images" if dataset == "raw" else "tokens"]
    n = len(arrays["labels"])

    def once(out):
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            optimize(fn=_item, inputs=list(range(n)), output_dir=os.path.abspath(out), chunk_bytes="64MB",
                     num_workers=workers, mode="overwrite", start_method="fork")

    out = measure_pack(once, spec["out"], spec)
    out["versions"] = versions("litdata")
    out["pipeline"] = "optimize(fn, range(N)), 64 MB chunks"
    return out
