"""formats/registry.py: one Format object per on-disk layout, listed once; nothing outside a format's own
module branches on a format's name."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from click.testing import CliRunner

import fastload
from fastload.cli import main
from fastload.formats._format import Format
from fastload.formats.registry import FORMATS, format_named

ROOT = Path(__file__).resolve().parents[2] / "fastload"
# Where a format's name may still be compared, and why. A format's own module knows its name; the rest ask
# the registry.
OWN = {"formats/shards.py", "formats/lmdb.py"}
ALLOWED: dict[str, str] = {}
# the fast path's split of an order is also called "shards" (whole shards per rank): not a format
NOT_A_FORMAT = {"split"}


def test_every_format_implements_the_whole_interface():
    required = [n for n, fn in vars(Format).items()
                if inspect.isfunction(fn) and "NotImplementedError" in inspect.getsource(fn)]
    assert {"detect", "manifest", "segments", "verify", "describe", "sink", "owns"} <= set(required)
    for name, f in FORMATS.items():
        assert f.name == name and isinstance(f, Format) and f.marker
        missing = [m for m in required if getattr(type(f), m) is getattr(Format, m)
                   and not (m in ("array_sink", "array_rows") and not f.arrays)]
        assert missing == [], f"format {name!r} lacks {missing}"


def test_the_names_come_from_the_registry():
    assert list(FORMATS) == ["shards", "lmdb"]
    help_text = CliRunner().invoke(main, ["pack", "--help"]).output
    assert "[" + "|".join(FORMATS) + "]" in help_text.replace("\n", "").replace(" ", "")
    with pytest.raises(ValueError, match="'shards', 'lmdb'"):
        format_named("zip")
    with pytest.raises(ValueError, match="format='zip' should be one of 'shards', 'lmdb'"):
        fastload.pack([1, 2], "/nonexistent/never-written", format="zip")


def _format_branches(path: Path, names: set[str], text: str | None = None) -> list[str]:
    """Comparisons with a format's name (``layout == "lmdb"``, ``fmt in ("shards", "lmdb")``) and lists of
    every format's name (``click.Choice(["shards", "lmdb"])``) in ``path``."""
    src = path.read_text() if text is None else text
    found = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)) and len(node.elts) > 1 and all(
                isinstance(e, ast.Constant) and e.value in names for e in node.elts):
            found.append(f"{path.name}:{node.lineno} lists the formats")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            consts = [s for s in sides if isinstance(s, ast.Constant) and s.value in names]
            other = " ".join(ast.unparse(s) for s in sides if not isinstance(s, ast.Constant))
            if consts and not any(w in other for w in NOT_A_FORMAT):
                found.append(f"{path.name}:{node.lineno} compares with {consts[0].value!r}: {ast.unparse(node)}")
    return found


def test_nothing_outside_a_formats_module_branches_on_its_name():
    found = []
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if rel not in OWN and rel not in ALLOWED:
            found += _format_branches(p, set(FORMATS))
    assert found == []


@pytest.mark.parametrize("line", ['if manifest.layout == "lmdb": pass', 'ok = format not in ("shards", "lmdb")',
                                  'c = click.Choice(["shards", "lmdb"])', 'w = "x" if self.format == "shards" else "y"'])
def test_the_branch_check_catches_each_form(line):
    assert _format_branches(ROOT / "probe.py", set(FORMATS), line)
    assert not _format_branches(ROOT / "probe.py", set(FORMATS), 'if split == "shards": pass')
