"""pack/_router.py and _target.py: the arguments and the destination checked before anything is packed
(argument misuse through the CLI: misuse/test_pack_cli.py)."""

from __future__ import annotations

import pytest

import fastload
from fastload import FastloadError


def test_a_destination_that_cannot_be_written_fails_before_packing(image_folder, tmp_path, monkeypatch):
    from fastload.pack import _local as _pack

    monkeypatch.setattr(_pack, "_encoded", lambda *a, **k: pytest.fail("the pack started"))
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(FastloadError, match=r"a_file is a file, not a folder"):
        fastload.pack(image_folder, tmp_path / "a_file" / "out", workers=0)
    assert (tmp_path / "a_file").read_text() == "x"


def test_a_destination_inside_the_source_folder_is_refused(image_folder, tmp_path):
    from misuse.conftest import unchanged

    with unchanged(image_folder):
        with pytest.raises(ValueError, match="inside the source folder"):
            fastload.pack(image_folder, image_folder / "packed", workers=0)
        with pytest.raises(ValueError, match="inside the source folder"):
            fastload.pack(image_folder, image_folder / "class_0", workers=0)


def test_fastload_pack_stays_the_function_once_the_package_modules_are_imported():
    """``fastload/pack/`` is a package named like the public function: ``fastload/__init__.py`` rebinds the
    name, and importing the package's modules later must not undo that."""
    import importlib

    import fastload.pack._router  # noqa: F401

    importlib.import_module("fastload.pack._ray")
    assert callable(fastload.pack) and fastload.pack.__module__ == "fastload.pack._router"
    assert "pack" in fastload.__all__ and fastload.pack is importlib.import_module("fastload.pack").pack
