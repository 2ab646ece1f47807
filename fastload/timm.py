"""``fastload.timm.create_loader``: timm's ``timm.data.create_loader`` on fastload's fast path (issue 30 item 1).

One changed import in timm's ``train.py``::

    from fastload.timm import create_loader   # was: from timm.data import create_loader

The same signature and semantics as timm 1.0's: the dataset gets the transform ``timm.data.create_transform``
builds from the same arguments (fastload converts it, ``_augment/timm_convert.py``), the same samplers
(``DistributedSampler``, ``OrderedDistributedSampler`` for evaluation, ``RepeatAugSampler`` for
``num_aug_repeats``), the same shuffling and ``drop_last=is_training``, and with ``use_prefetcher`` (the
default) the same batches as timm's ``PrefetchLoader`` gives: uint8 images moved to ``device``, cast to
``img_dtype`` (``float16`` for ``fp16``), ``(x - mean * 255) / (std * 255)`` there, then timm's own
``RandomErasing(device=...)`` on the batch (``re_prob``, ``re_mode``, ``re_count``, ``re_split``), and a
``FastCollateMixup`` given as ``collate_fn`` run on the normalized batch (``_augment/timm_mix.py`` says what
that keeps exactly). The loader under it is a :class:`fastload.DataLoader`; timm's ``ImageDataset`` over a
folder takes its fast path (``_front/tvfolder.py``).

What fastload does differently, and why it keeps timm's meaning:

- ``num_workers`` is the number of native decode threads (no worker processes); ``persistent_workers`` and
  ``use_multi_epochs_loader`` (both there to keep worker processes alive across epochs) hold by construction:
  the threads live as long as the loader. ``worker_seeding`` ('all' or 'part': seed each worker's generators
  apart) holds too: each sample's augmentation draws are keyed by (seed, epoch, index), never by a worker.
  A callable ``worker_seeding`` has no worker to run in: refused with that reason.
- Refused by name, with the reason: ``num_aug_splits > 0`` (AugMix splits: a tuple of transforms per sample,
  timm's ``AugMixDataset``), scheduled input sizes (``input_size_choices`` and the ``batch_*`` arguments that
  go with it), a ``FastCollateMixup`` without the prefetcher, and timm's own refusals (``num_aug_repeats``
  without ``distributed``).
- ``decoder=`` (keyword only, not timm's): ``fastload.DataLoader``'s. The default ``'native'`` decodes a JPEG
  that ``Resize`` shrinks 2x or more at 1/2, 1/4 or 1/8 of its size (faster; up to tens of levels from PIL's pixels
  there); ``decoder='exact'`` decodes every JPEG at full size, so evaluation gives timm's pixels bit for bit
  (Pillow-SIMD; tests/test_eval_exact_decoder.py, test_eval_exact_real.py).
- Anything the fast path cannot take (a custom ``collate_fn``, a transform that does not convert) is said by
  ``fastload.DataLoader`` itself, once, with the reason.

timm is imported when ``create_loader`` is called (``pip install timm``).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import torch

from ._augment.timm_mix import TimmMixup, is_timm_mixup
from ._front.loader import DataLoader

__all__ = ["PrefetchLoader", "create_loader"]

IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)
_CUDA = torch.device("cuda")  # timm's default device


def _timm_data() -> Any:
    try:
        import timm.data
    except ImportError as e:
        raise ImportError(
            f"fastload.timm needs timm: pip install timm (it builds timm's transforms and samplers). Original "
            f"error: {e}"
        ) from e
    return timm.data


def _adapt_to_chs(x: Any, n: int, name: str) -> tuple:
    """timm's ``adapt_to_chs``: a scalar repeated, a sequence of the wrong length averaged (said)."""
    if not isinstance(x, (tuple, list)):
        return (float(x),) * n
    if len(x) != n:
        avg = sum(float(v) for v in x) / len(x)
        warnings.warn(
            f"fastload.timm: {name} has {len(x)} values for {n} channels; using their average {avg} (as timm does)",
            UserWarning,
            stacklevel=3,
        )
        return (avg,) * n
    return tuple(float(v) for v in x)


def _with_fallback(dataset: Any) -> Any:
    """timm's folder dataset whose transform does not convert whole (timm's RandAugment, the DeiT recipe) as the
    fastload.Dataset over its pack, those transforms run per sample (warned once by the pipeline), where
    ``fastload.DataLoader`` given the folder dataset keeps torch's path; else ``dataset`` as given (the loader
    takes the fast path itself, or says why not)."""
    from ._errors import FastPathWarning
    from .fields import NotFastPath
    from ._front.tvfolder import folder_dataset, kind_of
    from .transforms import ImagePipeline

    if kind_of(dataset) is None:
        return dataset
    try:
        if not ImagePipeline(dataset.transform).fallback:
            return dataset
        packed = folder_dataset(dataset, fallback=True)
    except (NotFastPath, ValueError, TypeError):
        return dataset  # fastload.DataLoader says why, as for any folder dataset
    slow = "; ".join(f"{u.name} ({u.reason})" for u in packed.pipelines["image"].fallback)
    warnings.warn(
        f"fastload.timm.create_loader: {type(dataset).__name__} ({len(dataset)} samples) takes the fast path "
        f"over its pack in {packed.path}, in its order and with its labels; what does not convert runs per "
        f"sample: {slow}. The loader's dataset is that fastload.Dataset (the prefetching loader's .dataset "
        f"stays yours)",
        FastPathWarning,
        stacklevel=3,
    )
    return packed


def _say_erasing_stays_timms(re_prob: float, re_mode: str, re_count: int, re_num_splits: int, mixup: bool) -> None:
    """Say once (per loader) that the prefetcher's erasing is timm's own object on the device batch, and why
    fastload's native noise erasing (``_augment/noise_erasing.py``, in the fill stage) does not take it."""
    why = [
        "timm erases the batch after copying it as uint8 and normalizing it on the device, and fastload's native "
        "erasing runs in the fill stage, before the copy, on batches it would then have to copy as float32 "
        "(4x the bytes)"
    ]
    if mixup:
        why.append("the batch is mixed (FastCollateMixup) before it is erased, and erasing first would mix the boxes")
    if re_num_splits > 1:
        why.append(f"re_split leaves the first 1/{re_num_splits} of each batch unerased, by its place in the batch")
    warnings.warn(
        f"fastload.timm.create_loader: the prefetcher's RandomErasing (re_prob={re_prob}, re_mode={re_mode!r}, "
        f"re_count={re_count}) stays timm's own object, run on each normalized batch on the device, a Python loop "
        f"over its samples, as timm's PrefetchLoader runs it: {'; '.join(why)}. Without mixup, "
        f"use_prefetcher=False gives timm's per-sample erasing after Normalize, which fastload runs natively",
        UserWarning,
        stacklevel=3,
    )


class PrefetchLoader:
    """timm's ``PrefetchLoader`` over a :class:`fastload.DataLoader`: each ``(uint8 images, targets)`` batch
    moved to ``device`` (fastload's loader copies it there itself on CUDA), cast to ``img_dtype`` and normalized
    there, then ``mixup`` (a :class:`~fastload._augment.timm_mix.TimmMixup`) and ``random_erasing`` (timm's
    own, on the batch), in timm's order: timm mixes while collating, before normalizing and erasing."""

    def __init__(
        self,
        loader: DataLoader,
        mean: Sequence[float],
        std: Sequence[float],
        channels: int,
        device: torch.device,
        img_dtype: torch.dtype,
        random_erasing: Any = None,
        mixup: Optional[TimmMixup] = None,
        dataset: Any = None,
    ) -> None:
        shape = (1, channels, 1, 1)
        self.loader, self.device, self.img_dtype = loader, device, img_dtype
        self.mean = torch.tensor([m * 255 for m in mean], device=device, dtype=img_dtype).view(shape)
        self.std = torch.tensor([s * 255 for s in std], device=device, dtype=img_dtype).view(shape)
        self.random_erasing, self.mixup = random_erasing, mixup
        self._dataset = dataset  # timm's dataset, where the loader reads its pack

    def __iter__(self):
        for x, y in self.loader:
            if not isinstance(x, torch.Tensor) or x.ndim != 4:
                raise TypeError(
                    f"fastload.timm: the prefetcher expects batches of (N, C, H, W) images, got "
                    f"{type(x).__name__} {tuple(getattr(x, 'shape', ()))}: the dataset's transform should end "
                    f"in timm's ToNumpy/MaybePILToTensor, as create_transform(use_prefetcher=True) builds it"
                )
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
            x = x.to(self.img_dtype).sub_(self.mean).div_(self.std)
            if self.mixup is not None:
                x, y = self.mixup(x, y)
            if self.random_erasing is not None:
                x = self.random_erasing(x)
            yield x, y

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def sampler(self) -> Any:
        return self.loader.sampler

    @property
    def batch_sampler(self) -> Any:
        return self.loader.batch_sampler

    @property
    def dataset(self) -> Any:
        return self._dataset if self._dataset is not None else self.loader.dataset

    @property
    def mixup_enabled(self) -> bool:
        return self.mixup.mixup_enabled if self.mixup is not None else False

    @mixup_enabled.setter
    def mixup_enabled(self, value: bool) -> None:
        if self.mixup is not None:
            self.mixup.mixup_enabled = value


def create_loader(
    dataset: Any,
    input_size: Union[int, Tuple[int, int], Tuple[int, int, int]],
    batch_size: int,
    is_training: bool = False,
    no_aug: bool = False,
    re_prob: float = 0.0,
    re_mode: str = "const",
    re_count: int = 1,
    re_split: bool = False,
    train_crop_mode: Optional[str] = None,
    scale: Optional[Tuple[float, float]] = None,
    ratio: Optional[Tuple[float, float]] = None,
    hflip: float = 0.5,
    vflip: float = 0.0,
    color_jitter: float = 0.4,
    color_jitter_prob: Optional[float] = None,
    grayscale_prob: float = 0.0,
    gaussian_blur_prob: float = 0.0,
    auto_augment: Optional[str] = None,
    num_aug_repeats: int = 0,
    num_aug_splits: int = 0,
    interpolation: str = "bilinear",
    mean: Tuple[float, ...] = IMAGENET_DEFAULT_MEAN,
    std: Tuple[float, ...] = IMAGENET_DEFAULT_STD,
    num_workers: int = 1,
    distributed: bool = False,
    crop_pct: Optional[float] = None,
    crop_mode: Optional[str] = None,
    crop_border_pixels: Optional[int] = None,
    collate_fn: Optional[Callable] = None,
    pin_memory: bool = False,
    fp16: bool = False,
    img_dtype: torch.dtype = torch.float32,
    device: torch.device = _CUDA,
    use_prefetcher: bool = True,
    use_multi_epochs_loader: bool = False,
    persistent_workers: bool = True,
    worker_seeding: Any = "all",
    tf_preprocessing: bool = False,
    input_size_choices: Optional[Sequence[Any]] = None,
    batch_size_choices: Optional[Sequence[int]] = None,
    batch_choice_weights: Optional[Sequence[float]] = None,
    batch_choice_seed: int = 0,
    batch_choice_schedule: str = "constant",
    batch_schedule_epochs: Optional[int] = None,
    batch_schedule_spread: float = 0.65,
    batch_schedule_random_mix: float = 0.1,
    num_batches: Optional[int] = None,
    *,
    decoder: str = "native",
) -> Union[DataLoader, PrefetchLoader]:
    """timm's ``create_loader`` (same arguments, same meaning; the module docstring says what differs and
    why): a :class:`PrefetchLoader` with ``use_prefetcher``, else the :class:`fastload.DataLoader`.
    ``decoder`` (fastload's own, keyword only): ``fastload.DataLoader``'s, e.g. ``'exact'`` for timm's pixels bit
    for bit in evaluation (every JPEG decoded at full size, as PIL does)."""
    td = _timm_data()
    scheduled = {
        "input_size_choices": input_size_choices,
        "batch_size_choices": batch_size_choices,
        "batch_choice_weights": batch_choice_weights,
        "batch_schedule_epochs": batch_schedule_epochs,
        "num_batches": num_batches,
    }
    given = [k for k, v in scheduled.items() if v is not None]
    if given:
        raise ValueError(
            f"fastload.timm.create_loader: {', '.join(given)} (timm's scheduled input sizes, a transform and "
            f"batch size per batch) are not supported on fastload's fast path, which plans one output size; "
            f"use timm.data.create_loader for this run"
        )
    if num_aug_splits > 0:
        raise ValueError(
            f"fastload.timm.create_loader: num_aug_splits={num_aug_splits} (AugMix splits: timm's "
            f"AugMixDataset returns a tuple of differently augmented views per sample) is not supported on "
            f"fastload's fast path; use timm.data.create_loader for this run"
        )
    if callable(worker_seeding):
        raise ValueError(
            "fastload.timm.create_loader: a callable worker_seeding has no worker process to run in: "
            "fastload decodes in native threads and keys each sample's augmentation draws by (seed, epoch, "
            "index); pass worker_seeding='all' (or leave it out)"
        )
    if worker_seeding not in ("all", "part"):
        raise ValueError(f"fastload.timm.create_loader: worker_seeding={worker_seeding!r} should be 'all' or 'part'")
    mixup = None
    if collate_fn is not None and is_timm_mixup(collate_fn):
        if not use_prefetcher:
            raise ValueError(
                f"fastload.timm.create_loader: collate_fn={type(collate_fn).__name__} mixes uint8 images, which "
                f"needs use_prefetcher=True (timm's train.py pairs them); without the prefetcher, call timm's "
                f"Mixup on each batch instead (x, y = mixup_fn(x, y))"
            )
        mixup, collate_fn = TimmMixup(collate_fn), None

    re_num_splits = (num_aug_splits or 2) if re_split else 0
    transform_kwargs = dict(
        is_training=is_training,
        no_aug=no_aug,
        scale=scale,
        ratio=ratio,
        hflip=hflip,
        vflip=vflip,
        color_jitter=color_jitter,
        auto_augment=auto_augment,
        interpolation=interpolation,
        mean=mean,
        std=std,
        crop_pct=crop_pct,
        crop_mode=crop_mode,
        crop_border_pixels=crop_border_pixels,
        re_prob=re_prob,
        re_mode=re_mode,
        re_count=re_count,
        re_num_splits=re_num_splits,
        tf_preprocessing=tf_preprocessing,
        use_prefetcher=use_prefetcher,
        separate=False,
    )
    # the arguments timm added during 1.0, passed only when set, so an earlier 1.0 (without them) works unchanged
    newer = dict(
        train_crop_mode=train_crop_mode,
        color_jitter_prob=color_jitter_prob,
        grayscale_prob=grayscale_prob or None,
        gaussian_blur_prob=gaussian_blur_prob or None,
    )
    transform_kwargs.update({k: v for k, v in newer.items() if v is not None})
    channels = input_size[0] if isinstance(input_size, (tuple, list)) and len(input_size) == 3 else len(mean)
    dataset.transform = td.create_transform(input_size, **transform_kwargs)

    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    if iterable and hasattr(dataset, "set_loader_cfg"):  # timm's IterableImageDataset sizes its shards by workers
        dataset.set_loader_cfg(num_workers=num_workers)
    sampler = None
    if distributed and not iterable:
        from timm.data.distributed_sampler import OrderedDistributedSampler, RepeatAugSampler

        if is_training:
            sampler = (
                RepeatAugSampler(dataset, num_repeats=num_aug_repeats)
                if num_aug_repeats
                else torch.utils.data.distributed.DistributedSampler(dataset)
            )
        else:
            sampler = OrderedDistributedSampler(dataset)
    elif num_aug_repeats:
        raise ValueError(
            f"fastload.timm.create_loader: num_aug_repeats={num_aug_repeats} (RepeatAugSampler) needs "
            f"distributed=True and a map-style dataset, as in timm"
        )

    device = torch.device(device)
    loader: DataLoader = DataLoader(
        _with_fallback(dataset),
        batch_size=batch_size,
        shuffle=not iterable and sampler is None and is_training,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
        drop_last=is_training,
        persistent_workers=persistent_workers and num_workers > 0,
        device=device if use_prefetcher and device.type == "cuda" else None,
        decoder=decoder,
    )
    if loader.fast_path_reason is not None and use_multi_epochs_loader:
        warnings.warn(
            f"fastload.timm.create_loader: use_multi_epochs_loader=True is not kept: the loader runs torch's "
            f"path ({loader.fast_path_reason}), whose workers restart each epoch unless persistent_workers",
            UserWarning,
            stacklevel=2,
        )
    if not use_prefetcher:
        return loader
    erasing = None
    if is_training and not no_aug and re_prob > 0.0:
        from timm.data.random_erasing import RandomErasing

        erasing = RandomErasing(
            probability=re_prob, mode=re_mode, max_count=re_count, num_splits=re_num_splits, device=device
        )
        _say_erasing_stays_timms(re_prob, re_mode, re_count, re_num_splits, mixup is not None)
    dtype = torch.float16 if fp16 else (img_dtype or torch.float32)
    return PrefetchLoader(
        loader,
        _adapt_to_chs(mean, channels, "mean"),
        _adapt_to_chs(std, channels, "std"),
        channels,
        device,
        dtype,
        erasing,
        mixup,
        dataset,
    )
