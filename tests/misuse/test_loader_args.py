"""fastload.DataLoader given wrong or contradicting arguments: an error naming each argument and what was
expected, never an internal error, never a setting silently dropped; the packed dataset untouched."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

import fastload
from fastload import transforms as T

from .conftest import unchanged, user_error

PLAIN = list(range(10))


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(10))


def both(path):
    """The generic path's dataset and a fastload.Dataset on the fast path."""
    return [PLAIN, fastload.open(path, transforms={"image": [T.Resize(8), T.CenterCrop(8)]})]


@pytest.mark.parametrize("kwargs, words", [
    (dict(rank=2, world_size=2), ["rank=2", "world_size=2"]),
    (dict(rank=-1, world_size=2), ["rank=-1", ">= 0"]),
    (dict(rank=0, world_size=0), ["world_size=0", ">= 1"]),
    (dict(rank="1", world_size=2), ["rank='1'", "integer"]),
    (dict(seed=-3), ["seed=-3", ">= 0"]),
    (dict(seed="abc"), ["seed='abc'", "integer"]),
    (dict(order="shuffled"), ["order='shuffled'", "'random'"]),
    (dict(shuffle=True, order="sequential"), ["shuffle=True", "order='sequential'"]),
    (dict(split="rows", world_size=2, rank=0), ["split='rows'", "'samples'"]),
    (dict(num_workers=2, prefetch_factor=0), ["prefetch_factor=0", ">= 1"]),
    (dict(num_workers=0, prefetch_factor=2), ["prefetch_factor", "num_workers > 0"]),
    (dict(num_workers=-1), ["num_workers", "non-negative"]),
    (dict(on_error="ignore"), ["on_error='ignore'", "'skip'"]),
    (dict(shuffle=True, world_size=2, rank=1), ["world_size=2", "seed="]),
])
def test_bad_arguments(small_images, kwargs, words):
    for ds in both(small_images):
        with unchanged(small_images), user_error(ValueError, *words):
            fastload.DataLoader(ds, batch_size=2, **kwargs)


@pytest.mark.parametrize("make, words", [
    (lambda ds: dict(sampler=SequentialSampler(ds), shuffle=True), ["sampler", "shuffle"]),
    (lambda ds: dict(sampler=RandomSampler(ds), rank=1, world_size=2),
     ["rank=1", "world_size=2", "sampler=RandomSampler"]),
    (lambda ds: dict(sampler=DistributedSampler(ds, num_replicas=2, rank=0), rank=1), ["rank=1", "DistributedSampler"]),
    (lambda ds: dict(sampler=SequentialSampler(ds), order="random"), ["order='random'", "sampler=SequentialSampler"]),
    (lambda ds: dict(batch_sampler=torch.utils.data.BatchSampler(SequentialSampler(ds), 2, False), world_size=2,
                     rank=0), ["world_size=2", "batch_sampler=BatchSampler"]),
])
def test_sampler_against_fastloads_order(small_images, make, words):
    # a sampler picks every index: fastload's order and rank split cannot apply as well, and are not dropped
    for ds in both(small_images):
        kwargs = make(ds)
        if "batch_sampler" not in kwargs:
            kwargs["batch_size"] = 2
        with unchanged(small_images), user_error(ValueError, *words):
            fastload.DataLoader(ds, **kwargs)


def test_sampler_agreeing_with_rank_is_accepted(small_images):
    for ds in both(small_images):
        dl = fastload.DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, num_replicas=2, rank=1), rank=1,
                                 world_size=2)
        assert len(dl) == -(-(-(-len(ds) // 2)) // 2)  # half the samples (rounded up), in batches of 2


@pytest.mark.parametrize("kwargs", [dict(rank=1, world_size=2), dict(seed=3), dict(order="random")])
def test_iterable_dataset_cannot_be_ordered(kwargs):
    name = next(iter(kwargs))
    with user_error(ValueError, f"{name}=", "IterableDataset", "__iter__"):
        fastload.DataLoader(Stream(), batch_size=2, **kwargs)
