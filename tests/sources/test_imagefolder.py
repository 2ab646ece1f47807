"""fastload/sources/imagefolder.py: a torchvision ImageFolder tree as a source -- its order, labels and names
are torchvision's, an empty class folder refused as torchvision does."""

from __future__ import annotations

import os

import pytest

import fastload
from fastload import SourceError
from fastload.sources import ImageFolderSource

from conftest import make_image_folder


def test_image_folder_order_labels_and_names_are_torchvision_s(tmp_path):
    root = tmp_path / "tree"
    files = ["b_cls/z.jpg", "b_cls/a.PNG", "b_cls/sub/a.jpg", "a_cls/y.jpg", "a_cls/notes.txt"]
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_bytes(b"x")
    src = ImageFolderSource(root)
    # classes sorted; within a class, directory by directory (sorted), files sorted; other extensions left out
    assert src.classes == ["a_cls", "b_cls"]
    got = [(os.path.relpath(p, root), label) for p, label in src.samples]
    assert got == [("a_cls/y.jpg", 0), ("b_cls/a.PNG", 1), ("b_cls/z.jpg", 1), ("b_cls/sub/a.jpg", 1)]
    assert len(src) == 4 and src.describe(3) == str(root / "b_cls/sub/a.jpg") and src.load(0)[1] == 0
    before = src.fingerprint()
    (root / "a_cls/y.jpg").write_bytes(b"xy")  # a file changed: resuming a pack of the old tree is refused
    assert ImageFolderSource(root).fingerprint() != before
    (root / "nothing" / "here").mkdir(parents=True)
    with pytest.raises(SourceError, match="has no files with extensions"):
        ImageFolderSource(root / "nothing")


def test_an_empty_class_folder_is_refused_as_torchvision_does(tmp_path):
    """Issue 17 row 9: a folder with no image (an earlier pack's output, a stray folder) is not a class."""
    root = make_image_folder(tmp_path / "tree", classes=2, per_class=2)
    (root / "out").mkdir()
    (root / "out" / "manifest.json").write_text("{}")
    with pytest.raises(SourceError, match=rf"class folder\(s\) {root / 'out'} hold no image"):
        fastload.pack(root, tmp_path / "packed", workers=0)
    assert not (tmp_path / "packed").exists()


def test_links_reach_each_real_folder_once(tmp_path):
    """Issue 27 row 5: a loop deep in a class, a second link to one folder, a link into another class's folder and a
    class folder that is a link to the root: each real folder is listed once (under its first path), warned once."""
    root = make_image_folder(tmp_path / "tree", classes=2, per_class=2)
    (root / "class_0" / "sub").mkdir()
    (root / "class_0" / "sub" / "deep.jpg").write_bytes((root / "class_0" / "img_000.jpg").read_bytes())
    os.symlink("../..", root / "class_0" / "sub" / "loop")        # back to the root, from deep inside
    os.symlink("sub", root / "class_0" / "twin")                  # a second path to class_0/sub
    os.symlink("../class_1", root / "class_0" / "other")          # class_1's folder belongs to class_1
    with pytest.warns(UserWarning) as caught:
        src = ImageFolderSource(root)
    said = [str(w.message) for w in caught if "reached already" in str(w.message)]
    assert len(said) == 1 and "a symlink loop" in said[0] and "(and 2 more such link(s))" in said[0]
    got = [(os.path.relpath(p, root), label) for p, label in src.samples]
    assert got == [("class_0/img_000.jpg", 0), ("class_0/img_001.jpg", 0), ("class_0/sub/deep.jpg", 0),
                   ("class_1/img_000.jpg", 1), ("class_1/img_001.jpg", 1)]
    other = make_image_folder(tmp_path / "other", classes=1, per_class=1)
    os.symlink(".", other / "zz_all")  # a "class" that is the root itself: not a class of its own
    with pytest.warns(UserWarning, match=r"the class folder .*zz_all -> \. is .*other, reached already"):
        with pytest.raises(SourceError, match="zz_all hold no image"):
            ImageFolderSource(other)
