"""WebDataset (tar shards streamed sequentially), with the pipelines its documentation recommends, in a venv
with pillow-simd (as fastload's and the torch-simd peer's) and torchvision's transforms.

Pack (``wds.ShardWriter``, samples written in a seeded random order, 8 shards so that 2 workers get 4 each):
  photos  {"__key__", "jpg": the JPEG file's bytes untouched, "cls": label}
  raw     {"__key__", "npy": uint8 (3, 224, 224), "cls": label}      tiny: "npy" = int32 (48,)
  varlen  {"__key__", "npy": int32 (L,), "cls": label}
Load:
  wds.WebDataset(shards, shardshuffle=len(shards)).shuffle(1000).decode("pil" | default)
     .to_tuple(...).map_tuple(transform, ...).batched(B, partial=False)  ->  wds.WebLoader(batch_size=None,
     num_workers=W). Photos: torchvision RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor;
  varlen: a padding collation_fn. An epoch is every shard once (each worker drops its last partial batch).
Config: {"num_workers": W} or, for pack, {"dataset": ...}.
"""

from __future__ import annotations

import glob
import os

from ._common import image_files, load_arrays, measure_loader, measure_pack, pad_collate, pil_train_transform, \
    shards_for, versions


def check() -> dict:
    import numpy
    import PIL
    import torch
    import webdataset

    return {"webdataset": webdataset.__version__, "torch": torch.__version__, "numpy": numpy.__version__,
            "PIL": PIL.__version__}


def _shards(directory: str) -> list[str]:
    urls = sorted(glob.glob(os.path.join(directory, "shard-*.tar")))
    if not urls:
        raise FileNotFoundError(f"no WebDataset shards in {directory}")
    return urls


def run(spec: dict) -> dict:
    if spec["case"] == "pack":
        return pack(spec)
    import webdataset as wds

    case, cfg = spec["case"], spec["config"]
    w, bs = int(cfg.get("num_workers", 0)), int(spec["batch_size"])
    info = {}
    if case in ("photos", "overlap"):  # imports are not part of the time to first batch
        transform, how = pil_train_transform(224)

    def make():
        urls = _shards(spec["data"]["packed"])
        ds = wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False).shuffle(1000)
        if case in ("photos", "overlap"):
            info["pipeline"] = f"decode('pil') + {how}"
            ds = ds.decode("pil").to_tuple("jpg", "cls").map_tuple(transform, int).batched(bs, partial=False)
        elif case in ("raw", "tiny"):
            info["pipeline"] = "decode() (.npy) + batched (np.stack)"
            ds = ds.decode().to_tuple("npy", "cls").batched(bs, partial=False)
        elif case == "varlen":
            info["pipeline"] = "decode() (.npy) + batched with a padding collation_fn"
            ds = ds.decode().to_tuple("npy", "cls").batched(bs, partial=False, collation_fn=pad_collate(512))
        else:
            raise ValueError(f"wds peer: unknown case {case!r}")
        return wds.WebLoader(ds, batch_size=None, shuffle=False, num_workers=w, persistent_workers=w > 0)

    def count(batch) -> int:
        return len(batch[-1])

    out = measure_loader(make, lambda loader, e: loader, count, spec)
    out.update(info)
    out["versions"] = versions("webdataset", "torch", "numpy", "PIL")
    return out


def pack(spec: dict) -> dict:
    import numpy as np
    import webdataset as wds

    cfg, data = spec["config"], spec["data"]
    dataset = cfg["dataset"]
    if dataset == "photos":
        paths, labels, _ = image_files(data["photos"])
        n = len(paths)

        def sample(i):
            with open(paths[i], "rb") as fh:
                return {"jpg": fh.read(), "cls": labels[i]}
    elif dataset in ("raw", "tiny"):
        arrays = load_arrays(data[dataset])
        x = arrays["images" if dataset == "raw" else "tokens"]
        y = arrays["labels"]
        n = len(y)

        def sample(i):
            return {"npy": np.asarray(x[i]), "cls": int(y[i])}
    elif dataset == "varlen":
        arrays = load_arrays(data["varlen"])
        tokens, offsets, y = arrays["tokens"], arrays["offsets"], arrays["labels"]
        n = len(y)

        def sample(i):
            return {"npy": np.asarray(tokens[offsets[i]:offsets[i + 1]]), "cls": int(y[i])}
    else:
        raise ValueError(f"wds pack: unknown dataset {dataset!r}")
    per_shard = -(-n // shards_for(n))

    def once(out):
        os.makedirs(out)
        order = np.random.default_rng(0).permutation(n)  # shuffle before writing, as WebDataset advises
        with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
            for i in order:
                rec = sample(int(i))
                rec["__key__"] = f"{int(i):09d}"
                sink.write(rec)

    out = measure_pack(once, spec["out"], spec)
    out["versions"] = versions("webdataset")
    out["pipeline"] = "ShardWriter, 8 shards, samples in random order"
    return out
