"""fastload's modules import one another without a loop, counting imports inside functions too.

A function-local import that closes a loop still ties the two modules together (each needs the other to
be read, tested or moved), and it hides the loop until the function runs. The graph is read from the
sources with ``ast``; importing ``fastload.a.b`` from outside package ``fastload.a`` also counts as
importing ``fastload.a`` (its ``__init__`` runs first).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "fastload"

# Layers: who must never import whom, directly or through other modules (each side a module or a package, whose
# modules count too), with where the piece lives that once made such an import.
NEVER: dict[tuple[str, str], str] = {
    ("fastload.fields", "fastload._augment"):
        "a field kind knows no engine: the augmentation moves a mask (_augment/masks.py), handed to fields/mask.py "
        "as ReadContext.moved_mask (ds[i]) and Batcher.move_masks (a batch)",
    ("fastload._augment", "fastload._generic.workers"):
        "the generic path's main side: what both pools of worker processes share (death_message, worker_start, "
        "HoldCtrlC) is _generic/worker_proc.py's",
    ("fastload._fill", "fastload.fast"):
        "the chain drives the batcher: a packed batch (PackJob, cu_seqlens) is _transforms/sequences.py's, and the "
        "chain and ds.__getitems__ make the Collator (fast/collate.py), not the batcher",
    # the folders of the top level (issue 31): each serves the one above it, never the other way
    ("fastload._front", "fastload._tools"):
        "the tools (doctor, bench) drive a loader; the loader never needs them",
    ("fastload.fast", "fastload._front"):
        "the loader's front builds the chain: what a stage needs is handed to it (fast/chain.py's builder)",
    ("fastload._fill", "fastload._front"):
        "the fill serves the chain and ds.__getitems__ alike; the front hands it the dataset",
    ("fastload._generic", "fastload._front"):
        "the generic path's workers run any Dataset; the loader's front starts them",
    ("fastload._transforms", "fastload._front"):
        "transform declarations are checked at open by the front, never the other way",
}

# Loops in other helpers' modules, each named with why it is allowed for now (none in the write wing or
# formats/). Kept exact: a loop that goes away must leave this list too.
ALLOWED: dict[frozenset, str] = {}


def module_name(path: Path) -> str:
    parts = ["fastload", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, known: set[str], text: str | None = None) -> set[str]:
    """The fastload modules (and packages) the module at ``path`` imports anywhere in its body."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text() if text is None else text)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from . import lmdb` names a submodule; `from .x import name` names module x
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        for t in targets:
            if not t.startswith("fastload.") or t not in known:
                continue  # outside fastload, or fastload itself (the public API, imported lazily by design)
            found.add(t)
            parent = t.rpartition(".")[0]
            while parent != "fastload":  # packages whose __init__ runs first, unless we are inside them
                if not (me == parent or me.startswith(parent + ".")):
                    found.add(parent)
                parent = parent.rpartition(".")[0]
    found.discard(me)
    return found


def graph(overrides: dict[str, str] | None = None) -> dict[str, set[str]]:
    paths = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
    known = set(paths)
    return {m: imports_of(p, known, (overrides or {}).get(m)) for m, p in paths.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def within(module: str, unit: str) -> bool:
    return module == unit or module.startswith(unit + ".")


def layer_breaks(g: dict[str, set[str]]) -> list[str]:
    """Each ``NEVER`` pair that an import path of ``g`` connects, as that path (the shortest), with the reason."""
    out = []
    for (upper, lower), why in NEVER.items():
        starts = sorted(m for m in g if within(m, upper))
        came_from: dict[str, str | None] = dict.fromkeys(starts)
        queue = list(starts)
        while queue:  # breadth first: the shortest path to the first module of ``lower`` reached
            m = queue.pop(0)
            if within(m, lower):
                path = [m]
                while came_from[path[-1]] is not None:
                    path.append(came_from[path[-1]])
                out.append(" -> ".join(reversed(path)) + f": {why}")
                break
            for n in sorted(g.get(m, ())):
                if n not in came_from and not within(n, upper):
                    came_from[n] = m
                    queue.append(n)
    return out


def test_no_import_loop_in_fastload():
    g = graph()
    assert len(g) > 50 and "fastload.pack._router" in g["fastload.pack"]
    found = [c for c in cycles(g) if frozenset(c) not in ALLOWED]
    assert found == [], "import loops (a function-local import counts too):\n" + "\n".join(" <-> ".join(c) for c in found)
    stale = [sorted(c) for c in ALLOWED if frozenset(c) not in {frozenset(x) for x in cycles(g)}]
    assert stale == [], f"allowed loops that are gone: remove them from ALLOWED: {stale}"


@pytest.mark.parametrize("module, line", [
    ("fastload.pack._parts", "def f():\n    from ._router import pack\n"),  # the old Ray task's way back
    ("fastload.formats.shards", "from ..pack._sinks import sink_for\n"),
    ("fastload.sources.imagefolder", "from ..pack._encode import FileImage\n"),  # through pack/__init__
])
def test_the_loop_check_catches_a_function_local_or_package_loop(module, line):
    path = ROOT.joinpath(*module.split(".")[1:]).with_suffix(".py")
    assert cycles(graph({module: path.read_text() + line}))



def test_imports_point_down_the_layers():
    g = graph()
    assert "fastload._augment.masks" in g and "fastload._fill.batcher" in g and "fastload.fields.mask" in g
    assert layer_breaks(g) == []


@pytest.mark.parametrize("module, line, pair", [
    # each of issue 31's three contradictions, put back
    ("fastload.fields.mask", "from .._augment.type_fill import MASK_FILL\n", 0),
    ("fastload.fields.mask", "def f():\n    from .._augment.engine_pil import run_pil_mask\n", 0),
    ("fastload._augment.fallback_workers", "from .._generic.workers import _death_message\n", 1),
    ("fastload._fill.batcher", "from ..fast.collate import Collator\n", 2),
    ("fastload._fill.batcher", "from ..fast.packing import PackJob, cu_seqlens\n", 2),
    # the top level's folders, one per rule
    ("fastload._front.loader", "def f():\n    from .._tools.doctor import doctor\n", 3),
    ("fastload.fast.chain", "from .._front.dropin import warn_refused\n", 4),
    ("fastload._fill.images", "from .._front.stats import LoaderStats\n", 5),
    ("fastload._generic.workers", "from .._front.loader import DataLoader\n", 6),
    ("fastload._transforms.size_check", "from .._front.dataset import Dataset\n", 7),
    # the same, one module further: a module that fields/ imports, importing the augmentation
    ("fastload._native", "from ._augment import plan\n", 0),
])
def test_the_layer_check_catches_an_import_against_the_layers(module, line, pair):
    path = ROOT.joinpath(*module.split(".")[1:]).with_suffix(".py")
    found = layer_breaks(graph({module: path.read_text() + line}))
    assert [b for b in found if b.endswith(list(NEVER.values())[pair])], found
