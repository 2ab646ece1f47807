"""ImageFolder trees: ``root/<class>/**/<image>``, with torchvision's ordering and class indices."""

from __future__ import annotations

import hashlib
import os
import warnings
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
        loops: list[str] = []
        seen = {_key(self.root): str(self.root)}  # each real folder once, across the classes: a link into another
        for cls in classes:  # class's folder is that class's, and a link to the root a loop
            seen.setdefault(_key(self.root / cls), str(self.root / cls))
        for idx, cls in enumerate(classes):
            before = len(self.samples)
            top = str(self.root / cls)
            if seen[_key(top)] != top:  # the class folder is a link to the root or to another class's folder
                loops.append(
                    f"the class folder {top} -> {os.readlink(top) if os.path.islink(top) else top} is "
                    f"{seen[_key(top)]}, reached already"
                )
                empty.append(cls)
                continue
            for dirpath, files in _walk(self.root / cls, seen, loops):
                for name in files:
                    if name.lower().endswith(exts):
                        self.samples.append((os.path.join(dirpath, name), idx))
            if len(self.samples) == before:
                empty.append(cls)
        if loops:
            loops.sort(key=lambda m: "symlink loop" not in m)  # a loop first: the worst (it repeats files endlessly)
            more = f" (and {len(loops) - 1} more such link(s))" if len(loops) > 1 else ""
            warnings.warn(
                f"a link in an ImageFolder leads to a folder reached already, under {self.root}: "
                f"{loops[0]}{more}; each file is packed once, under the first path that reaches it (a "
                f"folder reached again through a link is skipped)",
                UserWarning,
                stacklevel=2,
            )
        if not self.samples:
            raise SourceError(f"ImageFolder root {self.root} has no files with extensions {', '.join(exts)}")
        if empty:  # as torchvision's ImageFolder: a folder with no image is not a class (an earlier pack's output?)
            shown = ", ".join(str(self.root / c) for c in empty[:5]) + (
                f" and {len(empty) - 5} more" if len(empty) > 5 else ""
            )
            raise SourceError(
                f"ImageFolder root {self.root}: class folder(s) {shown} hold no image (extensions "
                f"{', '.join(exts)}); torchvision's ImageFolder refuses them too. Remove or move them, "
                f"or add their images"
            )
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


def _key(path: str | os.PathLike) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _walk(
    top: Path, seen: dict[tuple[int, int], str], loops: list[str], what: str = "an ImageFolder"
) -> list[tuple[str, list[str]]]:
    """``(folder, sorted file names)`` of every folder under ``top``, links followed, sorted by path: the order of
    ``sorted(os.walk(top, followlinks=True))`` (torchvision's), but each real folder once, by its (st_dev, st_ino)
    in ``seen`` (folder identity -> the path it was first reached by). A link to a folder already reached (a loop
    such as ``a/up -> ..``, or a second path to one folder) is not followed and is described in ``loops``; without
    this a loop repeats its files until the path grows too long."""
    out: list[tuple[str, list[str]]] = []

    def visit(path: str) -> None:
        try:
            entries = sorted(os.scandir(path), key=lambda entry: entry.name)
        except OSError as err:
            raise SourceError(f"cannot list the folder {path} of {what}: {err.strerror or err}") from None
        files: list[os.DirEntry] = []
        dirs: list[os.DirEntry] = []
        for e in entries:
            try:
                is_dir = e.is_dir()  # follows links, as os.walk(followlinks=True)
            except OSError:
                is_dir = False
            (dirs if is_dir else files).append(e)
        out.append((path, [e.name for e in files]))
        for e in dirs:
            key = _key(e.path)
            first = seen.setdefault(key, e.path)
            if first != e.path:
                target = os.readlink(e.path) if e.is_symlink() else e.path
                inside = os.path.commonpath([os.path.abspath(first), os.path.abspath(path)]) == os.path.abspath(first)
                link = "a symlink loop" if inside else "a second path to one folder"
                loops.append(f"{link}: {e.path} -> {target} leads to {first}, reached already")
                continue
            visit(e.path)

    visit(str(top))
    out.sort(key=lambda item: item[0])
    return out
