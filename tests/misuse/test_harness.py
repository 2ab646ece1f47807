"""The harness itself can fail: a deleted, created or changed file, an internal error, a missing word."""

from __future__ import annotations

import pytest

from .conftest import unchanged, user_error


def test_unchanged_sees_deletion_creation_and_change(tmp_path):
    (tmp_path / "a").write_text("1")
    for act in (lambda: (tmp_path / "a").unlink(), lambda: (tmp_path / "b").write_text("x"),
                lambda: (tmp_path / "a").write_text("2")):
        with pytest.raises(pytest.fail.Exception):
            with unchanged(tmp_path):
                act()
        (tmp_path / "a").write_text("1")
        (tmp_path / "b").unlink(missing_ok=True)
    with unchanged(tmp_path):
        (tmp_path / "a").read_text()


def test_user_error_refuses_internal_errors_and_vague_messages():
    with pytest.raises(pytest.fail.Exception):
        with user_error(Exception):
            raise KeyError("x")
    with pytest.raises(pytest.fail.Exception):
        with user_error(ValueError, "batch_size"):
            raise ValueError("bad value")
    with user_error(ValueError, "batch_size", "positive"):
        raise ValueError("batch_size=-1 should be a positive integer")
