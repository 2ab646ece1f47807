"""Issue 27 row 7: torchvision's and torch's habits meet an error that says what to write in fastload, not
Python's bare ``TypeError``/``AttributeError``, and a refused resume says what was saved, what this loader has
and what to do, in the arguments the user wrote (not fastload's internal ``Order``)."""

from __future__ import annotations

import pytest
import torch

import fastload
from fastload import transforms as T

from conftest import packed_image_folder

from .conftest import unchanged, user_error

WRITE = "transforms={'image': [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]}"


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return packed_image_folder(tmp_path_factory.mktemp("habits"))


def test_transform_singular_says_transforms_plural_with_the_dict(images):
    """Was: TypeError: open() got an unexpected keyword argument 'transform'."""
    with unchanged(images), user_error(TypeError, "no transform=", "transforms= (plural)", WRITE,
                                       "image field(s): ['image']"):
        fastload.open(images, transform=[T.RandomResizedCrop(8)])


def test_transforms_as_a_second_positional_argument_says_to_name_them(images):
    """``ImageFolder(root, transform)``'s habit. Was: TypeError: open() takes 1 positional argument but 2 were given."""
    with unchanged(images), user_error(TypeError, "path as its only positional argument", "transforms=", WRITE):
        fastload.open(images, [T.RandomResizedCrop(8)])


@pytest.mark.parametrize("kwargs, words", [
    ({"batch_size": 8}, ["'batch_size'", "fastload.DataLoader(ds, ...)"]),
    ({"as_dct": True}, ["'as_dct'", "did you mean as_dict=?"]),
    ({"target_transform": abs}, ["no target_transform", "a label comes back as stored"]),
])
def test_other_unknown_arguments_name_what_open_takes(images, kwargs, words):
    with unchanged(images), user_error(TypeError, *words, "transforms, as_dict"):
        fastload.open(images, **kwargs)


def test_the_signature_is_still_open_s_own(images):
    import inspect

    assert list(inspect.signature(fastload.open).parameters)[:3] == ["path", "transforms", "as_dict"]
    assert len(fastload.open(images, transforms={"image": [T.Resize((8, 8))]})) == 12


@pytest.mark.parametrize("name, words", [
    ("ToTensor", ["no ToTensor", "uint8 (3, H, W)", "T.ToDtype(torch.float32, scale=True)"]),
    ("PILToTensor", ["no PILToTensor", "leave it out"]),
    ("ToPILImage", ["no ToPILImage", "to_pil_image"]),
    ("Lambda", ["no Lambda", "put the function itself in the list"]),
])
def test_torchvision_names_fastload_does_not_have_say_what_to_write(name, words):
    """``T.ToTensor()``: was "module 'fastload.transforms' has no attribute 'ToTensor'". A module's missing
    attribute must stay an AttributeError (``hasattr``, ``from ... import`` rely on it): the message is what
    changed."""
    with pytest.raises(AttributeError) as info:
        getattr(T, name)()
    missing = [w for w in words if w not in str(info.value)]
    assert not missing, (missing, str(info.value))
    assert not hasattr(T, name)
    with pytest.raises(AttributeError, match="has no attribute 'Nonsense'"):
        T.Nonsense  # noqa: B018


# -- resume into another loader -------------------------------------------------------------------

def _saved(images, **kw):
    loader = fastload.DataLoader(fastload.open(images, transforms={"image": [T.Resize((8, 8))]}), **kw)
    it = iter(loader)
    next(it)
    return loader.state_dict()


@pytest.mark.parametrize("other, words", [
    (dict(batch_size=4, shuffle=False), ["order='random' (shuffle=True)", "this loader has order='sequential'",
                                         "build this DataLoader with order='random' (shuffle=True)"]),
], ids=["shuffle"])
def test_a_resume_into_another_loader_says_it_in_the_loaders_terms(images, other, words):
    """Was: "cannot resume from a state saved by a different order: ...; build the Order with the saved
    settings" (an internal the user never built)."""
    state = _saved(images, batch_size=4, shuffle=True)
    loader = fastload.DataLoader(fastload.open(images, transforms={"image": [T.Resize((8, 8))]}), **other)
    with user_error(ValueError, "cannot resume from this state", *words, "to start over", "leave load_state_dict out"):
        loader.load_state_dict(state)
    try:
        loader.load_state_dict(state)
    except ValueError as e:
        assert "Order" not in str(e), e


@pytest.mark.parametrize("other", [dict(batch_size=8), dict(batch_size=4, drop_last=True),
                                   dict(batch_size=3, world_size=2)])
def test_a_resume_at_another_batch_size_or_world_size_goes_on_elastically(images, other):
    """Was refused ("saved by a loader with batch_size=4 ... build this DataLoader with batch_size=4"): the rest of the
    epoch is split over the new loader's ranks and batches (``fast/elastic.py``); the samples read before are not."""
    state = _saved(images, batch_size=4, shuffle=True, seed=1)
    ds = fastload.open(images, transforms={"image": [T.Resize((8, 8))]})
    loader = fastload.DataLoader(ds, shuffle=True, seed=5, **other)  # the state's seed wins
    loader.load_state_dict(state)
    assert loader.state_dict()["seed"] == 1 and loader.state_dict()["consumed"]  # the first 4 samples
    assert sum(len(labels) for _, labels in loader) < len(ds)


def test_a_list_of_states_for_a_samplers_order_says_what_to_pass(images):
    ds = fastload.open(images, transforms={"image": [T.Resize((8, 8))]})
    loader = fastload.DataLoader(ds, batch_size=4, sampler=torch.utils.data.RandomSampler(range(len(ds))))
    with user_error(ValueError, "a list of states", "fastload's own order", "pass the dict state_dict() returned"):
        loader.load_state_dict([loader.state_dict(), loader.state_dict()])


def test_a_resume_into_another_dataset_says_to_open_the_saved_one(images, tmp_path):
    state = _saved(images, batch_size=4, shuffle=True)
    other = packed_image_folder(tmp_path, per_class=2)
    loader = fastload.DataLoader(fastload.open(other, transforms={"image": [T.Resize((8, 8))]}), batch_size=4,
                                 shuffle=True)
    with user_error(ValueError, "a dataset of 12 samples", "this loader has a dataset of 6 samples",
                    "open the dataset it was saved on"):
        loader.load_state_dict(state)


def test_a_dict_that_is_no_saved_position_says_what_to_pass(images):
    """Was: "not an Order state ...; pass the dict that Order.state_dict() returned"."""
    loader = fastload.DataLoader(fastload.open(images, transforms={"image": [T.Resize((8, 8))]}), batch_size=4)
    with user_error(ValueError, "not a saved loader position", "loader.state_dict() returned"):
        loader.load_state_dict({"epoch": 0})
