"""The reading API under a user's mistakes: ``fastload.open`` (paths, manifests, ``transforms=``, options), the
transform constructors, and ``ds[i]``. Each case: an error that names the argument, file or field and what
was expected, never an internal exception, and (where files are involved) nothing changed on disk.

A case that fails in a file this suite's author does not own is ``xfail(strict=True)`` with that file in
the reason: it turns into a failure the day it is fixed, so the mark is removed with the fix.
"""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest
import torch

import fastload
from fastload import transforms as T

from conftest import jpeg_bytes, make_image_folder, packed_image_folder

from .conftest import unchanged, user_error


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """A packed ImageFolder: fields image, label."""
    return packed_image_folder(tmp_path_factory.mktemp("open_misuse"))


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    """Variable-length tokens (lengths 1..20) and a label."""
    rng = np.random.default_rng(0)
    samples = [{"tokens": np.arange(int(n), dtype=np.int32), "label": i} for i, n in enumerate(rng.integers(1, 21, 24))]
    dest = tmp_path_factory.mktemp("open_misuse_tokens") / "ds"
    fastload.pack(samples, dest, workers=0, schema={"tokens": fastload.Field.ndarray("tokens", np.int32, (None,))})
    return dest


# -- the path ------------------------------------------------------------------------------------

def test_missing_path(tmp_path):
    with unchanged(tmp_path), user_error(Exception, "nope", "does not exist"):
        fastload.open(tmp_path / "nope")


def test_a_file_that_is_not_a_dataset(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with unchanged(tmp_path), user_error(fastload.FormatError, "notes.txt", "not a fastload dataset", "manifest.json"):
        fastload.open(tmp_path / "notes.txt")


def test_an_unpacked_folder_says_to_pack_it(tmp_path):
    """An ImageFolder is packed into the cache (test_folder_cache.py); a folder of loose files is not one, and
    the error gives the ``fastload pack`` command for it."""
    src = tmp_path / "photos"
    src.mkdir()
    (src / "a.jpg").write_bytes(jpeg_bytes(16, 16))
    with unchanged(tmp_path), user_error(fastload.FormatError, "photos", "fastload pack"):
        fastload.open(src, cache_dir=tmp_path / "cache")


def _damage(doc: dict):
    bad = dict(doc)
    del bad["num_samples"]
    return bad


DAMAGE = {
    "truncated": (lambda text, doc: text[: len(text) // 2], ["manifest", "not valid JSON"]),
    "empty": (lambda text, doc: "", ["manifest", "not valid JSON"]),
    "not an object": (lambda text, doc: "[1, 2]", ["not a fastload manifest", '"format": "fastload"']),
    "wrong magic": (lambda text, doc: json.dumps({**doc, "format": "webdataset"}), ["not a fastload manifest"]),
    "newer version": (lambda text, doc: json.dumps({**doc, "version": 99}), ["version 99", "upgrade fastload"]),
    "no num_samples": (lambda text, doc: json.dumps(_damage(doc)), ["num_samples"]),
    "wrong count": (lambda text, doc: json.dumps({**doc, "num_samples": 13}), ["num_samples", "13", "12"]),
    "unknown kind": (lambda text, doc: json.dumps({**doc, "schema": [{"name": "image", "kind": "video"}]}),
                     ["field 'image'", "video", "image, int, float"]),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_manifest(images, tmp_path, case):
    ds = tmp_path / "ds"
    shutil.copytree(images, ds)
    text = (ds / "manifest.json").read_text()
    damage, words = DAMAGE[case]
    (ds / "manifest.json").write_text(damage(text, json.loads(text)))
    with unchanged(tmp_path), user_error(fastload.FormatError, str(ds), *words):
        fastload.open(ds)


# -- transforms= ---------------------------------------------------------------------------------

class _Foreign:
    """Stands in for torchvision's classes (not installed here): an object of another library."""

    __module__ = "torchvision.transforms.transforms"

    def __init__(self, *transforms):
        self.transforms = list(transforms)

    def __call__(self, x):
        return x


DICT_HINT = ("transforms must be a dict of field -> transforms", "transforms={'image': [T.RandomResizedCrop(224)",
             "image field(s): ['image']", "transforms={'image': <your transforms>}")


@pytest.mark.parametrize("given", [
    [T.RandomResizedCrop(8), T.RandomHorizontalFlip()],
    T.Compose([T.RandomResizedCrop(8)]),
    T.RandomResizedCrop(8),
    "RandomResizedCrop(8)",
], ids=["list", "Compose", "one transform", "str"])
def test_transforms_the_torchvision_way_is_refused_with_the_dict_to_write(images, given):
    """Issue 17, row 8: not ``TypeError: 'Compose' object is not iterable``, but the dict form, naming this
    dataset's image field. A plain list is refused rather than guessed to be the image's: a second image
    field (or a token field) would change what the guess means."""
    with unchanged(images), user_error(TypeError, *DICT_HINT):
        fastload.open(images, transforms=given)


def test_a_torchvision_compose_is_told_to_use_fastload_transforms(images):
    with unchanged(images), user_error(TypeError, *DICT_HINT, "Only fastload.transforms run", "RandomResizedCrop"):
        fastload.open(images, transforms=_Foreign(_Foreign()))


def test_a_foreign_callable_runs_per_sample_instead_of_being_refused(images):
    """Issue 21 item 4 (it was a TypeError before): a callable fastload does not know (here a torchvision
    class with no fastload equivalent) is run per sample after the native part, named by its class."""
    for given in ([_Foreign()], _Foreign(T.RandomResizedCrop(8))):
        with unchanged(images):
            ds = fastload.open(images, transforms={"image": given})
        (user,) = ds.pipelines["image"].fallback
        assert user.name == "torchvision.transforms.transforms._Foreign" and isinstance(user.fn, _Foreign)


def test_transforms_for_a_dataset_without_image_fields(tokens):
    with unchanged(tokens), user_error(TypeError, "must be a dict of field -> transforms",
                                       "those fields here: ['tokens']"):
        fastload.open(tokens, transforms=[T.Pad(4)])


@pytest.mark.parametrize("given, exc, words", [
    ({"imgae": [T.RandomResizedCrop(8)]}, ValueError,
     ["field 'imgae'", "does not have", "did you mean 'image'", "['image', 'label']"]),
    ({0: [T.RandomResizedCrop(8)]}, TypeError, ["keys are field names", "got 0", "['image']"]),
    ({"label": [T.RandomResizedCrop(8)]}, ValueError, ["field 'label'", "int", "only image fields", "['image']"]),
    ({"image": T.Pad(4)}, ValueError, ["transforms['image']", "Pad is for variable-length ndarray fields",
                                       "list of image transforms"]),
    ({"image": "RandomResizedCrop"}, TypeError, ["transforms['image']", "list of transforms", "got str"]),
    ({"image": [T.RandomResizedCrop(8), 224]}, TypeError, ["transforms['image']", "unsupported image transform 224"]),
    ({"image": [T.ToDtype(torch.float32, scale=True), T.RandomResizedCrop(8)]}, ValueError,
     ["transforms['image']", "ToDtype/Normalize must come after every geometric transform"]),
    ({"image": [T.RandomResizedCrop(8), T.ToDtype(torch.float32, scale=True), T.Normalize([0.5] * 2, [0.2] * 2)]},
     ValueError, ["transforms['image']", "Normalize", "2 value(s)", "3 channels"]),
    ({"image": [T.RandomResizedCrop(8), T.Normalize([0.5] * 3, [0.2] * 3)]}, ValueError,
     ["transforms['image']", "Normalize needs a float batch", "ToDtype"]),
], ids=["misspelled field", "int key", "int field", "Pad on an image", "str for an image", "an int in the list",
        "ToDtype first", "Normalize of 2 channels", "Normalize on uint8"])
def test_transforms_naming_the_wrong_field_or_kind(images, given, exc, words):
    with unchanged(images), user_error(exc, *words):
        fastload.open(images, transforms=given)


@pytest.mark.parametrize("given, exc, words", [
    ({"tokens": [T.RandomResizedCrop(8)]}, TypeError,
     ["transforms['tokens']", "variable-length ndarray field 'tokens'", "T.Pad(length)", "T.Bucket", "PackSequences"]),
    ({"tokens": [T.Pad(8)]}, TypeError, ["transforms['tokens']", "alone, not in a list"]),
    ({"label": T.Pad(8)}, ValueError, ["field 'label'", "only image fields", "['tokens']"]),
    ({"tokens": T.Pad(8)}, ValueError, ["field 'tokens'", "longer than Pad(length=8", "the longest is sample",
                                        "truncate=True", "T.Pad(8, truncate=True)"]),
    ({"tokens": T.Bucket([4, 8])}, ValueError, ["field 'tokens'", "longer than Bucket", "add a boundary",
                                                "truncate=True"]),
    ({"tokens": T.PackSequences(8)}, ValueError, ["per-sample field(s) ['label']", "drop_fields=['label']"]),
], ids=["image transforms on tokens", "Pad in a list", "Pad on an int", "too long for Pad", "too long for Bucket",
        "PackSequences beside a label"])
def test_transforms_on_a_token_dataset(tokens, given, exc, words):
    with unchanged(tokens), user_error(exc, *words):
        fastload.open(tokens, transforms=given)


def test_none_for_a_field_is_no_transform(images):
    """torchvision's ``transform=None``: documented as the same as leaving the field out."""
    ds = fastload.open(images, transforms={"image": None})
    assert ds.pipelines == {} and ds[0][0].shape[0] == 3


# -- other options -------------------------------------------------------------------------------

@pytest.mark.parametrize("option", [{"as_dict": "yes"}, {"decode": "no"}], ids=["as_dict", "decode"])
def test_bool_options_are_bools(images, option):
    (name, value), = option.items()
    with user_error(Exception, name, repr(value), "bool"):
        fastload.open(images, **option)


def test_remote_options_on_a_local_path_warn(images):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fastload.open(images, cache_limit="10GB")
    assert any("cache_limit" in str(w.message) and "ignored for a local path" in str(w.message) for w in seen)


# -- transform constructors ----------------------------------------------------------------------

CONSTRUCTORS = {
    "RandomResizedCrop size -1": (lambda: T.RandomResizedCrop(-1), ValueError, ["RandomResizedCrop size", "positive"]),
    "RandomResizedCrop size str": (lambda: T.RandomResizedCrop("224"), TypeError, ["RandomResizedCrop size", "int"]),
    "RandomResizedCrop size 3": (lambda: T.RandomResizedCrop((8, 8, 3)), ValueError, ["RandomResizedCrop", "(h, w)"]),
    "RandomResizedCrop scale order": (lambda: T.RandomResizedCrop(8, scale=(1.0, 0.5)), ValueError,
                                      ["scale=(1.0, 0.5)", "min <= max"]),
    "RandomResizedCrop scale negative": (lambda: T.RandomResizedCrop(8, scale=(-0.1, 0.5)), ValueError,
                                         ["scale=", "0 <= min"]),
    "RandomResizedCrop scale float": (lambda: T.RandomResizedCrop(8, scale=0.5), TypeError,
                                      ["scale=0.5", "(min, max)"]),
    "RandomResizedCrop scale of 3": (lambda: T.RandomResizedCrop(8, scale=(0.1, 0.5, 0.9)), TypeError,
                                     ["scale=(0.1, 0.5, 0.9)", "(min, max) pair"]),
    "RandomResizedCrop scale str": (lambda: T.RandomResizedCrop(8, scale=("a", "b")), TypeError,
                                    ["scale=('a', 'b')", "numbers"]),
    "RandomResizedCrop ratio order": (lambda: T.RandomResizedCrop(8, ratio=(2.0, 1.0)), ValueError,
                                      ["ratio=(2.0, 1.0)", "min <= max"]),
    "RandomResizedCrop ratio zero": (lambda: T.RandomResizedCrop(8, ratio=(0, 1)), ValueError, ["ratio=", "0 < min"]),
    "RandomResizedCrop ratio None": (lambda: T.RandomResizedCrop(8, ratio=None), TypeError, ["ratio=None"]),
    "RandomResizedCrop nearest": (lambda: T.RandomResizedCrop(8, interpolation="nearest"), ValueError,
                                  ["interpolation='nearest'", "bilinear"]),
    "RandomResizedCrop no antialias": (lambda: T.RandomResizedCrop(8, antialias=False), ValueError,
                                       ["antialias=False", "antialias=True"]),
    "Resize 0": (lambda: T.Resize(0), ValueError, ["Resize size", "positive"]),
    "Resize max_size with (h, w)": (lambda: T.Resize((8, 8), max_size=10), ValueError, ["max_size=10", "int"]),
    "Resize max_size too small": (lambda: T.Resize(8, max_size=8), ValueError, ["max_size=8", "greater"]),
    "CenterCrop -1": (lambda: T.CenterCrop(-1), ValueError, ["CenterCrop size", "positive"]),
    "CenterCrop float": (lambda: T.CenterCrop(2.5), TypeError, ["CenterCrop size", "int", "2.5"]),
    "flip p 2": (lambda: T.RandomHorizontalFlip(2), ValueError, ["p=2", "[0, 1]"]),
    "flip p str": (lambda: T.RandomHorizontalFlip("0.5"), TypeError, ["p='0.5'", "probability"]),
    "flip p None": (lambda: T.RandomHorizontalFlip(None), TypeError, ["p=None", "probability"]),
    "Compose of an int": (lambda: T.Compose(5), TypeError, ["Compose(transforms=5)", "list of transforms"]),
    "Normalize lengths": (lambda: T.Normalize([0.5, 0.5, 0.5], [0.2, 0.2]), ValueError,
                          ["Normalize", "mean", "std", "one value per channel"]),
    "Normalize empty": (lambda: T.Normalize([], []), ValueError, ["Normalize", "one value per channel"]),
    "Normalize zero std": (lambda: T.Normalize([0.5], [0.0]), ValueError, ["Normalize", "std", "zero"]),
    "ToDtype str": (lambda: T.ToDtype("float32"), ValueError, ["ToDtype(dtype=float32)", "float dtype"]),
    "ToDtype int64": (lambda: T.ToDtype(torch.int64), ValueError, ["ToDtype(dtype=torch.int64)", "float dtype"]),
    "Pad 0": (lambda: T.Pad(0), ValueError, ["length=0", "positive int"]),
    "Pad float": (lambda: T.Pad(5.5), ValueError, ["length=5.5", "positive int"]),
    "Pad value str": (lambda: T.Pad(5, value="x"), ValueError, ["value='x'", "number"]),
    "Pad truncate int": (lambda: T.Pad(5, truncate=1), ValueError, ["truncate=1", "bool"]),
    "Bucket int": (lambda: T.Bucket(64), ValueError, ["boundaries=64", "increasing positive ints"]),
    "Bucket order": (lambda: T.Bucket([128, 64]), ValueError, ["boundaries=[128, 64]", "increasing"]),
    "Bucket empty": (lambda: T.Bucket([]), ValueError, ["boundaries=[]", "increasing"]),
    "PackSequences 0": (lambda: T.PackSequences(0), ValueError, ["row_length=0", "positive int"]),
    "PackSequences drop_fields str": (lambda: T.PackSequences(8, drop_fields="label"), TypeError,
                                      ["drop_fields='label'", "list of field names"]),
}

# cases whose fix belongs to a file this suite's author does not own
FOREIGN = {
    "Normalize of a float": (lambda: T.Normalize(0.5, 0.2), TypeError, ["Normalize", "mean", "sequence"]),
    "Normalize of str": (lambda: T.Normalize(["a"] * 3, [0.2] * 3), ValueError, ["Normalize", "mean", "'a'"]),
}


@pytest.mark.parametrize("case", sorted(CONSTRUCTORS))
def test_transform_constructors(case):
    make, exc, words = CONSTRUCTORS[case]
    with user_error(exc, *words):
        make()


@pytest.mark.parametrize("case", sorted(FOREIGN))
def test_normalize_with_non_sequences(case):
    make, exc, words = FOREIGN[case]
    with user_error(exc, *words):
        make()


def test_bucket_takes_a_numpy_array():
    assert T.Bucket(np.array([16, 32])).boundaries == (16, 32)


# -- ds[i] ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("index", ["0", 1.0, None, slice(0, 2), True, [0, 1]], ids=repr)
def test_index_of_the_wrong_type(images, index):
    ds = fastload.open(images)
    with user_error(TypeError, "indices must be integers", type(index).__name__):
        ds[index]


@pytest.mark.parametrize("index", [12, 10**12, -13])
def test_index_out_of_range(images, index):
    """IndexError is the sequence protocol's answer (``for x in ds`` stops on it), so it is the right type here,
    though ``user_error`` counts it as internal elsewhere; the message must still say the index and the size."""
    ds = fastload.open(images)
    with pytest.raises(IndexError) as info:
        ds[index]
    assert f"index {index} out of range" in str(info.value) and "12 samples" in str(info.value), info.value


def test_numpy_and_negative_indices_work(images):
    ds = fastload.open(images)
    assert ds[np.int64(3)][1] == ds[3][1] == ds[-9][1]


def test_an_unknown_order_names_the_loader_argument(images):
    """The loader's argument is ``order=``; the error used to name the Order's internal ``kind=``."""
    with user_error(ValueError, "order='rnd'", "random", "sequential"):
        fastload.DataLoader(fastload.open(images, transforms={"image": [T.RandomResizedCrop(32)]}), batch_size=4,
                            order="rnd")
