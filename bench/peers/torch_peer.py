"""torch.utils.data.DataLoader as its documentation recommends, in two venvs: ``torch-simd`` (pillow-simd)
and ``torch-pillow`` (plain pillow; the two cannot share a venv since both install as ``PIL``).

Configs (``num_workers`` swept by the suite; ``persistent_workers=num_workers > 0``):
  photos / overlap  {"num_workers": W, "pin_memory": bool}   torchvision ``ImageFolder`` + ``Compose([
                    RandomResizedCrop(224), RandomHorizontalFlip(), PILToTensor()])``, default collate
                    (uint8 NCHW). pin_memory only acts with an accelerator: without one torch warns and skips it.
                    {"num_workers": W, "files": True}         the Dataset fastload's generic row runs (peers.
                    _torchdata.ImageFiles + the transform written out with PIL), for a same-Dataset comparison
  raw / tiny        {"num_workers": W, "fetch": "sample"}   a Dataset over memory-mapped .npy files
                    {"num_workers": W, "fetch": "batch"}    the same, fetching whole batches (BatchSampler)
  varlen            {"num_workers": W}                      VarTokens + a collate_fn padding to 512
"""

from __future__ import annotations

import warnings

from ._common import import_torchvision, measure_loader, pad_collate, pil_train_transform, versions


def check() -> dict:
    import numpy
    import PIL
    import torch

    tv = import_torchvision()
    return {"torch": torch.__version__, "numpy": numpy.__version__, "PIL": PIL.__version__,
            "torchvision": tv.__version__ if tv else "unavailable"}


def run(spec: dict) -> dict:
    import torch

    case, cfg, data = spec["case"], spec["config"], spec["data"]
    w, bs = int(cfg.get("num_workers", 0)), int(spec["batch_size"])
    pin = bool(cfg.get("pin_memory", False))
    info = {}
    if pin and not torch.cuda.is_available():
        info["note"] = "pin_memory=True without an accelerator: torch warns and does not pin"
        warnings.filterwarnings("ignore", message=".*pin_memory.*")

    if case in ("photos", "overlap"):  # imports are not part of the time to first batch
        files = bool(cfg.get("files", False))
        transform, how = pil_train_transform(224, use_torchvision=not files)
        tv = None if files else import_torchvision()

    def make():
        common = dict(batch_size=bs, shuffle=True, num_workers=w, drop_last=True, pin_memory=pin,
                      persistent_workers=w > 0)
        if case in ("photos", "overlap"):
            info["pipeline"] = how
            if tv is not None:
                ds = tv.datasets.ImageFolder(data["photos"], transform=transform)
            else:
                from ._torchdata import ImageFiles

                ds = ImageFiles(data["photos"], transform)
            return torch.utils.data.DataLoader(ds, **common)
        from ._torchdata import ArrayBatches, ArrayRows, VarTokens, batch_fetch_loader

        if case in ("raw", "tiny"):
            fields = ("images", "labels") if case == "raw" else ("tokens", "labels")
            if cfg.get("fetch", "sample") == "batch":
                info["pipeline"] = "BatchSampler, whole-batch fetch from memory-mapped .npy"
                return batch_fetch_loader(ArrayBatches(data[case], fields), bs, w)
            info["pipeline"] = "per-sample Dataset over memory-mapped .npy, default collate"
            return torch.utils.data.DataLoader(ArrayRows(data[case], fields), **common)
        if case == "varlen":
            info["pipeline"] = "per-sample Dataset over memory-mapped tokens + offsets, padding collate_fn"
            return torch.utils.data.DataLoader(VarTokens(data["varlen"]), collate_fn=pad_collate(512), **common)
        raise ValueError(f"torch peer: unknown case {case!r}")

    def count(batch) -> int:
        return int(batch[-1].shape[0])

    out = measure_loader(make, lambda loader, e: loader, count, spec)
    out.update(info)
    out["versions"] = versions("torch", "numpy", "PIL")
    tv = import_torchvision() if case in ("photos", "overlap") else None
    if tv is not None:
        out["versions"]["torchvision"] = tv.__version__
    return out
