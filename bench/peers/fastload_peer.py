"""fastload (the project's .venv): its fast path on packed shards and its generic path on plain Datasets.

Configs:
  photos / overlap  {"path": "fast", "num_workers": W}   fastload.open(..., transforms=[RandomResizedCrop(224),
                                                          RandomHorizontalFlip()]) + fastload.DataLoader (W native
                                                          decode threads; 0 decodes in the calling thread)
                    {"path": "generic", "num_workers": W} the torch peer's Dataset and transform (peers._torchdata.
                                                          ImageFiles + pil_train_transform, pillow-simd) through
                                                          fastload.DataLoader's shared-memory workers
  raw / tiny        {"path": "fast" | "generic", "num_workers": W}   packed arrays | peers._torchdata.ArrayRows
  varlen            {"path": "fast", ...} T.Pad(512) | {"path": "generic", ...} VarTokens + pad collate_fn
  pack              {"dataset": "photos", "mode": "passthrough" | "header" | "jpeg"} or {"dataset": "raw" | ...}
"""

from __future__ import annotations

import os


from ._common import load_arrays, measure_loader, measure_pack, versions


MAX_LEN = 512


def check() -> dict:
    import fastload

    from fastload._native import native

    native()
    return versions("fastload", "torch", "numpy", "PIL")


def _photo_pipeline():
    from fastload import transforms as T

    return [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]


def _loader(spec: dict):
    import fastload
    from fastload import transforms as T

    case, cfg, data = spec["case"], spec["config"], spec["data"]
    w, bs, seed = int(cfg["num_workers"]), int(spec["batch_size"]), int(spec.get("seed", 0))
    fast = cfg["path"] == "fast"
    common = dict(batch_size=bs, shuffle=True, num_workers=w, drop_last=True)
    if case in ("photos", "overlap"):
        if fast:
            ds = fastload.open(data["packed"], transforms={"image": _photo_pipeline()})
            return fastload.DataLoader(ds, seed=seed, **common)
        from ._common import pil_train_transform
        from ._torchdata import ImageFiles  # the torch peer's Dataset: rows differ only by loader

        transform, _ = pil_train_transform(224, use_torchvision=False)
        return fastload.DataLoader(ImageFiles(data["photos"], transform), persistent_workers=w > 0, **common)
    from ._torchdata import ArrayRows, VarTokens
    from ._common import pad_collate

    if case in ("raw", "tiny"):
        if fast:
            return fastload.DataLoader(fastload.open(data["packed"]), seed=seed, **common)
        fields = ("images", "labels") if case == "raw" else ("tokens", "labels")
        return fastload.DataLoader(ArrayRows(data[case], fields), persistent_workers=w > 0, **common)
    if case == "varlen":
        if fast:
            ds = fastload.open(data["packed"], transforms={"tokens": T.Pad(MAX_LEN)})
            return fastload.DataLoader(ds, seed=seed, **common)
        return fastload.DataLoader(VarTokens(data["varlen"]), collate_fn=pad_collate(MAX_LEN),
                                   persistent_workers=w > 0, **common)
    raise ValueError(f"fastload peer: unknown case {case!r}")


def _count(batch) -> int:
    last = batch[-1]  # labels (every case ends with the label field)
    return int(last.shape[0])


def run(spec: dict) -> dict:
    if spec["case"] == "pack":
        return pack(spec)
    import fastload  # noqa: F401  (imports are not part of the time to first batch, for any peer)

    if spec["case"] in ("photos", "overlap") and spec["config"]["path"] != "fast":
        from ._common import pil_train_transform

        pil_train_transform(224, use_torchvision=False)
    made = {}

    def make():
        loader = _loader(spec)
        want_fast = spec["config"]["path"] == "fast"
        if loader.fast_path != want_fast:
            raise RuntimeError(f"expected the {'fast' if want_fast else 'generic'} path, got the other: "
                               f"{loader.fast_path_reason}")
        made["loader"] = loader
        return loader

    def epoch(loader, e):
        return loader

    out = measure_loader(make, epoch, _count, spec)
    out["versions"] = versions("fastload", "torch", "numpy", "PIL")
    out["pipeline"] = ("fast path (native threads)" if spec["config"]["path"] == "fast" else
                       "generic path (shared-memory worker processes)")
    return out


def pack(spec: dict) -> dict:
    import fastload

    cfg, data = spec["config"], spec["data"]
    dataset = cfg["dataset"]
    workers = int(cfg.get("workers", os.cpu_count() or 1))

    if dataset == "photos":
        mode = cfg.get("mode", "passthrough")
        kw = {"image_mode": "passthrough", "check": "decode"}
        if mode == "header":
            kw["check"] = "header"
        elif mode == "jpeg":
            kw = {"image_mode": "jpeg", "quality": 90}

        def once(out):
            fastload.pack(data["photos"], out, workers=workers, **kw)
    elif dataset in ("raw", "tiny"):
        names = {"raw": (("images", "image"), ("labels", "label")),
                 "tiny": (("tokens", "tokens"), ("labels", "label"))}[dataset]

        def once(out):
            arrays = load_arrays(data[dataset])  # memory-mapped .npy, read during the pack
            fastload.pack({field: arrays[src] for src, field in names}, out, workers=workers)
    elif dataset == "varlen":
        import numpy as np

        from ._torchdata import VarTokens

        class Samples:  # a map-style dataset of dicts: {"tokens": int32 (L,), "label": int}
            def __init__(self):
                self.ds = VarTokens(data["varlen"])

            def __len__(self):
                return len(self.ds)

            def __getitem__(self, i):
                t, y = self.ds[i]
                return {"tokens": t.numpy(), "label": y}

        def once(out):
            fastload.pack(Samples(), out, workers=workers,
                          schema={"tokens": fastload.Field.ndarray("tokens", np.int32, (None,))})
    else:
        raise ValueError(f"fastload pack: unknown dataset {dataset!r}")
    out = measure_pack(once, spec["out"], spec)
    out["versions"] = versions("fastload")
    return out
