"""``make wheel`` as a user meets it: the wheel installs into a fresh venv with no compiler and no image
libraries of the system's, and packs, opens and loads there with plain Pillow.

scripts/wheel.sh (what ``make wheel`` runs) builds the sdist, the wheel from the sdist, checks that the native
core links no torch, and repairs the wheel with auditwheel (libjpeg-turbo and libpng copied in). This test runs
it on a copy of the build inputs, then, in a new venv whose PATH holds nothing but the venv (no g++, no cc),
installs torch==2.13.0 (the CPU wheel on this machine's disk: any other torch spec downloads gigabytes), plain
Pillow, and the wheel with its dependencies, binaries only; checks with ldd that the extension resolves its
image libraries to the wheel's own copies; and packs an image folder (JPEGs kept, a PNG re-encoded by Pillow)
with the ``fastload`` command, opens it and loads it. About 4 minutes on 2 cores, most of it the C++ build.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

USE = textwrap.dedent("""
    import importlib.metadata as md
    import subprocess, sys
    from pathlib import Path

    import numpy as np
    import PIL
    import torch
    from PIL import Image

    import fastload
    from fastload import transforms as T

    root, venv = Path(sys.argv[1]), Path(sys.argv[2])
    assert Path(fastload.__file__).is_relative_to(venv), fastload.__file__  # the installed one, not the checkout
    dists = {d.metadata["Name"].lower() for d in md.distributions()}
    assert "pillow" in dists and "pillow-simd" not in dists and "torch-fastload" in dists, sorted(dists)

    rng = np.random.default_rng(0)
    for c in range(2):
        (root / "src" / f"c{c}").mkdir(parents=True)
        for k in range(4):
            Image.fromarray(rng.integers(0, 256, (40 + 8 * k, 56, 3), dtype=np.uint8)).save(
                root / "src" / f"c{c}" / f"{k}.jpg", quality=90)
    png = rng.integers(0, 256, (24, 30, 3), dtype=np.uint8)
    Image.fromarray(png).save(root / "src" / "c1" / "x.png")  # not a JPEG: decoded and stored by Pillow

    version = subprocess.run([venv / "bin" / "fastload", "--version"], capture_output=True, text=True, check=True)
    assert version.stdout == f"fastload, version {fastload.__version__}\\n", version
    subprocess.run([venv / "bin" / "fastload", "pack", root / "src", root / "ds"], check=True)
    plain = fastload.open(root / "ds")
    image, label = plain[8]  # c1/x.png, after c0's four and c1's four JPEGs
    assert label == 1 and np.array_equal(image.permute(1, 2, 0).numpy(), png)

    ds = fastload.open(root / "ds", transforms={"image": [T.RandomResizedCrop(32), T.RandomHorizontalFlip()]})
    labels = []
    for images, batch_labels in fastload.DataLoader(ds, batch_size=3, shuffle=True, num_workers=2):
        assert images.dtype == torch.uint8 and tuple(images.shape[1:]) == (3, 32, 32), images.shape
        labels += batch_labels.tolist()
    assert sorted(labels) == [0] * 4 + [1] * 5, labels

    rotated = fastload.open(root / "ds", transforms={"image": [T.RandomResizedCrop(32), T.RandomRotation(15)]})
    image, _ = rotated[0]  # ds[i] with an augmentation: the PIL reference engine, on plain Pillow
    assert tuple(image.shape) == (3, 32, 32)
    print("used", fastload.__file__, "PIL", PIL.__version__, "torch", torch.__version__)
""")


def _run(cmd: list, **kw) -> str:
    """stdout, then stderr, of ``cmd``, which must succeed."""
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert out.returncode == 0, f"{cmd} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return out.stdout + out.stderr


def check_links(so: Path, bundled_in: Path) -> None:
    """``so`` loads libjpeg and libpng from ``bundled_in`` (ldd: what the loader resolves now), and neither
    links nor calls torch (nm: no c10/at/torch symbols), so that any torch >= 2.1 serves it."""
    ldd = _run(["ldd", so], timeout=60)
    for lib in ("libjpeg", "libpng"):
        resolved = [Path(line.split("=>")[1].split("(")[0].strip()) for line in ldd.splitlines()
                    if lib in line and "=>" in line]
        assert len(resolved) == 1 and resolved[0].resolve().parent == bundled_in.resolve(), (lib, ldd)
    assert not re.search(r"lib(torch|c10)", ldd), ldd
    undefined = _run(["nm", "-D", "--undefined-only", so], timeout=60)
    torch_symbols = re.findall(r" ((?:_ZN3c10|_ZN2at|_ZN5torch|THP)\w*)", undefined)
    assert torch_symbols == [], torch_symbols[:10]


def test_the_wheel_installs_without_build_tools_and_loads(tmp_path):
    src = tmp_path / "src"  # the build inputs only: an egg-info of the checkout would add its stale file list
    shutil.copytree(ROOT / "fastload", src / "fastload", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copytree(ROOT / "csrc", src / "csrc")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    dist = tmp_path / "dist"
    # PYTHON relative to the folder it runs in, as the Makefile passes .venv/bin/python
    log = _run(["bash", ROOT / "scripts" / "wheel.sh", dist], timeout=1200, cwd=tmp_path,
               env={**os.environ, "PYTHON": os.path.relpath(sys.executable, tmp_path), "SRC": str(src)})

    sdist, = dist.glob("torch_fastload-*.tar.gz")
    with tarfile.open(sdist) as t:
        in_sdist = {Path(n).relative_to(Path(n).parts[0]).as_posix() for n in t.getnames() if "/" in n}
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "csrc").iterdir()}
    assert sources - in_sdist == set(), f"the sdist leaves out {sorted(sources - in_sdist)}"
    # docs/install.md's wheel block (tests/test_docs.py leaves it to this test): what it runs is what ran here
    page = (ROOT / "docs" / "install.md").read_text()
    block = re.search(r"<!-- docs-test: ran-by tests/test_wheel.py -->\n```sh\n(.*?)```", page, re.S)
    assert block, "docs/install.md has no wheel block for this test"
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    assert commands == ["make wheel", "pip install dist/torch_fastload-*.whl"], commands
    assert "\nwheel: $(STAMP)\n\tPYTHON=$(BIN)/python scripts/wheel.sh dist\n" in (ROOT / "Makefile").read_text()
    wheel, = dist.glob("torch_fastload-*.whl")  # the page's glob names one wheel
    assert re.fullmatch(r"torch_fastload-[\d.]+-cp3\d+-cp3\d+-manylinux_2_\d+_x86_64\.whl", wheel.name), wheel.name
    bundled = [n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("torch_fastload.libs/")]
    assert any("libjpeg" in n for n in bundled) and any("libpng" in n for n in bundled), bundled
    # setuptools announces a few months ahead the metadata it will stop building (as it did the license table)
    due = "you need to update your project and remove deprecated calls"
    assert due not in log, log[max(0, log.index(due) - 1500):][:2500]
    shown = " ".join(log.split())  # auditwheel show on the repaired wheel (its text is wrapped)
    assert f'{wheel.name} is consistent with the following platform tag: "manylinux_2_' in shown, log[-3000:]

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], timeout=300)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = str(venv / "bin")
    for tool in ("g++", "gcc", "cc", "c++", "ld"):
        assert shutil.which(tool, path=env["PATH"]) is None, tool
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--only-binary", ":all:"]
    _run(pip + ["torch==2.13.0"], env=env, timeout=600)
    _run(pip + ["pillow"], env=env, timeout=300)
    _run(pip + [wheel], env=env, timeout=300)

    so, = (venv / "lib").glob("python3*/site-packages/fastload/_C*.so")
    check_links(so, bundled_in=so.parent.parent / "torch_fastload.libs")

    out = _run([venv / "bin" / "python", "-c", USE, tmp_path / "use", venv], env=env, cwd=tmp_path, timeout=600)
    assert re.search(r"^used .*/site-packages/fastload/__init__.py PIL [\d.]+ torch 2\.13\.0", out, re.M), out
