"""Every code block of the documentation runs: README.md and docs/**/*.md.

Each page runs in a fresh folder that holds ``data/train``, a small ImageFolder (two classes of JPEGs) built at
test time, with ``$FASTLOAD_CACHE_DIR`` inside it. A page's ```python blocks run in order in one namespace (a
block may use what an earlier one defined); ```sh/```bash blocks run with bash (``set -e``), ``fastload`` being
this checkout's command line. A block that needs what a test has not (a GPU, the network, which includes
installing packages) is marked on the line before its fence; a marked block is only parsed (python), except that
``gpu`` blocks run where CUDA is available:

    <!-- docs-test: gpu -->
    <!-- docs-test: network -->

A block whose data only a dedicated test can build is marked with that test, which must read this page:

    <!-- docs-test: ran-by tests/sources/test_docs_bringing_data.py -->

```text blocks are output and are not run; ```json blocks must parse; ```diff blocks run as the script after
the diff (context and added lines). Any other fence (or one with no language) fails, so that no code goes
unchecked by accident.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from conftest import make_image_folder

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKERS = ("gpu", "network")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
MARK = re.compile(r"<!--\s*docs-test:\s*([\w-]+(?: [\w./-]+)?)\s*-->\s*$")
RUN = {"python", "sh", "bash", "diff"}
NOT_RUN = {"text", "json"}


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    body: str
    mark: str | None

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line} ({self.lang})"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.search(before)
        body = "\n".join(s[len(m["indent"]):] for s in m["body"].splitlines())
        out.append(Block(page, line, m["lang"], body, mark.group(1) if mark else None))
    return out


def diff_after(body: str) -> str:
    return "\n".join(line[1:] for line in body.splitlines() if line[:1] in (" ", "+"))


def fastload_command(bin_dir: Path) -> None:
    """``fastload`` on PATH, running this checkout (not whatever an installed entry point points to)."""
    bin_dir.mkdir()
    exe = bin_dir / "fastload"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import sys; from fastload.cli import main; "
                   f"sys.argv[0] = \"fastload\"; main()' \"$@\"\n")
    exe.chmod(0o755)


@pytest.fixture
def docs_dir(tmp_path, monkeypatch):
    work = tmp_path / "work"
    make_image_folder(work / "data" / "train", classes=2, per_class=40)
    fastload_command(tmp_path / "bin")
    monkeypatch.chdir(work)
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return work


def test_every_page_is_found_and_every_fence_is_known():
    assert (ROOT / "docs" / "index.md") in PAGES and len(PAGES) > 10
    for page in PAGES:
        for b in blocks(page):
            assert b.lang in RUN | NOT_RUN, f"{b}: fence language {b.lang!r}; use one of {sorted(RUN | NOT_RUN)}"
            if b.mark and b.mark.startswith("ran-by "):
                runner = ROOT / b.mark.split(" ", 1)[1]
                page_path = str(page.relative_to(ROOT))
                assert runner.is_file() and page_path.split("/")[-1] in runner.read_text(), \
                    f"{b}: {runner.relative_to(ROOT)} should exist and read {page_path}"
            else:
                assert b.mark is None or b.mark in MARKERS, f"{b}: unknown marker {b.mark!r}; known: {MARKERS}"
            assert not (b.mark and b.lang in NOT_RUN), f"{b}: a {b.lang} block is never run; drop the marker"
            if b.lang == "json":
                json.loads(b.body)
            if b.lang == "python" or (b.lang == "diff" and b.mark):
                ast.parse(b.body if b.lang == "python" else diff_after(b.body), str(b))  # marked ones too


@pytest.mark.parametrize("page", [p for p in PAGES if any(b.lang in RUN for b in blocks(p))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_run(page, docs_dir):
    namespace: dict = {"__name__": "__docs__"}
    cuda = torch.cuda.is_available()
    ran = 0
    for b in blocks(page):
        if b.lang not in RUN or (b.mark and not (b.mark == "gpu" and cuda)):
            continue
        if b.lang in ("python", "diff"):
            code = b.body if b.lang == "python" else diff_after(b.body)
            try:
                exec(compile(code, str(b), "exec"), namespace)
            except Exception as e:
                raise AssertionError(f"{b} failed: {type(e).__name__}: {e}") from e
        else:
            r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", b.body], capture_output=True, text=True,
                               timeout=240)
            assert r.returncode == 0, f"{b} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
        ran += 1
    if ran == 0:
        pytest.skip(f"{page.relative_to(ROOT)}: no block runs without a GPU or the network")


def _resolve(path: str):
    import importlib

    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def test_the_api_reference_covers_the_public_api():
    """docs/api.md renders (mkdocstrings' ``::: path``) every name of fastload.__all__ and of
    fastload.transforms.__all__, so a new public name cannot go undocumented."""
    import fastload
    import fastload.transforms

    shown = {id(_resolve(p)) for p in re.findall(r"^::: ([\w.]+)", (ROOT / "docs" / "api.md").read_text(), re.M)}
    public = [(f"fastload.{n}", getattr(fastload, n)) for n in fastload.__all__ if n != "__version__"]
    public += [(f"fastload.transforms.{n}", getattr(fastload.transforms, n)) for n in fastload.transforms.__all__]
    missing = [name for name, obj in public if id(obj) not in shown]
    assert not missing, f"docs/api.md has no '::: ...' entry for {missing}"


def test_every_page_is_in_the_site_navigation():
    """mkdocs only notes (INFO, not a warning --strict fails on) a page left out of mkdocs.yml's nav."""
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[1]
    listed = set(re.findall(r":\s*([\w/.-]+\.md)\s*$", nav, re.M))
    pages = {str(p.relative_to(ROOT / "docs")) for p in PAGES if p.is_relative_to(ROOT / "docs")}
    assert pages == listed, f"in docs/ but not in the nav: {sorted(pages - listed)}; in the nav only: " \
                            f"{sorted(listed - pages)}"


def test_the_makefile_installs_each_extras_requirements():
    """scripts/extra_requirements.py prints an extra's requirements (what `make lint` / `make docs` install)."""
    script = [sys.executable, str(ROOT / "scripts" / "extra_requirements.py")]
    lint = subprocess.run(script + ["lint"], capture_output=True, text=True, check=True).stdout.split()
    assert any(r.startswith("ruff==") for r in lint) and any(r.startswith("mypy==") for r in lint)
    docs = subprocess.run(script + ["docs"], capture_output=True, text=True, check=True).stdout.split()
    assert any(r.startswith("mkdocstrings") for r in docs)
    bad = subprocess.run(script + ["nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "no extra 'nope'" in bad.stderr and "lint" in bad.stderr


def _warning_openings() -> list[tuple[str, int, str]]:
    """(file, line, the message's first words) of every warnings.warn / warn_once / log.warning call in fastload/
    whose message starts with literal text (up to its first placeholder)."""
    found = []
    for path in sorted((ROOT / "fastload").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            owner = fn.value.id if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) else None
            at = {"warn": 0 if owner == "warnings" else None, "warn_once": 1,
                  "warning": 0 if owner in ("log", "logger") else None}.get(name or "")
            if at is None or len(node.args) <= at:
                continue
            msg = node.args[at]
            while isinstance(msg, ast.BinOp):
                msg = msg.left
            if isinstance(msg, ast.JoinedStr):
                msg = msg.values[0] if msg.values else None
            if not (isinstance(msg, ast.Constant) and isinstance(msg.value, str)):
                continue
            text = re.split(r"[{%]", msg.value.removeprefix("fastload: "), maxsplit=1)[0]
            opening = " ".join(text.split()[:4]).rstrip("'\"(")
            if len(opening) >= 12:  # shorter openings ("process", "decoder=") name nothing to look for
                found.append((str(path.relative_to(ROOT)), node.lineno, opening))
    return found


def test_troubleshooting_lists_every_warning():
    """docs/guide/troubleshooting.md names each warning the code gives, by the words it starts with."""
    page = " ".join((ROOT / "docs" / "guide" / "troubleshooting.md").read_text().split())
    openings = _warning_openings()
    assert len(openings) > 15
    missing = [f"{f}:{line}: {o!r}" for f, line, o in openings if o not in page]
    assert not missing, "warnings the troubleshooting page does not list:\n" + "\n".join(missing)
