"""timm's RandAugment and AutoAugment planned natively (issue 30 item 1), with timm's op set and magnitude rules.

``timm/data/auto_augment.py`` (timm 1.0): an ``AugmentOp`` is a name, a probability, a magnitude (0-10 scale, noise
``magnitude_std``, clipped to ``[0, magnitude_max or 10]``) and hparams (``img_mean`` fill, ``interpolation``,
``translate_pct``/``translate_const``). Its ``__call__`` draws, in order: ``random() > prob`` skips it; the magnitude
noise (``gauss(m, std)``, or ``uniform(0, m)`` for ``std = inf``); the sign (``_randomly_negate``: ``-v`` when
``random() > 0.5``) for the signed ops; the resampling (``random.choice`` of bilinear/bicubic when its interpolation
is timm's 'random'). :class:`TimmRandAugment` chooses ``num_layers`` ops per sample (uniformly with replacement, as
``np.random.choice``; with ``choice_weights`` one after another without replacement, each by its weight among the
ops left); :class:`TimmAutoAugment` one sub-policy per sample, uniformly, and runs its ops in order.

Each op's argument is timm's ``LEVEL_TO_ARG`` in float64 in the same order of operations, so for the same draws
the arguments are timm's bit for bit; the pixels are the native kernels': ``solarize_add`` (a lookup table, exact),
solarize/posterize/invert/equalize/brightness/sharpness exact, colour and contrast exact at every factor
(``pil_color``/``pil_contrast``: PIL's own luma and blend, ``pil_enhance.py``), autocontrast within 1 level of
PIL's ``ImageOps`` (tests/augment/test_augment_engines.py's table), and the geometric ops (ShearX/Y,
TranslateX/Y(Rel), Rotate) PIL's ``Image.transform(AFFINE)`` with timm's matrices, fill and resampling (bicubic
included: csrc/warp.cc). Draws are keyed per sample (``fastload/_draws.py``), not timm's ``random`` stream: the same
distribution, other values.

What is not timm's: the plan runs a sample's geometric ops before its pixel ops and composes several geometric ops
into one resampling (``plan.py``), where timm runs them in the drawn order, one resampling each: the same pixels
whenever a sample's geometric op comes first and alone; else they differ in the fill area (and in what a histogram
op sees of it) and by a resampling's rounding. timm's ``Desaturate``/``GaussianBlur``/``GaussianBlurRand`` (the
``3a`` policy) are not planned (PIL's box-approximated blur): :func:`check_ops` refuses them, and the converter then
runs timm's object per sample, saying why.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .._draws import box_muller
from .pil_enhance import pil_luma
from .plan import BICUBIC, BILINEAR, NEAREST, Augment, PlanBuilder, at

__all__ = ["TimmAutoAugment", "TimmOp", "TimmRandAugment", "check_ops"]

LEVEL_DENOM = 10.0

#: the ops planned natively, and whether timm negates their argument at random
SIGNED = {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel"}
SIGNED |= {f"{n}Increasing" for n in ("Color", "Contrast", "Brightness", "Sharpness")}
GEOMETRIC = {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel"}
PLAIN = {"AutoContrast": "autocontrast", "Equalize": "equalize", "Invert": "invert"}
#: timm's enhance ops -> the plan's (PIL's ImageEnhance byte for byte: brightness and sharpness are PIL's arithmetic
#: as they are; colour and contrast need PIL's own luma and blend, pil_enhance.py)
ENHANCE = {"Color": "pil_color", "Contrast": "pil_contrast", "Brightness": "brightness", "Sharpness": "sharpness"}
KNOWN = (
    set(PLAIN)
    | set(ENHANCE)
    | {f"{n}Increasing" for n in ENHANCE}
    | GEOMETRIC
    | {"Posterize", "PosterizeIncreasing", "PosterizeOriginal", "Solarize", "SolarizeIncreasing", "SolarizeAdd"}
)

#: timm's interpolation (PIL's Resampling values: 0 nearest, 2 bilinear, 3 bicubic) -> the plan's affine code
_RESAMPLE = {0: NEAREST, 2: BILINEAR, 3: BICUBIC}
RANDOM = -1  # timm's default: bilinear or bicubic per op call, uniformly


class TimmOp:
    """One timm ``AugmentOp``: ``name`` (timm's), ``prob``, ``magnitude`` (0-10 scale), ``magnitude_std``,
    ``magnitude_max``, ``translate_pct``, ``translate_const``, ``fill`` (3 ints, timm's ``img_mean``) and
    ``interpolation`` (``NEAREST``/``BILINEAR``/``BICUBIC`` of plan.py, or :data:`RANDOM`)."""

    def __init__(
        self,
        name: str,
        prob: float = 0.5,
        magnitude: float = 10.0,
        *,
        magnitude_std: float = 0.0,
        magnitude_max: float | None = None,
        translate_pct: float = 0.45,
        translate_const: float = 250.0,
        fill: Sequence[int] = (128, 128, 128),
        interpolation: int = RANDOM,
    ) -> None:
        if name not in KNOWN:
            raise ValueError(f"timm's {name} op has no native plan (PIL's arithmetic fastload does not reproduce)")
        if interpolation not in (NEAREST, BILINEAR, BICUBIC, RANDOM):
            raise ValueError(f"{name}: interpolation={interpolation!r} should be nearest, bilinear, bicubic or random")
        fill = tuple(int(v) for v in fill)
        if len(fill) != 3 or not all(0 <= v <= 255 for v in fill):
            raise ValueError(f"{name}: fill={fill!r} should be 3 integers in [0, 255] (timm's img_mean)")
        self.name, self.prob, self.magnitude = name, float(prob), float(magnitude)
        self.magnitude_std = float(magnitude_std)
        self.magnitude_max = None if magnitude_max is None else float(magnitude_max)
        self.translate_pct, self.translate_const = float(translate_pct), float(translate_const)
        self.fill, self.interpolation = fill, interpolation

    def describe(self) -> dict[str, Any]:
        return dict(vars(self))

    def __repr__(self) -> str:
        return f"TimmOp({self.name!r}, p={self.prob}, m={self.magnitude}, mstd={self.magnitude_std})"

    def magnitudes(self, noise: np.ndarray) -> np.ndarray:
        """timm's magnitude for calls whose noise draw was ``noise`` ((k, 2) uniforms in [0, 1): one draw per call
        whatever ``magnitude_std``, so a sample's draws do not depend on its op's settings): ``uniform(0, m)`` from
        the first column for ``std = inf``, ``gauss(m, std)`` from both for a finite ``std > 0``
        (``_draws.box_muller``: per-sample draws' ``normal``), else (0, negative, ``-inf``: timm's ``std > 0`` test
        fails) ``m`` itself; clipped to ``[0, magnitude_max or 10]``."""
        if self.magnitude_std == math.inf:
            m = noise[:, 0] * self.magnitude  # random.uniform(0, m): 0 + (m - 0) * u
        elif self.magnitude_std > 0:
            m = self.magnitude + box_muller(noise) * self.magnitude_std
        else:
            m = np.full(len(noise), self.magnitude)
        upper = self.magnitude_max or LEVEL_DENOM
        return np.maximum(0.0, np.minimum(m, upper))

    def apply(self, b: PlanBuilder, index: np.ndarray, m: np.ndarray, negate: np.ndarray, bicubic: np.ndarray) -> None:
        """Plan this op on the samples ``index`` with magnitudes ``m``, signs (``negate``: timm's ``random() >
        0.5``) and, for timm's random interpolation, ``bicubic`` per sample."""
        if index.size == 0:
            return
        name = self.name
        if name in PLAIN:
            b.add(PLAIN[name], index)
            return
        if name.startswith("Posterize"):
            bits = np.trunc(m / LEVEL_DENOM * 4).astype(np.int64)  # int((level / 10) * 4)
            bits = {"Posterize": bits, "PosterizeIncreasing": 4 - bits, "PosterizeOriginal": bits + 4}[name]
            # below 0 bits (PosterizeIncreasing past magnitude 12.5, with mmax > 10) PIL's mask ~(2 ** (8 - bits) - 1)
            # clears every bit, as at 0 bits
            bits = np.maximum(bits, 0)
            keep = bits < 8  # timm: bits_to_keep >= 8 leaves the image as it is
            b.add("posterize", index[keep], bits=bits[keep])
            return
        if name in ("Solarize", "SolarizeIncreasing"):
            thresh = np.minimum(256, np.trunc(m / LEVEL_DENOM * 256)).astype(np.int64)
            thresh = thresh if name == "Solarize" else 256 - thresh
            b.add("solarize", index, threshold=thresh.astype(np.float64))  # PIL inverts values >= thresh
            return
        if name == "SolarizeAdd":
            add = np.minimum(128, np.trunc(m / LEVEL_DENOM * 110)).astype(np.int64)
            b.add("solarize_add", index, add=add, threshold=np.full(index.size, 128, np.int64))
            return
        if name in ENHANCE:
            _enhance(b, ENHANCE[name], index, (m / LEVEL_DENOM) * 1.8 + 0.1)
            return
        if name.endswith("Increasing"):  # ColorIncreasing, ...: max(0.1, 1.0 + randomly negated (m / 10) * 0.9)
            level = (m / LEVEL_DENOM) * 0.9
            _enhance(
                b, ENHANCE[name[: -len("Increasing")]], index, np.maximum(0.1, 1.0 + np.where(negate, -level, level))
            )
            return
        self._geometry(b, index, m, negate, bicubic)

    def _geometry(
        self, b: PlanBuilder, index: np.ndarray, m: np.ndarray, negate: np.ndarray, bicubic: np.ndarray
    ) -> None:
        name, k = self.name, index.size
        hw = b.out_hw[index].astype(np.float64)
        if name == "Rotate":
            level = (m / LEVEL_DENOM) * 30.0
        elif name.startswith("Shear"):
            level = (m / LEVEL_DENOM) * 0.3
        elif name.endswith("Rel"):
            level = (m / LEVEL_DENOM) * self.translate_pct
        else:
            level = (m / LEVEL_DENOM) * self.translate_const
        level = np.where(negate, -level, level)
        mat = np.zeros((k, 2, 3))
        mat[:, 0, 0] = mat[:, 1, 1] = 1.0
        if name == "ShearX":
            mat[:, 0, 1] = level
        elif name == "ShearY":
            mat[:, 1, 0] = level
        elif name == "TranslateX":
            mat[:, 0, 2] = level
        elif name == "TranslateY":
            mat[:, 1, 2] = level
        elif name == "TranslateXRel":
            mat[:, 0, 2] = level * hw[:, 1]  # pct * img.size[0]
        elif name == "TranslateYRel":
            mat[:, 1, 2] = level * hw[:, 0]
        else:
            mat = _pil_rotate(level, hw)
        if self.interpolation == RANDOM:
            modes = np.where(bicubic, BICUBIC, BILINEAR)
        else:
            modes = np.full(k, self.interpolation)
        fill = np.asarray(self.fill, np.float64)
        for mode in np.unique(modes):
            sel = modes == mode
            b.affine(index[sel], mat[sel], int(mode), fill)


def _enhance(b: PlanBuilder, op: str, index: np.ndarray, factor: np.ndarray) -> None:
    if op.startswith("pil_"):  # PIL's luma as the installed PIL computes it (pil_enhance.py)
        b.add(op, index, factor=factor, luma=np.full(index.size, pil_luma(), np.int64))
    else:
        b.add(op, index, factor=factor)


def _pil_rotate(degrees: np.ndarray, hw: np.ndarray) -> np.ndarray:
    """PIL's ``Image.rotate(angle)`` matrix (same size, about the centre; Image.py), as Image.transform takes it."""
    # Python's round(x, 15), as PIL: numpy's round scales by 1e15 and can end on the other decimal (-0.707106781186548
    # for PIL's -0.707106781186547 at 45 degrees), a matrix that moves a pixel by a level now and then
    angle = [-math.radians(d) for d in (degrees % 360.0).tolist()]
    cos = np.array([round(math.cos(a), 15) for a in angle], np.float64)
    sin = np.array([round(math.sin(a), 15) for a in angle], np.float64)
    w, h = hw[:, 1], hw[:, 0]
    cx, cy = w / 2.0, h / 2.0
    m = np.zeros((degrees.size, 2, 3))
    m[:, 0, 0], m[:, 0, 1], m[:, 1, 0], m[:, 1, 1] = cos, sin, -sin, cos
    m[:, 0, 2] = cos * -cx + sin * -cy + cx
    m[:, 1, 2] = -sin * -cx + cos * -cy + cy
    return m


def check_ops(names: Sequence[str], policy: str) -> None:
    """ValueError naming timm's ops of ``policy`` that are not planned natively (``3a``'s blur and desaturation)."""
    missing = sorted(set(names) - KNOWN)
    if missing:
        raise ValueError(
            f"timm's {policy} has {', '.join(missing)} (PIL's box-approximated blur, its own desaturation), "
            f"which fastload has no native plan for"
        )


def _call_each(b: PlanBuilder, ops: Sequence[TimmOp | None], which: np.ndarray, index: np.ndarray, rng: Any) -> None:
    """``AugmentOp.__call__`` of ``ops[which[i]]`` on sample ``index[i]`` (None: no call), for every sample at once:
    timm's draws, in its order, one of each per sample: ``random() > prob`` skips the op, the magnitude noise, the
    sign, the resampling. Every op draws the same calls (``TimmOp.magnitudes`` takes its noise from one draw of two
    columns), so the batch draws them together, in four calls rather than four per op: with per-sample draws
    (``_draws.SampleDraws``) each sample's values are those of a call on it alone."""
    k = index.size
    applied = rng.random(k)
    noise = rng.random((k, 2))
    negate = rng.random(k) > 0.5
    bicubic = rng.integers(0, 2, k) == 1  # random.choice((BILINEAR, BICUBIC))
    for j in np.unique(which):
        op = ops[int(j)]
        if op is None:
            continue
        rows = np.flatnonzero(which == j)
        rows = rows[applied[rows] <= op.prob]  # timm skips when random() > prob
        op.apply(b, index[rows], op.magnitudes(noise[rows]), negate[rows], bicubic[rows])


class TimmRandAugment(Augment):
    """timm's ``RandAugment(ops, num_layers, choice_weights)``: ``num_layers`` of ``ops`` per sample, each then
    applied as timm's ``AugmentOp`` (see the module docstring)."""

    def __init__(self, ops: Sequence[TimmOp], num_layers: int = 2, choice_weights: Sequence[float] | None = None):
        self.ops = list(ops)
        if not self.ops:
            raise ValueError("TimmRandAugment: no ops")
        self.num_layers = int(num_layers)
        if choice_weights is not None:
            w = np.asarray(choice_weights, np.float64)
            if w.shape != (len(self.ops),) or (w < 0).any() or w.sum() <= 0 or self.num_layers > np.count_nonzero(w):
                raise ValueError(
                    f"TimmRandAugment: choice_weights should be {len(self.ops)} weights >= 0 with at least "
                    f"num_layers={self.num_layers} of them > 0, got {choice_weights!r}"
                )
            self.choice_weights: np.ndarray | None = w / w.sum()
        else:
            self.choice_weights = None

    def _params(self) -> dict[str, Any]:
        weights = None if self.choice_weights is None else self.choice_weights.tolist()
        return {"ops": [op.describe() for op in self.ops], "num_layers": self.num_layers, "choice_weights": weights}

    def __repr__(self) -> str:  # the ops by name (describe() has every setting; a warning quotes this)
        weighted = "" if self.choice_weights is None else ", weighted"
        return f"TimmRandAugment(num_layers={self.num_layers}{weighted}, ops={self.ops!r})"

    def _choose(self, k: int, rng: Any) -> np.ndarray:
        """(k, num_layers) op indices: uniform with replacement, or weighted without replacement."""
        if self.choice_weights is None:
            return rng.integers(0, len(self.ops), (k, self.num_layers))
        left = np.tile(self.choice_weights, (k, 1))
        out = np.empty((k, self.num_layers), np.int64)
        for layer in range(self.num_layers):
            u = rng.random(k)
            cdf = np.cumsum(left, axis=1)
            pick = np.minimum((cdf < (u * cdf[:, -1])[:, None]).sum(axis=1), len(self.ops) - 1)
            out[:, layer] = pick
            left[np.arange(k), pick] = 0.0
        return out

    def plan(self, b: PlanBuilder, index: np.ndarray, rng: Any) -> None:
        chosen = self._choose(index.size, rng)
        for layer in range(self.num_layers):
            _call_each(b, self.ops, chosen[:, layer], index, rng)


class TimmAutoAugment(Augment):
    """timm's ``AutoAugment(policy)``: one sub-policy (a list of ops) per sample, uniformly, its ops in order."""

    def __init__(self, policy: Sequence[Sequence[TimmOp]]):
        self.policy = [list(sp) for sp in policy]
        if not self.policy or not all(self.policy):
            raise ValueError("TimmAutoAugment: the policy should be a non-empty list of non-empty sub-policies")

    def _params(self) -> dict[str, Any]:
        return {"policy": [[op.describe() for op in sp] for sp in self.policy]}

    def __repr__(self) -> str:  # sub-policies by op name (describe() has every setting; a warning quotes this)
        return f"TimmAutoAugment({len(self.policy)} sub-policies: {[[op.name for op in sp] for sp in self.policy]})"

    def plan(self, b: PlanBuilder, index: np.ndarray, rng: Any) -> None:
        chosen = rng.integers(0, len(self.policy), index.size)
        lengths = np.array([len(sub) for sub in self.policy])
        for p in range(int(lengths.max())):  # each sample's p-th op, for the samples whose sub-policy has one
            rows = np.flatnonzero(lengths[chosen] > p)
            ops = [sub[p] if len(sub) > p else None for sub in self.policy]
            _call_each(b, ops, chosen[rows], index[rows], at(rng, index[rows]))  # batch positions, as ``at`` takes them
