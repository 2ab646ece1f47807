"""Map-style torch Datasets as a torch user writes them: image files opened with PIL, and memory-mapped
``.npy`` files (the page cache is shared with the worker processes), one sample per ``__getitem__``.
The torch peers and fastload's generic path use the same classes, so their rows differ only by loader."""

from __future__ import annotations

import numpy as np
import torch

from ._common import load_arrays


class ImageFiles(torch.utils.data.Dataset):
    """ImageFolder without torchvision: files by class directory, PIL open + convert('RGB') + ``transform``."""

    def __init__(self, root, transform):
        from ._common import image_files

        self.paths, self.labels, _ = image_files(root)
        self.transform = transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        from PIL import Image

        with open(self.paths[i], "rb") as fh:
            img = Image.open(fh).convert("RGB")
        return self.transform(img), self.labels[i]


class ArrayRows(torch.utils.data.Dataset):
    """``(field0[i], field1[i], ...)`` of the fixed-size arrays in a directory, as tensors / ints."""

    def __init__(self, directory: str, fields: tuple[str, ...]):
        arrays = load_arrays(directory)
        self.arrays = [arrays[f] for f in fields]

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, i):
        return tuple(torch.from_numpy(np.array(a[i])) if a.ndim > 1 else int(a[i]) for a in self.arrays)


class ArrayBatches(ArrayRows):
    """torch's batched-fetch alternative: ``__getitem__`` takes a list of indices (``sampler=BatchSampler``,
    ``batch_size=None``), one fancy-indexing gather per field and batch."""

    def __getitem__(self, idx):
        idx = np.sort(np.asarray(idx))  # sorted reads from the memory map (the batch is still random)
        return tuple(torch.from_numpy(a[idx]) for a in self.arrays)


class VarTokens(torch.utils.data.Dataset):
    """Variable-length token rows: ``tokens[offsets[i]:offsets[i + 1]]`` and ``labels[i]``."""

    def __init__(self, directory: str):
        arrays = load_arrays(directory)
        self.tokens, self.offsets, self.labels = arrays["tokens"], arrays["offsets"], arrays["labels"]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return torch.from_numpy(np.array(self.tokens[a:b])), int(self.labels[i])


def batch_fetch_loader(ds: ArrayBatches, batch_size: int, num_workers: int, loader_cls=torch.utils.data.DataLoader):
    sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(ds), batch_size, drop_last=True)
    return loader_cls(ds, sampler=sampler, batch_size=None, num_workers=num_workers,
                      persistent_workers=num_workers > 0)
