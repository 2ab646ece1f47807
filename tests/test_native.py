"""_native: the compiled core behind one accessor that says how to build it when it is missing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fastload._native import is_jpeg, native

from conftest import jpeg_bytes, png_bytes

ROOT = Path(__file__).resolve().parents[1]


def test_native_is_the_compiled_core():
    from fastload import _C

    assert native() is _C and hasattr(native(), "Pool")


def test_a_missing_core_says_how_to_build_it(tmp_path):
    """A copy of the package without the built ``_C``: the first use of the core (``import fastload`` itself
    reaches it) raises the install hint, keeping the original error as the cause."""
    import shutil

    shutil.copytree(ROOT / "fastload", tmp_path / "fastload", ignore=shutil.ignore_patterns("_C*", "__pycache__"))
    code = textwrap.dedent("""
        # an editable install's finder would serve the source tree's _C: look only at the copy
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
        try:
            import fastload
            from fastload._native import native
            native()
        except ImportError as e:
            print("HINT:", e)
            print("CAUSE:", type(e.__cause__).__name__)
            print("FROM:", sys.modules["fastload._native"].__file__)
        """)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", "import sys\n" + code, str(tmp_path)], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    hint = out.stdout
    for words in ["fastload._C", "is not built", "pip install -e .", "make install", "g++",
                  "libjpeg62-turbo-dev", "Original error:", "CAUSE: ImportError",
                  f"FROM: {tmp_path}"]:
        assert words in hint, (words, hint)


@pytest.mark.parametrize("data, want", [
    (jpeg_bytes(8, 8), True),
    (png_bytes(8, 8), False),
    (b"", False),
    (b"\xff\xd8", False),  # too short to be the start of a JPEG
    (b"\xff\xd8\xfe rest", False),
], ids=["jpeg", "png", "empty", "two bytes", "wrong third byte"])
def test_is_jpeg_reads_the_start_of_image_marker(data, want):
    assert is_jpeg(data) is want


def test_is_jpeg_takes_any_buffer():
    data = jpeg_bytes(8, 8)
    assert is_jpeg(memoryview(data)) and is_jpeg(bytearray(data))
    assert is_jpeg(np.frombuffer(data, dtype=np.uint8))
