"""_errors: one exception family, and ``where`` that names the bad record's place in every message."""

from __future__ import annotations

import pytest

import fastload
from fastload._errors import where


def test_where_names_dataset_shard_sample_and_field_in_that_order():
    assert where("/data/train", "shard-00003.bin", 17, "image") == \
        "dataset '/data/train', shard 'shard-00003.bin', sample 17, field 'image'"


@pytest.mark.parametrize("kw, text", [
    ({}, ""),
    ({"sample": 0}, "sample 0"),  # sample 0 and shard 0 are places, not "unknown"
    ({"shard": 0, "field": "label"}, "shard '0', field 'label'"),
    ({"dataset": "d", "sample": 5}, "dataset 'd', sample 5"),
    ({"field": ""}, "field ''"),
], ids=["nothing", "sample 0", "shard 0 and a field", "gap in the middle", "empty field name"])
def test_where_skips_only_what_is_none(kw, text):
    assert where(**kw) == text


@pytest.mark.parametrize("name, bases", [
    ("FormatError", (ValueError,)),
    ("VersionError", (fastload.FormatError, ValueError)),
    ("RemoteError", (OSError,)),
    ("SchemaError", (ValueError,)),
    ("SourceError", ()),
    ("DecodeError", (ValueError,)),
])
def test_every_error_is_a_fastload_error_and_the_builtin_callers_already_catch(name, bases):
    """``except ValueError`` / ``except OSError`` in user code keeps working; ``except FastloadError`` catches all."""
    cls = getattr(fastload, name)
    assert issubclass(cls, fastload.FastloadError) and issubclass(cls, Exception)
    for b in bases:
        assert issubclass(cls, b), f"{name} should be a {b.__name__}"


def test_fast_path_warning_is_a_user_warning_apart_from_the_errors():
    assert issubclass(fastload.FastPathWarning, UserWarning)
    assert not issubclass(fastload.FastPathWarning, fastload.FastloadError)
