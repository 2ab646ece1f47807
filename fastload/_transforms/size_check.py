"""``fastload.open``'s check of a dataset's stored image sizes against its image pipeline
(``ImagePipeline.check_sizes``): every sample planned once as a batch would plan it, in chunks, each crop-plan step
recording what it cannot plan (``_State.refuse``) instead of raising at the first, and each augmentation with a
``tile_refusal`` (GaussianBlur) asked about the output tile. Only sizes are tracked: a ``RandomResizedCrop`` (which
takes any image) and a padded window (only flips follow it) set the size without drawing boxes or index maps, a
``RandomResize`` plans its ``min_size`` (the worst case for every later step); other random draws never decide
whether a sample plans. So a sample no batch could take is refused at open, counted and named, not met at whichever
batch holds it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["Refusal", "check"]


class Refusal:
    """What one step refused of one chunk of a dataset (``_State.refuse`` while checking)."""

    SHOWN = 5  # samples named in the message

    def __init__(self, step: Any, need: str, fix: str, samples: np.ndarray, details: list[str]) -> None:
        self.step, self.need, self.fix, self.samples, self.details = step, need, fix, samples, details

    @staticmethod
    def message(group: list[Refusal], total: int) -> str:
        """One step's refusals over the chunks of a dataset of ``total`` samples, as one sentence."""
        first = group[0]
        count = sum(len(r.samples) for r in group)
        named = [(int(i), d) for r in group for i, d in zip(r.samples, r.details)][: Refusal.SHOWN]
        more = f" and {count - len(named)} more" if count > len(named) else ""
        which = "; ".join(f"sample {i}: {d}" for i, d in named)
        return (
            f"{first.step!r} needs {first.need}; {count} of the dataset's {total} samples "
            f"{'does' if count == 1 else 'do'} not meet that ({which}{more}); {first.fix}"
        )


def check(
    pipe: Any, heights: np.ndarray, widths: np.ndarray, state_type: Any, apply: Any, chunk: int = 8192
) -> str | None:
    """``pipe.check_sizes``: the refusals of every step over the whole dataset, one sentence per step in pipeline
    order, or None. ``state_type``: ``crop_plan._State``, ``apply(t, state, rng)``: a crop-plan step's planning
    (``base.plan_step``; both passed in: ``crop_plan.py`` imports this module's ``Refusal``). Empty images are left
    to the decoder's error."""
    h, w = np.asarray(heights, dtype=np.int64), np.asarray(widths, dtype=np.int64)
    rows = np.flatnonzero((h > 0) & (w > 0))
    groups: dict[tuple[int, str], list[Refusal]] = {}
    rng = np.random.default_rng(0)
    for lo in range(0, len(rows), chunk):
        part = rows[lo : lo + chunk]
        state = state_type(h[part], w[part], checking=True)
        state.index = part
        for k, t in enumerate(pipe.transforms):
            state.rest = pipe.transforms[k + 1 :]
            apply(t, state, rng)
            _collect(state, k, groups)
            if not state.h.size:
                break
        if state.h.size and pipe.augment:  # what an augmentation needs of the output tile (GaussianBlur)
            n = state.h.shape[0]
            hw = np.stack([state.h, state.w], axis=1) if state.tile_hw is None else np.tile(state.tile_hw, (n, 1))
            for k, t in enumerate(_nested(pipe.augment), start=len(pipe.transforms)):
                check_tile = getattr(t, "tile_refusal", None)
                if check_tile is None or not hw.size:
                    continue
                bad, need, fix = check_tile(hw)
                keep = state.refuse(
                    t,
                    bad,
                    need,
                    lambda i, hw=hw, state=state: (
                        f"{hw[i, 0]}x{hw[i, 1]} there (source {state.src_h[i]}x{state.src_w[i]})"
                    ),
                    fix,
                )
                _collect(state, k, groups)
                if keep is not None:
                    hw = hw[keep]
    if not groups:
        return None
    return "\n".join(Refusal.message(g, len(h)) for _, g in sorted(groups.items(), key=lambda kv: kv[0][0]))


def _collect(state: Any, step: int, groups: dict) -> None:
    for r in state.refusals:
        groups.setdefault((step, r.need), []).append(r)
    state.refusals.clear()


def _nested(transforms: Sequence[Any]) -> list[Any]:
    """``transforms`` and those inside them, in order: a combinator's (RandomApply, RandomChoice, RandomOrder:
    ``transforms``) and a transform's own parts (ThreeAugment's blur: ``parts()``)."""
    out: list[Any] = []
    for t in transforms:
        out.append(t)
        inner = getattr(t, "transforms", None)
        if isinstance(inner, (list, tuple)):
            out.extend(_nested(inner))
        parts = getattr(t, "parts", None)
        if callable(parts):
            out.extend(_nested(parts()))
    return out
