"""torchvision's ``ImageFolder`` / ``DatasetFolder`` (and timm's ``ImageDataset`` over a folder) on the fast path.

``fastload.DataLoader(torchvision.datasets.ImageFolder(root, transform=...))`` -- a training script with one
changed import -- reads the dataset's own sample list packed once into ``fastload.open``'s folder cache
(``_front/folder_cache.py``), with the dataset's transform converted to fastload's (``torchvision_convert.py``):

* the pack is made from the dataset's ``samples`` (path, class index), in their order, so packed sample ``i``
  is ``dataset[i]`` with the same label (samplers, ``Subset`` indices and ``targets`` agree), whatever chose
  them (``find_classes``, ``is_valid_file``, ``allow_empty``, a list edited after construction). When the list
  is the folder's own ImageFolder listing (the usual case) the cache entry is ``fastload.open(root)``'s;
* images are read as torchvision's ``pil_loader`` reads them (RGB), then the converted transform runs natively.

Classes are matched by module and name, as the converter does: torchvision and timm are never imported here.
What the fast path cannot honour is named by :func:`folder_dataset`'s reason (``NotFastPath``), and the loader
keeps torch's path, saying why (``_dropin.warn_folder_refused``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from .._errors import FastloadError, SourceError
from ..fields import NotFastPath
from .._schema import Field, Schema
from ..sources import ImageFolderSource

TV_MODULE = "torchvision.datasets.folder"
TIMM_MODULE = "timm.data.dataset"
# torchvision's (and timm's) transforms that make a tensor of the PIL image: without one, samples are PIL images
TO_TENSOR = ("ToTensor", "PILToTensor", "ToImage", "ToImageTensor", "MaybeToTensor", "MaybePILToTensor")


def _defined_in(cls: type, method: str) -> tuple[str, str] | None:
    """(module, qualname) of the class in ``cls``'s MRO that defines ``method``."""
    for c in cls.__mro__:
        if method in vars(c):
            return c.__module__, c.__qualname__
    return None


def kind_of(dataset: Any) -> str | None:
    """'torchvision' for a torchvision DatasetFolder (ImageFolder included, or a subclass of either), 'timm' for
    timm's ImageDataset, else None."""
    for c in type(dataset).__mro__:
        if c.__module__ == TV_MODULE and c.__name__ == "DatasetFolder":
            return "torchvision"
        if c.__module__ == TIMM_MODULE and c.__name__ == "ImageDataset":
            return "timm"
    return None


def _name(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__name__


def _check_item_methods(dataset: Any, kind: str) -> None:
    base = "DatasetFolder" if kind == "torchvision" else "ImageDataset"
    module = TV_MODULE if kind == "torchvision" else TIMM_MODULE
    for method in ("__getitem__", "__len__"):
        where = _defined_in(type(dataset), method)
        if where != (module, base):
            raise NotFastPath(
                f"{type(dataset).__name__} overrides {method} ({where[1] if where else '?'}), which "
                f"the fast path cannot run"
            )
    where = _defined_in(type(dataset), "__getitems__")  # torch's fetcher would call it for whole batches
    if where is not None:
        raise NotFastPath(f"{type(dataset).__name__} defines __getitems__ ({where[1]}), which the fast path cannot run")


def _torchvision_samples(dataset: Any) -> tuple[list, list]:
    """(samples, classes) of a torchvision DatasetFolder whose items the fast path can give as torchvision does."""
    loader = getattr(dataset, "loader", None)
    if not (
        getattr(loader, "__module__", None) == TV_MODULE
        and getattr(loader, "__name__", None) in ("default_loader", "pil_loader")
    ):
        raise NotFastPath(
            f"its loader ({_name(loader)}) is not torchvision's default_loader or pil_loader: the "
            f"fast path decodes the files itself"
        )
    tv = sys.modules.get("torchvision")
    backend = getattr(tv, "get_image_backend", lambda: "PIL")()
    if getattr(loader, "__name__", None) == "default_loader" and backend != "PIL":
        raise NotFastPath(
            f"torchvision's image backend is {backend!r}: default_loader then gives its images, not PIL's"
        )
    return list(dataset.samples), list(dataset.classes)


def _timm_samples(dataset: Any) -> tuple[list, list]:
    """(samples, classes) of timm's ImageDataset over a folder (``ReaderImageFolder``: its own natural-key order)."""
    reader: Any = getattr(dataset, "reader", None)
    if type(reader).__name__ != "ReaderImageFolder" or not type(reader).__module__.startswith("timm.data"):
        raise NotFastPath(f"its reader ({type(reader).__name__}) is not timm's ReaderImageFolder")
    if getattr(dataset, "load_bytes", False):
        raise NotFastPath("load_bytes=True gives the files' bytes, not images")
    mode = getattr(dataset, "input_img_mode", "RGB")
    if mode != "RGB":
        raise NotFastPath(f"input_img_mode={mode!r}: the fast path gives RGB images")
    by_index = sorted(reader.class_to_idx.items(), key=lambda kv: kv[1])
    return [(str(p), int(t)) for p, t in reader.samples], [c for c, _ in by_index]


def _check_transforms(dataset: Any, fallback: bool = False) -> Any:
    """The dataset's transform, when the fast path can run it with torchvision's meaning; else NotFastPath.
    ``fallback``: transforms fastload does not convert may run per sample (``fastload.timm.create_loader``)."""
    target_transform = getattr(dataset, "target_transform", None)
    if target_transform is not None:
        raise NotFastPath(
            f"target_transform={_name(target_transform)} is Python run on each label; the fast path "
            f"gives the stored class indices"
        )
    t = getattr(dataset, "transform", None)
    if t is None:
        raise NotFastPath("transform=None: torchvision then gives PIL images, which the fast path does not make")
    _check_pipeline(t, fallback)  # before packing: a transform that cannot run natively packs nothing
    members, stack = [], [t]
    while stack:  # a Compose's members, nested ones too
        m = stack.pop()
        members.append(m)
        if type(m).__name__ == "Compose" and isinstance(getattr(m, "transforms", None), (list, tuple)):
            stack.extend(m.transforms)
    if not any(
        type(m).__name__ in TO_TENSOR and type(m).__module__.split(".")[0] in ("torchvision", "timm") for m in members
    ):
        raise NotFastPath(
            f"its transform {t!r} has no ToTensor/PILToTensor/ToImage: torchvision then gives PIL "
            f"images, which the fast path does not make"
        )
    return t


class _ListedFolder(ImageFolderSource):
    """A dataset's (path, class index) list as an ImageFolder source for ``fastload.pack``: the folder source's
    schema, metadata and encoding, this list's samples in its order (the folder is not listed again).
    ``cache_variant``: None for the folder's own listing, else what keeps this list's cache entries apart."""

    def __init__(self, root: Any, samples: list, classes: list, variant: str | None):
        self.root = Path(root)
        self.classes = [c if isinstance(c, str) else repr(c) for c in classes]  # names in the manifest's JSON
        self.samples = samples  # (ImageNet's: tuples of names)
        self.schema = Schema([Field.image("image"), Field.int("label")])
        self.metadata = {"source": "imagefolder", "classes": self.classes}
        self.cache_variant = variant


def _variant(root: Any, samples: list) -> str | None:
    """None when ``samples`` is the folder's own ImageFolder listing (then the cache entry is fastload.open's);
    else what tells this list's entries apart from the folder's and other lists': a hash of its paths and labels."""

    def same(listing: list) -> list:  # "./train/a.jpg" and "train/a.jpg" are one file
        return [(os.path.normpath(p), t) for p, t in listing]

    try:
        if same(ImageFolderSource(root).samples) == same(samples):
            return None
    except SourceError:
        pass
    import xxhash

    h = xxhash.xxh3_64()
    for p, t in samples:
        h.update(f"{os.path.relpath(p, root)}\0{t}\n".encode())
    return h.hexdigest()


def folder_dataset(dataset: Any, cache_dir: Any = None, fallback: bool = False) -> Any:
    """``dataset`` (a torchvision DatasetFolder or timm ImageDataset, see :func:`kind_of`) as a fastload.Dataset
    over its cached pack, its transform converted; ``NotFastPath`` with the reason when that cannot give what
    ``dataset[i]`` gives. ``fallback``: the transforms fastload does not convert run per sample, as in
    ``fastload.open`` (warned there), instead of refusing the fast path."""
    kind = kind_of(dataset)
    if kind is None:
        raise NotFastPath(f"{type(dataset).__name__} is not a torchvision DatasetFolder or timm ImageDataset")
    _check_item_methods(dataset, kind)
    samples, classes = _torchvision_samples(dataset) if kind == "torchvision" else _timm_samples(dataset)
    transform = _check_transforms(dataset, fallback)
    if not samples:
        raise NotFastPath("it has no samples")
    root = getattr(dataset, "root", None) or getattr(getattr(dataset, "reader", None), "root", None)  # timm's: reader's
    root = os.fspath(root or os.path.dirname(samples[0][0]))
    samples = [(os.fspath(p), int(t)) for p, t in samples]
    from .dataset import Dataset, leased
    from .folder_cache import cached_pack

    try:
        source = _ListedFolder(root, samples, classes, _variant(root, samples))
        path, lease = cached_pack(source, cache_dir)
    except (FastloadError, OSError) as e:
        raise NotFastPath(f"its images could not be packed for the fast path ({e})") from None
    try:
        packed = Dataset(path, transforms={"image": transform})
    except (ValueError, TypeError) as e:
        lease.close()
        raise NotFastPath(f"its transform cannot run natively: {e}") from None
    return leased(packed, lease)


def _check_pipeline(transform: Any, fallback: bool = False) -> None:
    """NotFastPath unless ``transform`` converts whole to fastload's native pipeline (no per-sample fallback, unless
    ``fallback``) with one output size (the fast path batches)."""
    from ..transforms import ImagePipeline

    try:
        pipe = ImagePipeline(transform)
    except (ValueError, TypeError) as e:
        raise NotFastPath(f"its transform cannot run natively: {e}") from None
    if pipe.fallback and not fallback:
        raise NotFastPath(
            "its transform is not converted whole: "
            + "; ".join(f"{u.name} ({u.reason or 'a callable fastload does not know'})" for u in pipe.fallback)
        )
    if pipe.output_size is None:  # knowable now: the loader's batches would refuse it once the folder is packed
        raise NotFastPath(
            "its transform gives no fixed output size (e.g. RandomResizedCrop(224) or Resize + CenterCrop); "
            "images of different sizes cannot be batched"
        )
