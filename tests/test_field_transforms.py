"""_field_transforms: ``transforms=`` resolved against the schema (what it returns, what it refuses) and the
up-front length check. The user-facing refusals through ``fastload.open`` are in misuse/test_open_transforms.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from fastload import transforms as T
from fastload._transforms.fields import check_lengths, resolve
from fastload._schema import Field, Schema
from fastload.transforms import ImagePipeline

SCHEMA = Schema([Field.image("photo"), Field.image("mask"), Field.int("label"),
                 Field.ndarray("tokens", "int64", (None,)), Field.ndarray("audio", "float32", (None,)),
                 Field.ndarray("box", "float32", (4,))])


def test_none_resolves_to_nothing():
    assert resolve(None, SCHEMA) == ({}, {}, {})


def test_resolve_splits_image_pipelines_and_sequence_transforms_by_field():
    pad = T.Pad(16)
    given = {"photo": [T.RandomResizedCrop(8)], "mask": None, "tokens": pad}
    as_given, pipelines, sequences = resolve(given, SCHEMA)
    assert as_given == given and as_given is not given  # a copy: the user's dict is theirs to change
    assert list(pipelines) == ["photo"] and isinstance(pipelines["photo"], ImagePipeline)
    assert sequences == {"tokens": pad}


def test_pad_on_several_fields_is_fine_but_only_one_can_be_bucketed_or_packed():
    _, _, sequences = resolve({"tokens": T.Pad(8), "audio": T.Bucket([4, 8])}, SCHEMA)
    assert list(sequences) == ["tokens", "audio"]
    with pytest.raises(ValueError, match=r"at most one field can be bucketed or packed .*\['tokens', 'audio'\]; "
                                         r"pad the others with Pad"):
        resolve({"tokens": T.Bucket([4, 8]), "audio": T.Bucket([2, 8])}, SCHEMA)


def test_a_fixed_size_ndarray_takes_no_transform_and_the_message_names_those_that_do():
    with pytest.raises(ValueError) as e:
        resolve({"box": T.Pad(4)}, SCHEMA)
    msg = str(e.value)
    assert "field 'box', of kind ndarray" in msg and "only image fields" in msg
    assert "those fields here: ['photo', 'mask', 'tokens', 'audio']" in msg


def test_not_a_dict_names_the_first_image_field():
    with pytest.raises(TypeError, match=r"This dataset's image field\(s\): \['photo', 'mask'\]: pass "
                                        r"transforms=\{'photo': <your transforms>\}"):
        resolve([T.RandomResizedCrop(8)], SCHEMA)


def dataset(lengths, spec, remote=False):
    """What check_lengths reads of a dataset: ``remote``, ``sequences`` and the shape column."""
    reader = SimpleNamespace(first_dims=lambda name: np.asarray(lengths[name]))
    return SimpleNamespace(remote=remote, sequences=spec, reader=reader)


def test_check_lengths_refuses_a_too_long_sample_before_any_batch():
    with pytest.raises(ValueError, match="field 'tokens': 1 of 3 samples are longer than"):
        check_lengths(dataset({"tokens": [3, 9, 4]}, {"tokens": T.Pad(8)}))
    with pytest.raises(ValueError, match="field 'audio'"):
        check_lengths(dataset({"audio": [3, 9]}, {"audio": T.Bucket([4, 8])}))
    check_lengths(dataset({"tokens": [3, 8]}, {"tokens": T.Pad(8)}))  # exactly the length fits


def test_check_lengths_leaves_truncation_packing_and_remote_datasets_alone():
    """truncate=True cuts, PackSequences splits long samples, and a remote dataset would have to download every
    shard: none of them is read here."""
    def unread(name):
        raise AssertionError(f"the shape column of {name} should not be read")

    for spec, remote in [(T.Pad(2, truncate=True), False), (T.Bucket([2], truncate=True), False),
                         (T.PackSequences(2), False), (T.Pad(2), True)]:
        ds = SimpleNamespace(remote=remote, sequences={"tokens": spec}, reader=SimpleNamespace(first_dims=unread))
        check_lengths(ds)
