"""What a built wheel holds: every Python module of the source tree.

setuptools' ``build_py`` is the step that copies the pure-Python packages into a wheel (``pip install .``,
``pip wheel .``); the native extension is built by ``build_ext`` and not needed here. A package missing
from pyproject's package configuration would install a fastload that fails at import on the user's machine
while every test here, run from the source tree, passes. The build runs on a copy of the project's build
inputs: in the checkout, the ``fastload.egg-info`` an editable install leaves would list every file and hide
a missing package.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_built_wheel_has_every_module_of_the_tree(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT / "fastload", src / "fastload", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copytree(ROOT / "csrc", src / "csrc")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    out = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path / "lib")],
                         cwd=src, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    tree = {p.relative_to(src).as_posix() for p in (src / "fastload").rglob("*.py")}
    built = {p.relative_to(tmp_path / "lib").as_posix() for p in (tmp_path / "lib" / "fastload").rglob("*.py")}
    assert tree - built == set(), f"modules a wheel would leave out: {sorted(tree - built)}"
    assert len(tree) > 50  # the walk found the package
