"""NVIDIA DALI in its CPU-only mode (``device_id=None``), with the pipeline its documentation recommends for
ImageNet-style training, on the photo ImageFolder as it is on disk (DALI has no dataset format to pack):

    jpegs, labels = fn.readers.file(file_root=ROOT, random_shuffle=True, name="Reader")
    images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                           random_area=[0.08, 1.0], random_aspect_ratio=[3/4, 4/3])
    images = fn.resize(images, resize_x=224, resize_y=224)          # linear, antialiased
    images = fn.flip(images, horizontal=fn.random.coin_flip())
    -> DALIGenericIterator (torch tensors), uint8 (B, 224, 224, 3): NHWC in memory, the layout of
       fastload's channels_last NCHW batches.

Config: {"num_threads": T} (DALI's CPU worker threads), cases photos and overlap only.
"""

from __future__ import annotations

from ._common import measure_loader, versions


def check() -> dict:
    import numpy
    import torch

    import nvidia.dali as dali
    from nvidia.dali.plugin.pytorch import DALIGenericIterator  # noqa: F401

    return {"nvidia-dali": dali.__version__, "torch": torch.__version__, "numpy": numpy.__version__}


def run(spec: dict) -> dict:
    if spec["case"] not in ("photos", "overlap"):
        raise ValueError(f"dali peer: case {spec['case']!r} is not benchmarked (image pipelines only)")
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    cfg, bs = spec["config"], int(spec["batch_size"])
    threads, seed = int(cfg.get("num_threads", 2)), int(spec.get("seed", 0))
    root = spec["data"]["photos"]

    @pipeline_def(batch_size=bs, num_threads=threads, device_id=None, seed=seed + 1)
    def train_pipe():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="Reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3],
                                               num_attempts=10)
        images = fn.resize(images, resize_x=224, resize_y=224)
        images = fn.flip(images, horizontal=fn.random.coin_flip(probability=0.5))
        return images, labels

    def make():
        pipe = train_pipe()
        pipe.build()
        return DALIGenericIterator(pipe, ["image", "label"], reader_name="Reader",
                                   last_batch_policy=LastBatchPolicy.DROP, auto_reset=True)

    def epoch(loader, e):
        for out in loader:
            yield out[0]

    def count(batch) -> int:
        return int(batch["label"].shape[0])

    out = measure_loader(make, epoch, count, spec)
    out["versions"] = versions("nvidia.dali", "torch", "numpy")
    out["pipeline"] = "readers.file + decoders.image_random_crop + resize + flip (CPU-only)"
    return out
