"""The misuse suite's harness: a user's mistake must give a clear error and change nothing on disk.

``unchanged(*roots)`` hashes every file under the given folders (names, sizes, contents, symlinks) before
and after the block and fails on any difference, so a test shows that a refused call deleted, truncated or
rewrote nothing. ``user_error(exc, ...)`` checks what the user reads: the exception type (never an
internal one such as AttributeError or KeyError), and the words it must contain (the argument, file,
row or field named, and what was expected). ``cli_error(result, ...)`` does the same for a click run:
a non-zero exit, the words, and no Python traceback.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

import pytest

INTERNAL = (AttributeError, KeyError, IndexError, AssertionError, NameError, UnboundLocalError, RecursionError)


def tree_digest(*roots: Path) -> dict[str, str]:
    """Every entry under ``roots`` by path: a content hash for files, the target for links, '' for folders."""
    out: dict[str, str] = {}
    for root in roots:
        root = Path(root)
        if not root.exists():
            out[str(root)] = "<missing>"
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            for d in dirnames:
                p = Path(dirpath, d)
                out[str(p)] = "link:" + os.readlink(p) if p.is_symlink() else "dir"
            for f in filenames:
                p = Path(dirpath, f)
                if p.is_symlink():
                    out[str(p)] = "link:" + os.readlink(p)
                else:
                    out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@contextlib.contextmanager
def unchanged(*roots: Path):
    """Fails when anything under ``roots`` was created, deleted or changed inside the block."""
    before = tree_digest(*roots)
    yield
    after = tree_digest(*roots)
    if before != after:
        gone = sorted(set(before) - set(after))
        new = sorted(set(after) - set(before))
        changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
        pytest.fail(f"the refused call changed the disk: deleted {gone[:5]}, created {new[:5]}, changed {changed[:5]}")


@contextlib.contextmanager
def user_error(exc: type[BaseException] | tuple = Exception, *words: str):
    """The block must raise ``exc`` (not an internal error) whose message contains each of ``words``."""
    with pytest.raises(exc) as info:
        yield info
    if isinstance(info.value, INTERNAL):
        pytest.fail(f"an internal error reached the user: {type(info.value).__name__}: {info.value}")
    msg = str(info.value)
    missing = [w for w in words if w.lower() not in msg.lower()]
    if missing:
        pytest.fail(f"the error does not say {missing}: {type(info.value).__name__}: {msg}")


def cli_error(result, *words: str) -> str:
    """A click ``CliRunner`` result (or anything with ``exit_code`` and ``output``) of a refused command."""
    out = result.output + (getattr(result, "stderr", "") if getattr(result, "stderr_bytes", None) else "")
    assert result.exit_code != 0, f"exit 0 for a refused command: {out}"
    assert "Traceback" not in out, f"a traceback reached the user:\n{out}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        pytest.fail(f"an exception escaped the CLI: {type(result.exception).__name__}: {result.exception}")
    missing = [w for w in words if w.lower() not in out.lower()]
    assert not missing, f"the message does not say {missing}:\n{out}"
    return out
