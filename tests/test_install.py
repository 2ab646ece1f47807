"""Installing fastload into someone else's environment: the distribution's name, and PIL from either Pillow or
Pillow-SIMD (fastload/_install.py).

The package index's ``fastload`` is an unrelated project, so an install command that names it installs a
stranger's package; and fastload declares no PIL by name (a dependency on ``pillow-simd`` overwrote
torchvision's ``pillow``, and one on ``pillow`` would undo ``pillow-simd``), so it must import, open and load a
packed dataset where there is no PIL at all, and say what to install where it does need one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from PIL import Image

from conftest import make_image_folder
from fastload._install import DIST, pip_extra

ROOT = Path(__file__).resolve().parents[1]


def _repo_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split("\n")
    files = [ROOT / f for f in out if f and (ROOT / f).is_file()]
    return [f for f in files if f.suffix in {".py", ".md", ".sh", ".toml", ".txt", ".cfg", ".yaml", ".yml", ""}]


def test_the_distribution_name_is_the_one_every_hint_uses():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DIST == "torch-fastload"
    assert project["scripts"] == {"fastload": "fastload.cli:main"}  # the CLI keeps its name
    assert pip_extra("ray") == "pip install 'torch-fastload[ray]'"
    assert {"remote", "ray", "dali", "test", "pillow"} <= set(project["optional-dependencies"])


def test_the_cli_keeps_its_name_and_knows_its_version():
    from click.testing import CliRunner

    from fastload import __version__
    from fastload.cli import main

    out = CliRunner().invoke(main, ["--version"])
    assert out.exit_code == 0 and out.output == f"fastload, version {__version__}\n", (out.output, out.exception)


def test_no_install_command_in_the_repository_names_the_index_s_fastload():
    # An extra of `fastload` (not `torch-fastload`), or that bare name after pip install (`fastload/` is a path).
    extra = re.compile(r"(?<![\w-])fastload\[")
    bare = re.compile(r"pip3? install (?:-\S+ )*['\"]?fastload(?![\w./-])|fastload-[<]")  # or a placeholder
    found = []
    for f in _repo_text_files():
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            if extra.search(line) or bare.search(line):
                found.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == [], "install commands that would install the index's unrelated `fastload`:\n" + "\n".join(found)


def test_no_dependency_names_a_pil():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    named = [d for d in project["dependencies"] if re.match(r"pillow", d, re.I)]
    assert named == [], f"a PIL by name replaces the environment's other one: {named}"
    for extra, deps in project["optional-dependencies"].items():
        if extra != "pillow":
            assert not [d for d in deps if re.match(r"pillow", d, re.I)], extra


# PIL made unimportable in the child (``sys.modules["PIL"] = None``: ``import PIL`` raises ModuleNotFoundError,
# as where no Pillow is installed). Everything runs in-process (workers=0, num_workers=0).
NO_PIL = textwrap.dedent("""
    import sys
    sys.modules["PIL"] = None
    from pathlib import Path
    import fastload
    from fastload import transforms as T

    root = Path({root!r})
    fastload.pack(root / "src", root / "ds", workers=0)  # JPEGs kept as they are: no PIL needed
    ds = fastload.open(root / "ds", transforms={{"image": [T.RandomResizedCrop(32), T.RandomHorizontalFlip()]}})
    image, label = ds[0]
    assert tuple(image.shape) == (3, 32, 32), image.shape
    seen = [labels.tolist() for _, labels in fastload.DataLoader(ds, batch_size=2, num_workers=0)]
    assert sorted(sum(seen, [])) == [0, 0, 0, 1, 1, 1], seen

    def refused(what, fn):
        try:
            fn()
        except ImportError as e:
            print(what, "|", e)
        else:
            raise SystemExit(what + " ran without PIL")

    refused("pack-png", lambda: fastload.pack(root / "png", root / "from_png", workers=0))  # decoded to re-encode
    # not one bad sample to skip: every non-JPEG would be
    refused("pack-png-skip-bad", lambda: fastload.pack(root / "png", root / "skip", workers=0, skip_bad=True))
    refused("pack-png-workers", lambda: fastload.pack(root / "png", root / "workers", workers=2, skip_bad=True))
    rot = fastload.open(root / "ds", transforms={{"image": [T.RandomResizedCrop(32), T.RandomRotation(10)]}})
    refused("reference-engine", lambda: rot[0])
    print("no PIL module", not [m for m in sys.modules if m.startswith("PIL.")])
""")


def test_fastload_imports_packs_jpegs_and_loads_without_any_pil(tmp_path):
    make_image_folder(tmp_path / "src", classes=2, per_class=3)  # here, with PIL
    (tmp_path / "png" / "c0").mkdir(parents=True)
    Image.new("RGB", (30, 20), (10, 200, 30)).save(tmp_path / "png" / "c0" / "a.png")
    code = NO_PIL.format(root=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    lines = dict(line.split(" | ", 1) for line in out.stdout.splitlines() if " | " in line)
    assert set(lines) == {"pack-png", "pack-png-skip-bad", "pack-png-workers", "reference-engine"}, out.stdout
    for what, message in lines.items():
        for words in ("needs PIL", "`pip install pillow`", "pip install 'torch-fastload[pillow]'", "pillow-simd"):
            assert words in message, (what, words, message)
    assert "no PIL module True" in out.stdout  # nothing imported a part of PIL behind the block


@pytest.mark.parametrize("what", ["apply_pil", "packing"])
def test_the_pil_hint_names_what_needed_it(monkeypatch, what):
    from fastload._install import pil

    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match=rf"^{what} needs PIL, from Pillow or Pillow-SIMD .*ModuleNotFoundError"):
        pil(what)
