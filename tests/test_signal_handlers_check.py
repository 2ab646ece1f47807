"""conftest's check on signal handlers can fail: a test, and a module-scoped fixture, that leave a handler
installed in the pytest process are reported (ray.init()'s SIGTERM handler was left in place for the rest of
the suite, and a pack's forked workers inherited it); one that puts it back passes."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

LEAKS = """
import signal

import pytest

from conftest import signal_handlers_kept


def handler(*_):
    pass


def test_leaves_sigusr1():
    signal.signal(signal.SIGUSR1, handler)


def test_after_it_sees_the_old_handler():
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_puts_sigterm_back():
    with signal_handlers_kept():
        signal.signal(signal.SIGTERM, handler)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.fixture(scope="module")
def cluster():
    signal.signal(signal.SIGUSR2, handler)  # as ray.init() does for SIGTERM
    yield


def test_uses_a_module_fixture_that_leaves_sigusr2(cluster):
    pass


def test_the_same_module_fixture_again(cluster):
    pass
"""


def test_a_handler_left_by_a_test_or_a_module_fixture_fails_it(tmp_path):
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_leaks.py").write_text(textwrap.dedent(LEAKS))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "test_leaks.py"], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert "5 passed, 2 errors" in out, out
    assert "ERROR test_leaks.py::test_leaves_sigusr1" in out, out
    assert "test_leaks.py::test_leaves_sigusr1 left signal handlers changed (before -> after): {'SIGUSR1'" in out
    # reported once its module is done, on the teardown of the module's last test
    assert "ERROR test_leaks.py::test_the_same_module_fixture_again" in out, out
    assert "test_leaks.py (a module- or class-scoped fixture) left signal handlers changed" in out
    assert "'SIGUSR2'" in out and "SIGTERM" not in out.split("short test summary")[-1]
