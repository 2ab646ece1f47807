"""What one field kind provides at every stage: the ``Codec`` interface and its batch ``Part``.

A field kind (``Field.kind``: "int", "image", ...) is one ``Codec`` object, listed once in ``registry.py``.
Every stage asks the field's codec instead of branching on the kind:

=================  =====================================================================================
stage              what the codec provides
=================  =====================================================================================
schema             ``normalize`` (dtype/shape rules), ``fixed_size``, ``np_dtype``, ``to_json``, ``repr``
layout (formats/)  ``columns`` (fixed-size per-sample rows), ``has_blob``, ``expected_blob_length``,
                   ``check_columns`` (what the format itself constrains, checked when a shard is opened)
pack               ``encode``: a source value to ``(column values, blob)``
``ds[i]``          ``read``: one sample's stored form back to its Python value
batches            ``batch``: a ``Part`` for one Batcher, made once at its construction (or NotFastPath)
``inspect``        ``describe``: what ``fastload inspect`` prints after the kind
=================  =====================================================================================

A ``Part`` is one field's share of a batch: the slot buffers it needs (``buffers``), its step of
``Batcher.fill`` (``fill``), the replacement of failed samples (``replace``), its entry in the collated
batch (``collate``) and that entry cut back into samples (``split``, ``ds.__getitems__``). The batcher
calls each part once per batch: no per-sample Python and no lookup by kind on the batch path.
``FixedPart`` serves any kind stored as fixed-size columns only (its one column is called ``values``);
``ObjectPart`` any kind read per sample as a Python object from its blob.

Nothing here imports the schema, the formats or the batcher: they import this package.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from .._errors import SchemaError
from .._native import native


class NotFastPath(Exception):
    """The dataset/loader configuration needs the generic path; the message says why."""


class Column(NamedTuple):
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def row_items(self) -> int:
        return math.prod(self.shape)  # exact: a crafted schema's huge dims must not wrap around

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize * self.row_items


class ReadContext(NamedTuple):
    """What ``ds[i]`` hands a codec's ``read`` besides the stored values (from the Dataset)."""

    decode: bool  # False: images come back as their stored bytes
    pipelines: dict  # image field -> its transforms.ImagePipeline
    padding: dict  # variable-length field -> its Pad/Bucket (PackSequences excluded: a lone sample is not packed)
    transformed_image: Callable  # (pipeline, blob, h, w, encoding, plan) -> CHW tensor, the loader's kernels
    moved_mask: Callable  # (mask, plan) -> the mask moved by its image's plan (_augment/masks.py's PIL reference)
    plans: dict | None = None  # image field -> this sample's plan, shared with its masks (``draw_plan``)


def draw_plan(ctx: ReadContext, image: str, reader: Any, at: Any) -> Any:
    """``ds[i]``'s one-sample plan of image field ``image``, shared by the image and its masks (fields/mask.py)
    through ``ctx.plans``: drawn by whichever reads first, from one seed of torch's generator, so
    ``torch.manual_seed`` makes ``ds[i]`` reproducible as with torchvision transforms."""
    plan = ctx.plans.get(image)
    if plan is None:
        h, w = (int(v) for v in reader.row(at, image, "meta", 0)[:2])
        rng = np.random.default_rng(int(torch.randint(0, 2**62, ()).item()))
        plan = ctx.plans[image] = ctx.pipelines[image].plan(np.array([h]), np.array([w]), rng)
    return plan


MAX_BLOB_BYTES = 1 << 62


def exact_or_bad(dims: np.ndarray, itemsize: int) -> np.ndarray:
    """Row-wise ``prod(dims) * itemsize`` as int64, -2 where it exceeds ``MAX_BLOB_BYTES``.

    The int64 product of crafted dimensions can wrap around to a small number that matches the blob
    length (e.g. (2**62, 2) float32 -> 0 bytes); a float64 product, exact enough to detect that, guards it.
    Zero dimensions count as 1 in the guard: numpy refuses (0, 2**62) too.
    """
    if not dims.shape[1]:
        return np.full(len(dims), itemsize, dtype=np.int64)
    with np.errstate(over="ignore"):
        n = np.prod(dims.astype(np.int64), axis=1) * itemsize
    approx = np.prod(np.maximum(dims, 1).astype(np.float64), axis=1) * itemsize
    return np.where(approx > MAX_BLOB_BYTES, -2, n)


def is_pil_image(v: Any) -> bool:
    mod = type(v).__module__ or ""
    return mod.startswith("PIL.") and hasattr(v, "convert") and hasattr(v, "size")


def as_array(v: Any) -> np.ndarray | None:
    """``v`` as a numpy array when it is one (or a torch tensor), else None."""
    if isinstance(v, np.ndarray):
        return v
    if type(v).__module__.startswith("torch") and hasattr(v, "numpy") and hasattr(v, "detach"):
        return v.detach().cpu().numpy()
    return None


def torch_dtype(np_dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=np_dtype.newbyteorder("="))).dtype


class Codec:
    """One field kind at every stage (the module docstring's table). Subclasses set ``kind`` and override
    what differs; the defaults describe a kind with neither dtype nor shape, stored as a blob only."""

    kind: str = ""

    # -- schema ---------------------------------------------------------------------------------
    def normalize(self, field: Any) -> tuple[Any, Any]:
        """The field's (dtype, shape) as stored in the schema, or SchemaError naming the field."""
        if field.dtype is not None or field.shape is not None:
            raise SchemaError(f"field '{field.name}': dtype/shape only apply to ndarray fields")
        return None, None

    def fixed_size(self, field: Any) -> bool:
        """True when every sample has the same byte size (stored column-wise, no blob)."""
        return False

    def np_dtype(self, field: Any) -> np.dtype | None:
        """The dtype of a fixed-size field's stored values; None when it has none."""
        return None

    def to_json(self, field: Any) -> dict:
        """The schema JSON's keys beyond name and kind."""
        return {}

    def repr(self, field: Any) -> str:
        return f"Field.{field.kind}({field.name!r})"

    def describe(self, field: Any) -> str:
        """What ``fastload inspect`` prints after the kind."""
        return ""

    # -- layout ---------------------------------------------------------------------------------
    def columns(self, field: Any) -> tuple[Column, ...]:
        return ()

    def has_blob(self, field: Any) -> bool:
        return not self.fixed_size(field)

    def expected_blob_length(self, field: Any, columns: dict) -> np.ndarray | None:
        """Per-row blob length implied by the columns, -1 where free; None when unconstrained."""
        return None

    def check_columns(self, field: Any, columns: dict, first: int = 0) -> str | None:
        """A message naming the first bad row (``sample first + k``), or None."""
        return None

    # -- pack, ds[i], batches ------------------------------------------------------------------
    def encode(self, field: Any, value: Any, opts: Any) -> tuple[tuple, bytes | None]:
        """``(column values, blob)`` for one source value (``opts``: the packer's ImageOptions);
        SchemaError saying what was expected (the caller names the field and sample)."""
        raise NotImplementedError

    def check_blob(self, field: Any, blob: Any, row: Callable) -> str | None:
        """What ``verify`` finds wrong with one stored value beyond its layout (e.g. a mask's PNG that does not
        decode), or None; ``row(column)`` is the sample's row of a column. Default: nothing to check."""
        return None

    def read(self, field: Any, reader: Any, at: Any, ctx: ReadContext) -> Any:
        """``ds[i]``'s value of ``field`` for the one sample ``at`` locates (``PackedReader.locate_one``)."""
        raise NotImplementedError

    def batch(self, field: Any, dataset: Any) -> "Part":
        """This field's part of a Batcher over ``dataset``; NotFastPath when it cannot be batched."""
        raise NotFastPath(f"{self.kind} field '{field.name}' cannot be batched")


class Part:
    """One field's share of a batch, made once per Batcher (the module docstring). Defaults: nothing in
    the slot, nothing to fill or replace, the fill's object as the batch entry."""

    # True: filled after every other part, once the image parts have put this batch's plans in
    # ``batcher.plans`` (image field -> ``transforms.Plan``): a mask follows its image's plan (fields/mask.py)
    after_images = False

    def __init__(self, field: Any):
        self.field, self.name = field, field.name

    def buffers(self, batcher: Any, b: int, alloc: Callable) -> dict:
        """Slot tensors for ``b`` samples by name; ``alloc(shape, torch dtype)`` makes one."""
        return {}

    def fill(self, batcher: Any, slot: Any, at: Any, indices: np.ndarray, rng: Any, pool: Any, failed: dict) -> Any:
        """Fill this field's buffers of ``slot``; record bad samples in ``failed`` (k -> message naming
        the field). Returns what ``collate`` needs besides the slot (None, a length, a list)."""
        return None

    def replace(self, batcher: Any, slot: Any, n: int, obj: Any, bad: list, sources: list) -> None:
        """Samples ``bad`` take the values of samples ``sources`` (on_error='skip')."""

    def collate(self, tensors: dict, n: int, obj: Any, tensor_transforms: bool, cpu_output: Callable) -> Any:
        """The batch entry, as default_collate would give it: views of the slot's ``tensors``."""
        return obj

    def split(self, value: Any, n: int) -> list:
        """The batch entry as ``n`` values, each as ds[i] gives it."""
        return list(value)


class RowsPart(Part):
    """A field whose slot buffer is one tensor of ``n`` equal rows named after the field: a bad sample takes
    another's row, the batch entry is the first ``n`` rows, and a sample is its row."""

    def replace(self, batcher: Any, slot: Any, n: int, obj: Any, bad: list, sources: list) -> None:
        arr = slot.arrays[self.name]
        for k, src in zip(bad, sources):
            arr[k] = arr[src]

    def collate(self, tensors: dict, n: int, obj: Any, tensor_transforms: bool, cpu_output: Callable) -> Any:
        return tensors[self.name][:n]

    def split(self, value: Any, n: int) -> list:
        return list(value.unbind(0))


class FixedPart(RowsPart):
    """A kind stored as one fixed-size column ``values`` (``column``, the codec's): gathered by the native row
    copy into an (n, *column.shape) buffer of its dtype."""

    def __init__(self, field: Any, column: Column):
        super().__init__(field)
        self.column = column

    def buffers(self, batcher: Any, b: int, alloc: Callable) -> dict:
        return {self.name: alloc((b,) + tuple(self.column.shape), torch_dtype(self.column.dtype))}

    def fill(self, batcher: Any, slot: Any, at: Any, indices: np.ndarray, rng: Any, pool: Any, failed: dict) -> None:
        # the reader says where the rows lie; the native gather copies them
        native().gather_rows(pool, *batcher.reader.row_sources(at, self.name), slot.arrays[self.name][: len(indices)])


class ObjectPart(Part):
    """A kind read per sample into a Python object from its blob (``value(blob)``; ValueError marks the
    sample bad). Not in the slot: the batch entry is the list."""

    def __init__(self, field: Any, value: Callable, empty: Any):
        super().__init__(field)
        self.value, self.empty = value, empty

    def fill(self, batcher: Any, slot: Any, at: Any, indices: np.ndarray, rng: Any, pool: Any, failed: dict) -> list:
        out = []
        blob, value = batcher.reader.blob, self.value
        for k in range(len(at)):
            try:
                out.append(value(blob(at, self.name, k)))
            except ValueError as e:
                failed.setdefault(k, f"field '{self.name}': {e}")
                out.append(self.empty)
        return out

    def replace(self, batcher: Any, slot: Any, n: int, obj: Any, bad: list, sources: list) -> None:
        for k, src in zip(bad, sources):
            obj[k] = obj[src]
