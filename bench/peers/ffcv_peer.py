"""FFCV 1.0.2 (built from source here against Debian's libopencv-dev and libturbojpeg), with the pipelines of
its documentation: a ``.beton`` file written by ``DatasetWriter``, read by ``ffcv.loader.Loader``
(``order=RANDOM``, ``os_cache=True``, ``num_workers`` = its JIT-compiled worker threads).

Pack (``DatasetWriter(num_workers=2)``):
  photos  RGBImageField(write_mode="jpg", jpeg_quality=90) + IntField. FFCV cannot store a JPEG file as it
          is: it decodes each image (PIL) and re-encodes it with OpenCV at quality 90 (fastload's equivalent
          is ``image_mode="jpeg", quality=90``; its default keeps the original bytes).
  raw     NDArrayField(uint8, (3, 224, 224)) + IntField;   tiny: NDArrayField(int32, (48,)) + IntField
  varlen  BytesField (the int32 tokens' bytes) + IntField length + IntField label
Load (uint8 NCHW channels_last images, as fastload's):
  photos  [RandomResizedCropRGBImageDecoder((224, 224)), RandomHorizontalFlip(), ToTensor(), ToTorchImage()]
  raw     [NDArrayDecoder(), ToTensor()]          labels: [IntDecoder(), ToTensor(), Squeeze()]
  varlen  [BytesDecoder(), ToTensor()] -> viewed as int32 (B, 512); FFCV copies each sample's bytes into a
          reused buffer and leaves the rest of the row as it was, so the batch is masked to zero beyond each
          length in the main thread (one torch op) to give the same padded output as the others.
Config: {"num_workers": W} or, for pack, {"dataset": ...}.
"""

from __future__ import annotations

import os

from ._common import image_files, load_arrays, measure_loader, measure_pack, versions

MAX_LEN = 512


def check() -> dict:
    import cv2
    import numba
    import numpy
    import torch

    import ffcv  # noqa: F401
    from ffcv.loader import Loader  # noqa: F401
    from ffcv.writer import DatasetWriter  # noqa: F401

    return {"ffcv": _ffcv_version(), "numba": numba.__version__, "opencv": cv2.__version__,
            "torch": torch.__version__, "numpy": numpy.__version__}


def _ffcv_version() -> str:
    from importlib.metadata import version

    return version("ffcv")


def run(spec: dict) -> dict:
    if spec["case"] == "pack":
        return pack(spec)
    import torch
    from ffcv.fields.decoders import BytesDecoder, IntDecoder, NDArrayDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    case, cfg = spec["case"], spec["config"]
    w, bs, seed = int(cfg.get("num_workers", 2)), int(spec["batch_size"]), int(spec.get("seed", 0))
    label = [IntDecoder(), ToTensor(), Squeeze()]
    if case in ("photos", "overlap"):
        pipelines = {"image": [RandomResizedCropRGBImageDecoder((224, 224)), RandomHorizontalFlip(), ToTensor(),
                               ToTorchImage()], "label": label}
    elif case in ("raw", "tiny"):
        pipelines = {"data": [NDArrayDecoder(), ToTensor()], "label": label}
    elif case == "varlen":
        pipelines = {"tokens": [BytesDecoder(), ToTensor()], "length": [IntDecoder(), ToTensor(), Squeeze()],
                     "label": label}
    else:
        raise ValueError(f"ffcv peer: unknown case {case!r}")

    def make():
        return Loader(spec["data"]["packed"], batch_size=bs, num_workers=w, order=OrderOption.RANDOM, seed=seed,
                      os_cache=True, drop_last=True, pipelines=pipelines)

    positions = torch.arange(MAX_LEN)

    def epoch(loader, e):
        if case != "varlen":
            yield from loader
            return
        for raw, lengths, labels in loader:
            tokens = raw.view(torch.int32)[:, :MAX_LEN]
            tokens.masked_fill_(positions[None, :] >= lengths[:, None], 0)
            yield tokens, lengths, labels

    def count(batch) -> int:
        return int(batch[-1].shape[0])

    out = measure_loader(make, epoch, count, spec)
    out["versions"] = {"ffcv": _ffcv_version(), **versions("numba", "torch", "numpy")}
    return out


class _Photos:
    """(PIL RGB image, label) per index, as FFCV's writer takes them."""

    def __init__(self, root: str):
        self.paths, self.labels, _ = image_files(root)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        from PIL import Image

        with Image.open(self.paths[i]) as img:
            return img.convert("RGB"), self.labels[i]


class _Arrays:
    def __init__(self, directory: str, field: str):
        arrays = load_arrays(directory)
        self.x, self.y = arrays[field], arrays["labels"]

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        import numpy as np

        return np.asarray(self.x[i]), int(self.y[i])


class _VarBytes:
    def __init__(self, directory: str):
        arrays = load_arrays(directory)
        self.tokens, self.offsets, self.y = arrays["tokens"], arrays["offsets"], arrays["labels"]

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        import numpy as np

        t = np.asarray(self.tokens[self.offsets[i]:self.offsets[i + 1]])
        return t.view(np.uint8), len(t), int(self.y[i])


def pack(spec: dict) -> dict:
    import numpy as np
    from ffcv.fields import BytesField, IntField, NDArrayField, RGBImageField
    from ffcv.writer import DatasetWriter

    cfg, data = spec["config"], spec["data"]
    dataset, workers = cfg["dataset"], int(cfg.get("workers", os.cpu_count() or 1))
    if dataset == "photos":
        source = _Photos(data["photos"])
        fields = {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()}
        note = "decode + re-encode (OpenCV, quality 90): FFCV stores no JPEG untouched"
    elif dataset in ("raw", "tiny"):
        source = _Arrays(data[dataset], "images" if dataset == "raw" else "tokens")
        x0 = source[0][0]
        fields = {"data": NDArrayField(x0.dtype, x0.shape), "label": IntField()}
        note = "NDArrayField + IntField"
    elif dataset == "varlen":
        source = _VarBytes(data["varlen"])
        fields = {"tokens": BytesField(), "length": IntField(), "label": IntField()}
        note = "BytesField (token bytes) + IntField length + IntField label"
    else:
        raise ValueError(f"ffcv pack: unknown dataset {dataset!r}")
    del np

    def once(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        writer = DatasetWriter(out, fields, num_workers=workers)
        _quiet(lambda: writer.from_indexed_dataset(source, chunksize=100))

    out = measure_pack(once, spec["out"], spec)
    out["versions"] = {"ffcv": _ffcv_version()}
    out["pipeline"] = note
    return out


def _quiet(fn):
    """FFCV's writer draws a tqdm bar on stderr; keep the suite's log readable."""
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):
        return fn()
