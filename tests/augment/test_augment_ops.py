"""The augmentation's operations are one list on each side, held against each other when the native engine is
imported: Python's registry (``_augment/ops.py`` lists the modules that define them) and the C++ core's
(csrc/augment.h ``FASTLOAD_AUG_OPS``, exported by name as ``_C.AUGMENT_OPS``)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from fastload import _C
from fastload._augment import engine_native, ops
from fastload._augment.engine_native import NATIVE_OPS, check_native_ops
from fastload._augment.plan import OPS, OpDef

AUGMENT = Path(engine_native.__file__).parent


def test_python_and_native_operations_are_the_same_list():
    assert set(OPS) == set(_C.AUGMENT_OPS), (f"Python only: {sorted(set(OPS) - set(_C.AUGMENT_OPS))}, "
                                              f"native only: {sorted(set(_C.AUGMENT_OPS) - set(OPS))}")
    assert NATIVE_OPS == dict(_C.AUGMENT_OPS)
    assert sorted(NATIVE_OPS.values()) == list(range(len(NATIVE_OPS)))
    assert ops.OPS is OPS and len(OPS) >= 14


def _extra(name: str, columns: dict | None = None) -> OpDef:
    return OpDef(name, columns or {}, pil=lambda img, p: img, torch=lambda x, p: x)


@pytest.mark.parametrize("python, native, params, message", [
    ({"test_only": _extra("test_only")}, {}, 4, "defined in Python .*with no native kernel: test_only"),
    ({}, {"test_native": 14}, 4, "native kernels that no Python module defines: test_native"),
    ({}, {}, 5, "the native rows have 5 parameter slots"),
    # an operation on both sides whose columns its native row does not place: its parameters would be lost
    ({"invert": _extra("invert", {"level": ("float64", ())})}, {}, 4,
     r"invert: its plan columns are \['level'\], its native row layout \(_LAYOUT\) places \[\]"),
    ({"erase": _extra("erase", {"box": ("int64", (5,)), "value": ("float64", (3,))})}, {}, 4,
     r"erase: column box \(5 values from slot 0\) overflows"),
])
def test_the_check_names_each_disagreement(python, native, params, message):
    python_ops = {k: v for k, v in OPS.items() if k not in python} | python
    native_ops = dict(NATIVE_OPS) | native
    with pytest.raises(RuntimeError, match=message):
        check_native_ops(python_ops, native_ops, params)
    check_native_ops(OPS, NATIVE_OPS, _C.AUGMENT_PARAMS)  # the real lists agree


def test_importing_the_native_engine_refuses_a_python_operation_without_a_native_kernel(monkeypatch):
    """What a new define_op without its C++ line does: the engine's import fails, naming it."""
    monkeypatch.setitem(OPS, "test_no_kernel", _extra("test_no_kernel"))
    spec = importlib.util.spec_from_file_location("fastload._augment._engine_native_again", engine_native.__file__)
    module = importlib.util.module_from_spec(spec)
    with pytest.raises(RuntimeError, match="with no native kernel: test_no_kernel.*FASTLOAD_AUG_OPS"):
        spec.loader.exec_module(module)


def test_every_module_that_defines_operations_is_listed_in_ops():
    defining = set()
    for path in sorted(AUGMENT.glob("*.py")):
        for node in ast.parse(path.read_text()).body:  # module level: what runs when it is imported
            call = node.value if isinstance(node, (ast.Expr, ast.Assign)) else None
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "define_op":
                defining.add(path.stem)
    assert defining >= {"color", "tone", "filters"}
    assert {m.__name__.rpartition(".")[2] for m in ops.MODULES} == defining


def test_the_engines_read_the_registry_from_ops():
    """``plan.OPS`` alone may lack operations whose module nobody imported yet; ``ops.OPS`` has them all."""
    readers = []
    for path in sorted(AUGMENT.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and any(a.name == "OPS" for a in node.names):
                readers.append((path.stem, node.module))
    assert ("engine_native", "ops") in readers and ("engine_pil", "ops") in readers
    assert [r for r in readers if r[1] != "ops" and r[0] != "ops"] == []
