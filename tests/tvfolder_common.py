"""Stand-ins for torchvision 0.29's folder datasets and the few transforms the folder tests run, for CI without
torchvision: each class has torchvision's module, name and attributes and does what torchvision's does (the
dataset code follows ``torchvision/datasets/folder.py``: ``find_classes``, ``make_dataset``,
``DatasetFolder.__getitem__``, ``pil_loader``; the transforms ``torchvision/transforms/transforms.py`` and
``functional.py`` on PIL images), so torch's DataLoader over them is the reference a real script would get.
The real classes are used instead where torchvision is importable (``real_or_standin``)."""

from __future__ import annotations

import os
from enum import Enum

import numpy as np
import torch
from PIL import Image

FOLDER = "torchvision.datasets.folder"
V1 = "torchvision.transforms.transforms"
V2_GEOMETRY = "torchvision.transforms.v2._geometry"
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


# -- torchvision/datasets/folder.py ---------------------------------------------------------------------------

def has_file_allowed_extension(filename, extensions):
    return filename.lower().endswith(extensions if isinstance(extensions, str) else tuple(extensions))


def find_classes(directory):
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
    return classes, {cls_name: i for i, cls_name in enumerate(classes)}


def make_dataset(directory, class_to_idx=None, extensions=None, is_valid_file=None, allow_empty=False):
    directory = os.path.expanduser(directory)
    if class_to_idx is None:
        _, class_to_idx = find_classes(directory)
    if (extensions is None) == (is_valid_file is None):
        raise ValueError("Both extensions and is_valid_file cannot be None or not None at the same time")
    if extensions is not None:
        def is_valid_file(x):
            return has_file_allowed_extension(x, extensions)
    instances, available = [], set()
    for target_class in sorted(class_to_idx.keys()):
        class_index = class_to_idx[target_class]
        target_dir = os.path.join(directory, target_class)
        if not os.path.isdir(target_dir):
            continue
        for root, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(root, fname)
                if is_valid_file(path):
                    instances.append((path, class_index))
                    available.add(target_class)
    empty = set(class_to_idx.keys()) - available
    if empty and not allow_empty:
        raise FileNotFoundError(f"Found no valid file for the classes {', '.join(sorted(empty))}. ")
    return instances


class VisionDataset(torch.utils.data.Dataset):
    __module__ = "torchvision.datasets.vision"

    def __init__(self, root=None, transforms=None, transform=None, target_transform=None):
        if isinstance(root, str):
            root = os.path.expanduser(root)
        self.root = root
        self.transform = transform
        self.target_transform = target_transform


class DatasetFolder(VisionDataset):
    __module__ = FOLDER

    def __init__(self, root, loader, extensions=None, transform=None, target_transform=None, is_valid_file=None,
                 allow_empty=False):
        super().__init__(root, transform=transform, target_transform=target_transform)
        classes, class_to_idx = self.find_classes(self.root)
        samples = self.make_dataset(self.root, class_to_idx=class_to_idx, extensions=extensions,
                                    is_valid_file=is_valid_file, allow_empty=allow_empty)
        self.loader = loader
        self.extensions = extensions
        self.classes = classes
        self.class_to_idx = class_to_idx
        self.samples = samples
        self.targets = [s[1] for s in samples]

    @staticmethod
    def make_dataset(directory, class_to_idx, extensions=None, is_valid_file=None, allow_empty=False):
        return make_dataset(directory, class_to_idx, extensions=extensions, is_valid_file=is_valid_file,
                            allow_empty=allow_empty)

    def find_classes(self, directory):
        return find_classes(directory)

    def __getitem__(self, index):
        path, target = self.samples[index]
        sample = self.loader(path)
        if self.transform is not None:
            sample = self.transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target

    def __len__(self):
        return len(self.samples)


def pil_loader(path):
    with open(path, "rb") as f:
        img = Image.open(f)
        return img.convert("RGB")


def default_loader(path):
    return pil_loader(path)  # torchvision's image backend is PIL unless set to accimage


pil_loader.__module__ = default_loader.__module__ = FOLDER


class ImageFolder(DatasetFolder):
    __module__ = FOLDER

    def __init__(self, root, transform=None, target_transform=None, loader=default_loader, is_valid_file=None,
                 allow_empty=False):
        super().__init__(root, loader, IMG_EXTENSIONS if is_valid_file is None else None, transform=transform,
                         target_transform=target_transform, is_valid_file=is_valid_file, allow_empty=allow_empty)
        self.imgs = self.samples


# -- torchvision/transforms (v1, on PIL images) -----------------------------------------------------------------

class InterpolationMode(Enum):
    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"


InterpolationMode.__module__ = "torchvision.transforms.functional"


def _size2(size):
    return (size, size) if isinstance(size, int) else tuple(size)


class Compose:
    __module__ = V1

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, img):
        for t in self.transforms:
            img = t(img)
        return img

    def __repr__(self):
        return f"Compose({self.transforms})"


class Resize(torch.nn.Module):
    __module__ = V1

    def __init__(self, size, interpolation=InterpolationMode.BILINEAR, max_size=None, antialias=True):
        super().__init__()
        self.size, self.interpolation, self.max_size, self.antialias = size, interpolation, max_size, antialias

    def forward(self, img):
        w, h = img.size
        if isinstance(self.size, int) or len(self.size) == 1:  # functional._compute_resized_output_size
            s = self.size if isinstance(self.size, int) else self.size[0]
            short, long = (w, h) if w <= h else (h, w)
            new_short, new_long = s, int(s * long / short)
            new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
        else:
            new_h, new_w = self.size
        return img.resize((new_w, new_h), Image.BILINEAR)

    def __repr__(self):
        return f"Resize(size={self.size})"


class CenterCrop(torch.nn.Module):
    __module__ = V1

    def __init__(self, size):
        super().__init__()
        self.size = _size2(size)

    def forward(self, img):
        w, h = img.size
        th, tw = self.size
        top, left = int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))
        return img.crop((left, top, left + tw, top + th))

    def __repr__(self):
        return f"CenterCrop(size={self.size})"


class ToTensor:
    __module__ = V1

    def __call__(self, pic):
        return torch.from_numpy(np.array(pic, np.uint8, copy=True)).permute(2, 0, 1).contiguous().float().div(255)

    def __repr__(self):
        return "ToTensor()"


class PILToTensor:
    __module__ = V1

    def __call__(self, pic):
        return torch.from_numpy(np.array(pic, np.uint8, copy=True)).permute(2, 0, 1).contiguous()

    def __repr__(self):
        return "PILToTensor()"


class Normalize(torch.nn.Module):
    __module__ = V1

    def __init__(self, mean, std, inplace=False):
        super().__init__()
        self.mean, self.std, self.inplace = mean, std, inplace

    def forward(self, t):
        mean = torch.as_tensor(self.mean, dtype=t.dtype)[:, None, None]
        std = torch.as_tensor(self.std, dtype=t.dtype)[:, None, None]
        return (t - mean) / std


class ElasticTransform(torch.nn.Module):
    """v2's, which fastload has no equivalent of (the converter's own example); here it leaves the image as is."""

    __module__ = V2_GEOMETRY

    def __init__(self, alpha=50.0, sigma=5.0):
        super().__init__()
        self.alpha, self.sigma = alpha, sigma

    def forward(self, img):
        return img


def real_or_standin():
    """(datasets namespace, transforms namespace): torchvision's own when importable, else these stand-ins."""
    try:
        import torchvision.datasets as tvd
        import torchvision.transforms as tvt
        return tvd, tvt
    except ImportError:
        import sys

        me = sys.modules[__name__]
        return me, me


# -- timm 1.0's ImageDataset over a folder (timm/data/dataset.py, readers/reader_image_folder.py) ---------------

def natural_key(string_):
    import re

    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", string_.lower())]


def find_images_and_targets(folder, types=None, class_to_idx=None, leaf_name_only=True, sort=True):
    types = set(IMG_EXTENSIONS) if not types else set(types)
    labels, filenames = [], []
    for root, _, files in os.walk(folder, topdown=False, followlinks=True):
        rel_path = os.path.relpath(root, folder) if (root != folder) else ""
        label = os.path.basename(rel_path) if leaf_name_only else rel_path.replace(os.path.sep, "_")
        for f in files:
            if os.path.splitext(f)[1].lower() in types:
                filenames.append(os.path.join(root, f))
                labels.append(label)
    if class_to_idx is None:
        class_to_idx = {c: idx for idx, c in enumerate(sorted(set(labels), key=natural_key))}
    images_and_targets = [(f, class_to_idx[la]) for f, la in zip(filenames, labels) if la in class_to_idx]
    if sort:
        images_and_targets = sorted(images_and_targets, key=lambda k: natural_key(k[0]))
    return images_and_targets, class_to_idx


class ReaderImageFolder:
    __module__ = "timm.data.readers.reader_image_folder"

    def __init__(self, root, class_map="", input_key=None):
        self.root = root
        self.samples, self.class_to_idx = find_images_and_targets(root)

    def __getitem__(self, index):
        path, target = self.samples[index]
        return open(path, "rb"), target

    def __len__(self):
        return len(self.samples)


class ImageDataset(torch.utils.data.Dataset):
    __module__ = "timm.data.dataset"

    def __init__(self, root, reader=None, split="train", class_map=None, load_bytes=False, input_img_mode="RGB",
                 transform=None, target_transform=None, additional_features=None):
        self.reader = reader or ReaderImageFolder(root)
        self.load_bytes = load_bytes
        self.input_img_mode = input_img_mode
        self.transform = transform
        self.target_transform = target_transform
        self.additional_features = additional_features
        self._consecutive_errors = 0

    def __getitem__(self, index):
        img, target = self.reader[index]
        img = img.read() if self.load_bytes else Image.open(img)
        if self.input_img_mode and not self.load_bytes:
            img = img.convert(self.input_img_mode)
        if self.transform is not None:
            img = self.transform(img)
        if target is None:
            target = -1
        elif self.target_transform is not None:
            target = self.target_transform(target)
        return img, target

    def __len__(self):
        return len(self.reader)
