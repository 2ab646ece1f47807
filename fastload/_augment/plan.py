"""The augmentation plan: one batch's per-sample geometry and ordered pixel operations, drawn on the host.

A transform never touches pixels while planning. For a batch of ``n`` samples whose output tiles are
``out_hw[i]`` it draws, from the batch's draws (a numpy generator, or the loader's per-sample draws: ``_draws.py``;
a transform that draws for a subset of its samples draws from ``at(rng, subset)``), and records:

- a **geometric part** per sample (:class:`Geometry`): the crop box and output size the decoder already
  executes, horizontal and vertical flips, and a 2x3 inverse affine matrix (output pixel coordinates -> input
  pixel coordinates of the tile, PIL's ``Image.transform(AFFINE)`` convention: pixel ``(x, y)`` covers
  ``[x, x+1) x [y, y+1)``) with its interpolation and fill;
- an ordered list of **steps** (:class:`Step`): one pixel operation, the sorted indices of the samples it
  applies to, and its parameters as numpy columns (one row per listed sample). A sample's operations are the
  steps that list it, in step order. Engines run a step over its subset in one go, so the batched engine
  never loops over samples in Python.

Execution order for every engine: crop -> resize -> horizontal flip -> vertical flip -> affine -> steps.
The policies' geometric operations (ShearX/Y, TranslateX/Y, Rotate) go into the affine matrix, so they run
before the sample's pixel operations even when torchvision would run them after one (RandAugment with
``num_ops >= 2``, AutoAugment's second sub-policy); the difference is limited to the fill area and to
histogram-based operations seeing it. A flip planned after an affine is composed into the matrix.

Adding an operation is one :func:`define_op` call (name, parameter columns, a PIL kernel, a torch kernel) in a
module that ``ops.py`` lists, a native kernel of the same name (csrc/augment.h ``FASTLOAD_AUG_OPS``, checked
against these when ``engine_native.py`` is imported), plus the transform that draws its parameters; engines look
kernels up in :data:`OPS` through ``ops.py``, which has them all.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .._draws import SampleDraws, at  # noqa: F401  (at: the ops' one import for drawing for a subset of a batch)

__all__ = ["OPS", "Augment", "AugmentPlan", "Geometry", "OpDef", "PlanBuilder", "Step", "define_op", "plan_batch"]

#: the affine's resampling (Geometry.interpolation): PIL's NEAREST, BILINEAR and BICUBIC (Image.transform); bicubic
#: only timm's policies plan (``timm_policies.py``), torchvision's take nearest or bilinear (``check_interpolation``)
NEAREST, BILINEAR, BICUBIC = 0, 1, 2


@dataclass(frozen=True)
class OpDef:
    """A pixel operation: its parameter columns and one kernel per engine.

    ``columns`` maps a column name to (numpy dtype, per-sample shape). ``pil(image, params)`` takes and
    returns an RGB ``PIL.Image`` with ``params`` holding this sample's row of each column; ``torch(x, params)``
    takes the subset ``(k, C, H, W)`` of the batch and the columns as tensors of ``k`` rows on its device.
    ``floats``: the torch kernel also accepts float batches in [0, 1] (else uint8 only)."""

    name: str
    columns: dict[str, tuple[str, tuple[int, ...]]]
    pil: Callable[..., Any]
    torch: Callable[..., Any]
    floats: bool = False


OPS: dict[str, OpDef] = {}


def define_op(
    name: str,
    columns: dict[str, tuple[str, tuple[int, ...]]],
    *,
    pil: Callable[..., Any],
    torch: Callable[..., Any],
    floats: bool = False,
) -> OpDef:
    """Register a pixel operation (see :class:`OpDef`); a name is registered once."""
    if name in OPS:
        raise ValueError(f"pixel operation {name!r} is already defined")
    OPS[name] = op = OpDef(name, dict(columns), pil, torch, floats)
    return op


@dataclass
class Step:
    """One pixel operation over the samples ``index`` (sorted, unique) with one parameter row per sample."""

    op: str
    index: np.ndarray
    params: dict[str, np.ndarray]

    def row(self, sample: int) -> dict[str, Any] | None:
        """This step's parameters for batch sample ``sample``, or None when the step skips it."""
        j = int(np.searchsorted(self.index, sample))
        if j >= self.index.size or self.index[j] != sample:
            return None
        return {k: v[j] for k, v in self.params.items()}


@dataclass
class Geometry:
    """Per-sample geometry (see the module docstring). ``crops`` is None when the plan starts from tiles that
    are already cropped and resized (what the batched engine receives from the decoder)."""

    out_hw: np.ndarray  # int64 (n, 2)
    hflip: np.ndarray  # bool (n,)
    vflip: np.ndarray  # bool (n,)
    affine: np.ndarray  # float64 (n, 2, 3): output pixel coordinates -> input tile coordinates
    has_affine: np.ndarray  # bool (n,)
    interpolation: np.ndarray  # uint8 (n,): NEAREST or BILINEAR, for the affine
    fill: np.ndarray  # float64 (n, 3): the affine's fill per channel
    crops: np.ndarray | None = None  # int64 (n, 4): top, left, height, width in source pixels
    pad: Any = None  # padding.Padding: crop windows reaching outside the image (RandomCrop), assembled first
    mask_fill: np.ndarray | None = None  # uint8 (n,): the affine's fill on a mask field (None: 255)


@dataclass
class AugmentPlan:
    """What every engine executes for one batch."""

    geometry: Geometry
    steps: list[Step] = field(default_factory=list)
    channels: int = 3  # 1 after Grayscale(num_output_channels=1)

    @property
    def n(self) -> int:
        return int(self.geometry.out_hw.shape[0])

    def take(self, lo: int, hi: int) -> AugmentPlan:
        """The plan of samples ``lo .. hi-1``, renumbered from 0 (a decoder given part of a batch gets its part:
        ``fastload.transforms.Plan``'s slices)."""
        g = self.geometry
        geo = Geometry(
            g.out_hw[lo:hi],
            g.hflip[lo:hi],
            g.vflip[lo:hi],
            g.affine[lo:hi],
            g.has_affine[lo:hi],
            g.interpolation[lo:hi],
            g.fill[lo:hi],
            None if g.crops is None else g.crops[lo:hi],
            None if g.pad is None else g.pad.take(lo, hi),
            None if g.mask_fill is None else g.mask_fill[lo:hi],
        )
        steps = []
        for step in self.steps:
            a, b = np.searchsorted(step.index, [lo, hi])
            if b > a:
                steps.append(Step(step.op, step.index[a:b] - lo, {k: v[a:b] for k, v in step.params.items()}))
        return AugmentPlan(geo, steps, self.channels)

    def ops_of(self, sample: int) -> list[tuple[str, dict[str, Any]]]:
        """Sample ``sample``'s pixel operations in order, with its parameters (for the reference and debugging)."""
        out = []
        for step in self.steps:
            row = step.row(sample)
            if row is not None:
                out.append((step.op, row))
        return out


_IDENTITY = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])


class PlanBuilder:
    """Collects a batch's plan while transforms draw. Transforms call :meth:`add`, :meth:`affine`, :meth:`flip`."""

    def __init__(self, out_hw: Any, crops: Any = None) -> None:
        hw = np.asarray(out_hw)
        if hw.ndim != 2 or hw.shape[1] != 2 or not np.issubdtype(hw.dtype, np.integer) or (hw.size and hw.min() <= 0):
            raise ValueError(
                f"out_hw must be an (n, 2) array of positive ints (each tile's height, width), "
                f"got {hw.dtype} array of shape {hw.shape}"
            )
        n = hw.shape[0]
        self.n = n
        self.out_hw = hw.astype(np.int64)
        self._crops = None if crops is None else np.asarray(crops, dtype=np.int64).reshape(n, 4)
        self.hflip = np.zeros(n, dtype=bool)
        self.vflip = np.zeros(n, dtype=bool)
        self.affine_m = np.tile(_IDENTITY, (n, 1, 1))
        self.has_affine = np.zeros(n, dtype=bool)
        self.interpolation = np.zeros(n, dtype=np.uint8)
        self.fill = np.zeros((n, 3))
        self.mask_fill = np.full(n, 255, np.uint8)  # a mask field's fill for the affine (fields/mask.py)
        self.steps: list[Step] = []
        self.channels = 3
        self.pad: Any = None  # padding.Padding, set by the crop plan (RandomCrop with padding)

    @classmethod
    def from_crop_plan(cls, crop_plan: Any) -> PlanBuilder:
        """Start from the geometric plan ``fastload.transforms.ImagePipeline.plan`` makes today (crop boxes,
        horizontal flips, output sizes), so augmentations extend it."""
        b = cls(np.asarray(crop_plan.out_hw).astype(np.int64), crops=crop_plan.crops)
        b.hflip = np.asarray(crop_plan.flips).astype(bool).copy()
        return b

    def add(self, op: str, index: np.ndarray, **columns: Any) -> None:
        """Append a step of ``op`` over ``index`` (sample positions) with one row per listed sample."""
        spec = OPS[op]
        index = np.asarray(index, dtype=np.int64)
        if set(columns) != set(spec.columns):
            raise ValueError(f"{op}: columns {sorted(columns)} given, {sorted(spec.columns)} expected")
        if index.size == 0:
            return
        order = np.argsort(index, kind="stable")
        ordered = index[order]
        if ordered[0] < 0 or ordered[-1] >= self.n or np.any(ordered[1:] == ordered[:-1]):
            raise ValueError(
                f"{op}: index must list distinct samples of the batch (0 to {self.n - 1}), got "
                f"{index.tolist()[:10]}{'...' if index.size > 10 else ''}"
            )
        params = {}
        for name, (dtype, shape) in spec.columns.items():
            col = np.asarray(columns[name], dtype=dtype)
            col = np.broadcast_to(col, (index.size, *shape)) if col.ndim == len(shape) else col
            if col.shape != (index.size, *shape):
                raise ValueError(f"{op}: column {name} has shape {col.shape}, expected {(index.size, *shape)}")
            params[name] = np.ascontiguousarray(col[order])
        self.steps.append(Step(op, ordered, params))

    def affine(
        self, index: np.ndarray, matrix: np.ndarray, interpolation: int, fill: np.ndarray, mask_fill: int = 255
    ) -> None:
        """Compose an inverse affine (k, 2, 3) after the samples' current geometry. Composed maps resample once,
        with the latest interpolation and fill (torchvision would resample, and fill, once per transform);
        ``mask_fill``: what a mask following the image shows outside."""
        index = np.asarray(index, dtype=np.int64)
        if index.size == 0:
            return
        cur = _homogeneous(self.affine_m[index])
        new = _homogeneous(np.asarray(matrix, dtype=np.float64))
        # The new map reads the image the old one produced: input <- old <- new.
        self.affine_m[index] = (cur @ new)[:, :2, :]
        self.has_affine[index] = True
        self.interpolation[index] = interpolation
        self.fill[index] = fill
        self.mask_fill[index] = mask_fill

    def flip(self, index: np.ndarray, horizontal: bool) -> None:
        """Mirror the samples ``index``; after an affine the mirror is composed into its matrix."""
        index = np.asarray(index, dtype=np.int64)
        plain, composed = index[~self.has_affine[index]], index[self.has_affine[index]]
        (self.hflip if horizontal else self.vflip)[plain] ^= True
        if composed.size:
            h, w = self.out_hw[composed, 0].astype(float), self.out_hw[composed, 1].astype(float)
            m = np.zeros((composed.size, 2, 3))
            if horizontal:
                m[:, 0, 0], m[:, 0, 2], m[:, 1, 1] = -1.0, w, 1.0
            else:
                m[:, 0, 0], m[:, 1, 1], m[:, 1, 2] = 1.0, -1.0, h
            cur = _homogeneous(self.affine_m[composed])
            self.affine_m[composed] = (cur @ _homogeneous(m))[:, :2, :]

    def whole_batch(self, index: np.ndarray) -> bool:
        return index.size == self.n

    def finish(self) -> AugmentPlan:
        geo = Geometry(
            self.out_hw,
            self.hflip,
            self.vflip,
            self.affine_m,
            self.has_affine,
            self.interpolation,
            self.fill,
            self._crops,
            self.pad,
            self.mask_fill,
        )
        return AugmentPlan(geo, self.steps, self.channels)


def _homogeneous(m: np.ndarray) -> np.ndarray:
    out = np.zeros((m.shape[0], 3, 3))
    out[:, :2, :] = m
    out[:, 2, 2] = 1.0
    return out


class Augment:
    """Base of the per-sample augmentations: a declaration that draws a plan, described by its params."""

    def plan(self, b: PlanBuilder, index: np.ndarray, rng: np.random.Generator) -> None:
        """Draw this transform's parameters for the samples ``index`` of the batch and record them in ``b``."""
        raise NotImplementedError

    def _params(self) -> dict[str, Any]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"name": type(self).__name__, **self._params()}

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.describe() == other.describe()

    def __hash__(self) -> int:
        return hash(repr(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._params().items())})"


def plan_batch(transforms: Sequence[Augment], out_hw: Any, rng: np.random.Generator, crops: Any = None) -> AugmentPlan:
    """Plan ``transforms`` (in order) for a batch whose tiles are ``out_hw`` (n, 2), drawing only from ``rng``."""
    if not isinstance(rng, (np.random.Generator, SampleDraws)):
        raise TypeError(
            f"rng must be a numpy.random.Generator or the loader's per-sample draws, got {type(rng).__name__}"
        )
    b = PlanBuilder(out_hw, crops)
    everyone = np.arange(b.n)
    for t in transforms:
        if not isinstance(t, Augment):
            raise TypeError(f"plan_batch: {t!r} ({type(t).__name__}) is not one of fastload's augmentations")
        t.plan(b, everyone, rng)
    return b.finish()


# ---- argument checks shared by the transforms (torchvision's messages, plus the transform's name) ----


def check_p(p: Any, what: str) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"{what}: p={p!r} should be a probability (a number in [0, 1])")
    return float(p)


def check_number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what}={value!r} should be a number")
    return float(value)


def check_interpolation(interpolation: Any, what: str) -> int:
    """ "nearest"/"bilinear" or torchvision's InterpolationMode (its ``.value`` is the same string)."""
    mode = getattr(interpolation, "value", interpolation)
    if mode == "nearest":
        return NEAREST
    if mode == "bilinear":
        return BILINEAR
    raise ValueError(f"{what}: interpolation={interpolation!r} is not supported; use 'nearest' or 'bilinear'")


def check_fill(fill: Any, what: str) -> np.ndarray:
    """torchvision's fill: None (0), a number, or one number per channel (1 or 3)."""
    if fill is None:
        return np.zeros(3)
    if isinstance(fill, numbers.Real) and not isinstance(fill, bool):
        return np.full(3, float(fill))
    if (
        isinstance(fill, (list, tuple))
        and len(fill) in (1, 3)
        and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in fill)
    ):
        return np.broadcast_to(np.asarray(fill, dtype=np.float64), (3,)).copy()
    raise TypeError(f"{what}: fill={fill!r} should be None, a number or a sequence of 1 or 3 numbers")


def applied(rng: np.random.Generator, index: np.ndarray, p: float) -> np.ndarray:
    """torchvision's ``_RandomApplyTransform``: a sample is transformed when its uniform draw is ``< p``."""
    return index[rng.random(index.size) < p]
