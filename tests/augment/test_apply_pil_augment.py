"""fastload.transforms.apply_pil with augmentations: the PIL reference a torch Dataset can call per sample
(examples/train.py --augment does), executing the same plan the loader draws."""

from __future__ import annotations

import numpy as np
from PIL import Image

import fastload.transforms as T
from augment_common import photo_tiles
from fastload._augment.engine_pil import run_pil


def _expected(pipe: T.ImagePipeline, src: np.ndarray, seed: int) -> np.ndarray:
    """The same draws, run by the PIL engine from the source picture (crop, resize, then the augmentation)."""
    plan = pipe.plan(np.array([src.shape[0]]), np.array([src.shape[1]]), np.random.default_rng(seed))
    return run_pil(src, plan.augment, 0, source=True)


def test_runs_the_drawn_augmentation_on_the_sample() -> None:
    src = photo_tiles(1, 120, 160)[0]
    pipe = T.ImagePipeline([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.TrivialAugmentWide(),
                            T.RandomErasing(0.5)])
    changed = 0
    for seed in range(12):
        got = np.asarray(T.apply_pil(pipe, Image.fromarray(src), np.random.default_rng(seed)))
        assert got.shape == (48, 48, 3)
        assert np.array_equal(got, _expected(pipe, src, seed)), seed
        plain = np.asarray(T.apply_pil(pipe.transforms, Image.fromarray(src), np.random.default_rng(seed)))
        changed += not np.array_equal(got, plain)
    assert changed >= 6  # the augmentation did run (identity draws and p=0.5 erasing leave a few unchanged)


def test_a_padded_random_crop_is_assembled_from_the_source() -> None:
    src = photo_tiles(1, 40, 50)[0]
    pipe = T.ImagePipeline([T.RandomCrop(48, padding=6, fill=(255, 0, 0)), T.RandomSolarize(100, p=1.0)])
    for seed in range(6):
        got = np.asarray(T.apply_pil(pipe, Image.fromarray(src), np.random.default_rng(seed)))
        assert np.array_equal(got, _expected(pipe, src, seed)), seed
