"""``fastload.open``'s ``transforms=``: checked against the dataset's schema when the dataset is opened.

The argument is a dict of field name -> transforms: an image field takes a list (or ``Compose``) of
``fastload.transforms`` image transforms, a variable-length ndarray field one of ``Pad``, ``Bucket``,
``PackSequences``; ``None`` for a field is the same as leaving it out. torchvision's habit of one
``Compose`` for "the image" is refused rather than guessed at: with a second image field (or a token
field beside it) the guess would silently change meaning, and the message gives the exact dict to write.

Everything a user can get wrong here is refused before the first sample is read, naming the field: an
unknown or misspelled field, a transform for a kind of field that takes none, a sequence transform on an
image and the reverse, a ``Normalize`` whose channel count is not the images' 3, samples longer
than ``Pad``/``Bucket`` allow (``check_lengths``), images no crop or resize of the pipeline could plan and masks
of another size than their image (``check_sizes``, from the stored sizes) — which a loader would otherwise only
meet at whichever batch holds the first of them.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._schema import Schema
from .sequences import Bucket, PackSequences, Pad, is_sequence_transform
from .tensor import Normalize
from ..transforms import _SUPPORTED, ImagePipeline, _type_name

IMAGE_CHANNELS = 3  # every image field decodes to RGB (3, H, W)
_EXAMPLE = "transforms={'image': [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]}"
_SEQUENCES = "T.Pad(length), T.Bucket(boundaries) or T.PackSequences(row_length)"


def resolve(transforms: Any, schema: Schema) -> tuple[dict, dict[str, ImagePipeline], dict[str, Any]]:
    """``(transforms as given, image pipelines by field, sequence transforms by field)``; raises TypeError /
    ValueError naming the field and what it takes."""
    if transforms is None:
        return {}, {}, {}
    if not isinstance(transforms, Mapping):
        raise TypeError(_not_a_dict(transforms, schema))
    pipelines: dict[str, ImagePipeline] = {}
    sequences: dict[str, Any] = {}
    for name, spec in transforms.items():
        if not isinstance(name, str):
            raise TypeError(
                f"transforms keys are field names (str), got {name!r}; image and variable-length "
                f"ndarray fields take transforms, {_takers(schema)}"
            )
        if name not in schema:
            close = difflib.get_close_matches(name, schema.names, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ValueError(
                f"transforms name field '{name}', which this dataset does not have{hint}; its fields "
                f"are {list(schema.names)}"
            )
        if spec is None:
            continue
        field = schema[name]
        at = f"transforms['{name}']"
        if field.kind == "image":
            if is_sequence_transform(spec):
                raise ValueError(
                    f"{at}: {type(spec).__name__} is for variable-length ndarray fields; the image "
                    f"field '{name}' takes a list of image transforms ({_SUPPORTED})"
                )
            pipelines[name] = _image_pipeline(spec, at)
        elif field.kind == "ndarray" and not field.fixed_size:
            if not is_sequence_transform(spec):
                alone = (
                    " alone, not in a list"
                    if isinstance(spec, (list, tuple)) and len(spec) == 1 and is_sequence_transform(spec[0])
                    else ""
                )
                raise TypeError(
                    f"{at}: the variable-length ndarray field '{name}' takes one of {_SEQUENCES}{alone}, got {spec!r}"
                )
            spec.field_check(field)
            sequences[name] = spec
        else:
            raise ValueError(
                f"transforms name field '{name}', of kind {field.kind}, but only image fields (image "
                f"transforms) and variable-length ndarray fields (Pad, Bucket, PackSequences) take "
                f"transforms; {_takers(schema)}"
            )
    grouping = [n for n, t in sequences.items() if isinstance(t, (Bucket, PackSequences))]
    if len(grouping) > 1:
        raise ValueError(
            f"at most one field can be bucketed or packed (Bucket, PackSequences), got {grouping}; "
            f"pad the others with Pad"
        )
    for name, spec in sequences.items():
        if isinstance(spec, PackSequences):
            spec.schema_check(name, schema)
    return dict(transforms), pipelines, sequences


def check_lengths(dataset: Any) -> None:
    """Every sample's length against its field's ``Pad``/``Bucket`` (without ``truncate``), from the shape
    columns (no values are read). A remote dataset would have to download every shard for this: there
    ``Bucket`` is checked when the loader plans its buckets (``fast.chain.order_for``) and ``Pad`` batch by batch."""
    if dataset.remote:
        return
    for name, spec in dataset.sequences.items():
        if isinstance(spec, (Pad, Bucket)) and not spec.truncate:
            spec.check_all(dataset.reader.first_dims(name), name)


def check_sizes(dataset: Any) -> None:
    """Every sample's stored image size against its field's crops and resizes (``ImagePipeline.check_sizes``,
    from the ``meta`` columns: no pixels are read), so that a sample no batch could plan (a ``RandomCrop``
    larger than the image, a ``Resize`` to a 0-pixel side, a padding ``CenterCrop`` before a resize) is refused
    here, every such sample counted and the first named, not at whichever batch holds it. Not for a remote
    dataset (every shard would be downloaded: its batches refuse such a sample as they meet it), nor with
    ``decode=False`` (nothing is transformed)."""
    if dataset.remote or not dataset.decode:
        return
    for name, pipe in dataset.pipelines.items():
        if not (pipe.transforms or pipe.augment):
            continue
        hw = dataset.reader.image_sizes(name)
        why = pipe.check_sizes(hw[:, 0], hw[:, 1])
        if why is not None:
            raise ValueError(f"fastload.open({str(dataset.path)!r}): transforms['{name}']: {why}")
    _check_masks(dataset)


def _check_masks(dataset: Any) -> None:
    """A mask field that follows its image's transforms must have its image's size in every sample (each
    batch refuses one that does not: said here, for all of them)."""
    from ..fields.mask import follows

    for field in dataset.schema:
        if field.kind != "mask":
            continue
        try:
            image = follows(field, dataset.pipelines)
        except ValueError:  # several transformed images: the loader says so (fields/mask.py)
            continue
        if image is None:
            continue
        masks, images = dataset.reader.image_sizes(field.name), dataset.reader.image_sizes(image)
        bad = np.flatnonzero((masks != images).any(axis=1))
        if bad.size:
            named = "; ".join(
                f"sample {i}: mask {masks[i, 0]}x{masks[i, 1]}, image {images[i, 0]}x{images[i, 1]}" for i in bad[:5]
            )
            more = f" and {bad.size - 5} more" if bad.size > 5 else ""
            raise ValueError(
                f"fastload.open({str(dataset.path)!r}): mask field '{field.name}' follows "
                f"transforms['{image}'], but {bad.size} of the dataset's {len(masks)} samples "
                f"{'has' if bad.size == 1 else 'have'} a mask "
                f"of another size than their image ({named}{more}): a mask must have its image's size to "
                f"follow its geometry; pack those samples again with masks of their image's size, or "
                f"open the dataset without transforms (masks then come back as stored)"
            )


def _image_pipeline(spec: Any, at: str) -> ImagePipeline:
    try:
        pipe = ImagePipeline(spec)
    except TypeError as e:
        raise TypeError(f"{at}: {e}") from None
    except ValueError as e:
        raise ValueError(f"{at}: {e}") from None
    for t in pipe.tensor.transforms:
        if isinstance(t, Normalize) and len(t.mean) != IMAGE_CHANNELS:
            raise ValueError(
                f"{at}: {t!r} has {len(t.mean)} value(s) per statistic, but images have "
                f"{IMAGE_CHANNELS} channels (RGB): give mean and std {IMAGE_CHANNELS} values each"
            )
    return pipe


def _takers(schema: Schema) -> str:
    takers = [f.name for f in schema if f.kind == "image" or (f.kind == "ndarray" and not f.fixed_size)]
    return f"those fields here: {takers}"


def _not_a_dict(value: Any, schema: Schema) -> str:
    """torchvision passes one transform (or Compose) for the image; fastload names the field."""
    msg = f"transforms must be a dict of field -> transforms, e.g. {_EXAMPLE}; got {_type_name(value)}. "
    images = [f.name for f in schema if f.kind == "image"]
    if images:
        msg += f"This dataset's image field(s): {images}: pass transforms={{'{images[0]}': <your transforms>}}"
    else:
        msg += "Only image fields and variable-length ndarray fields take transforms; " + _takers(schema)
    inner = getattr(value, "transforms", value)
    items = list(inner) if isinstance(inner, (list, tuple)) else [value]
    if any(not type(t).__module__.startswith("fastload") for t in items):
        msg += (
            f". Only fastload.transforms run on fastload's engine (not torchvision's): {_SUPPORTED}, "
            f"same names and arguments"
        )
    return msg


def open_habit(path: Any, extra_args: tuple, unknown: dict, accepted: list[str]) -> str:
    """The TypeError for ``fastload.open`` called the torchvision way: the transforms as a second positional
    argument (``ImageFolder(root, transform)``), ``transform=`` (torchvision's singular), or another unknown
    keyword; it says what to write, naming the dataset's image fields when its manifest can be read."""
    images: list[str] = []
    try:
        from ..formats.reader import read_manifest
        from ..formats.remote import is_url
        from pathlib import Path

        if not is_url(path):
            images = [f.name for f in read_manifest(Path(path)).schema if f.kind == "image"]
    except Exception:  # a wrong path gets its own error once the call is right; here only the call is wrong
        pass
    field = images[0] if images else "image"
    write = f"transforms={{'{field}': [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]}}"
    fields = f" (this dataset's image field(s): {images})" if images else ""
    if extra_args:
        return (
            f"fastload.open takes the path as its only positional argument, got {1 + len(extra_args)}; name the "
            f"rest: the transforms go in transforms=, a dict of field -> transforms, e.g. {write}{fields}"
        )
    name = next(iter(unknown))
    if name == "transform":
        return (
            f"fastload.open has no transform=: it takes transforms= (plural), a dict of field -> transforms, e.g. "
            f"{write}{fields}"
        )
    if name == "target_transform":
        return (
            f"fastload.open has no target_transform=: a label comes back as stored (transform it in the loop, or "
            f"pack it transformed); it takes {', '.join(accepted)}"
        )
    close = difflib.get_close_matches(name, accepted, n=1)
    hint = f" (did you mean {close[0]}=?)" if close else ""
    loader = (
        "; batch_size, shuffle, num_workers and the like are fastload.DataLoader(ds, ...)'s"
        if name in ("batch_size", "shuffle", "num_workers", "drop_last", "seed", "sampler", "pin_memory")
        else ""
    )
    return f"fastload.open got an unexpected keyword argument {name!r}{hint}; it takes {', '.join(accepted)}{loader}"
