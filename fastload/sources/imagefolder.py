"""ImageFolder trees: ``root/<class>/**/<image>``, with torchvision's ordering and class indices."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..fields.image import FileImage
from .._errors import SourceError
from .._schema import Field, Schema
from ._base import Source

# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ImageFolderSource(Source):
    """Class per subdirectory, sorted; files sorted within each class, found recursively."""

    files_only = True

    def __init__(self, root: str | os.PathLike, extensions: tuple[str, ...] = IMG_EXTENSIONS):
        self.root = Path(root)
        if not self.root.is_dir():
            raise SourceError(f"ImageFolder root {self.root} is not a directory")
        classes = sorted(e.name for e in os.scandir(self.root) if e.is_dir())
        if not classes:
            raise SourceError(f"ImageFolder root {self.root} has no class subdirectories")
        self.classes = classes
        exts = tuple(e.lower() for e in extensions)
        self.samples: list[tuple[str, int]] = []
        empty = []
        for idx, cls in enumerate(classes):
            before = len(self.samples)
            for dirpath, _, files in sorted(os.walk(self.root / cls, followlinks=True)):
                for name in sorted(files):
                    if name.lower().endswith(exts):
                        self.samples.append((os.path.join(dirpath, name), idx))
            if len(self.samples) == before:
                empty.append(cls)
        if not self.samples:
            raise SourceError(f"ImageFolder root {self.root} has no files with extensions {', '.join(exts)}")
        if empty:  # as torchvision's ImageFolder: a folder with no image is not a class (an earlier pack's output?)
            shown = ", ".join(str(self.root / c) for c in empty[:5]) + (f" and {len(empty) - 5} more" if len(empty) > 5
                                                                         else "")
            raise SourceError(f"ImageFolder root {self.root}: class folder(s) {shown} hold no image (extensions "
                              f"{', '.join(exts)}); torchvision's ImageFolder refuses them too. Remove or move them, "
                              f"or add their images")
        self.schema = Schema([Field.image("image"), Field.int("label")])
        self.metadata = {"source": "imagefolder", "classes": classes}

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, i: int) -> list:
        path, label = self.samples[i]
        return [FileImage(path), label]

    def describe(self, i: int) -> str:
        return self.samples[i][0]

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for path, label in self.samples:
            st = os.stat(path)
            h.update(f"{os.path.relpath(path, self.root)}\0{label}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return "imagefolder:" + h.hexdigest()
