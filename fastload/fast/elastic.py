"""Elastic resume: a mid-epoch position saved by ``N`` ranks at batch size ``B`` goes on over ``M`` ranks at ``B'``.

An order's epoch is one global sequence (``Order._global_sequence``), split over the ranks by the rule of torch's
``DistributedSampler`` and ``BatchSampler`` (``split_positions``). A saved state names the split it was taken
in (``world_size``, ``batch_size``, ``drop_last``) and how many batches the ranks had received (``batches_done``:
all ranks step together under DDP, so one rank's state describes all of them; a list of every rank's state may
say each one's count). From those the *consumed* positions of the global sequence are known again
(``consumed_mask``). The rest of the epoch -- the positions not consumed, in the global sequence's order -- is
split over the new ranks by the same rule as a fresh epoch (padding by wrapping around to its start, or cutting
with ``drop_last``) and batched at the new batch size. A state saved inside such a resumed epoch carries the
positions consumed before its split (``consumed``: a bit per position, packed), so a job can be resumed
elastically several times within one epoch. Later epochs are the new configuration's own.

A sample's pixels do not depend on the split: its random draws are keyed by (seed, epoch, sample index)
(``_draws.py``).
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

# What may differ between the loader that saved a position and the one resuming it (elastic); every other
# setting of the order names the epoch's sequence itself and must agree.
SPLIT_KEYS = ("world_size", "batch_size", "drop_last")


def split_positions(m: int, rank: int, world: int, batch: int, drop_last: bool) -> np.ndarray:
    """Positions (into a sequence of ``m``) that ``rank`` of ``world`` reads, in order: padded by wrapping to a
    multiple of ``world`` (cut to one with ``drop_last``), strided by rank, cut to whole batches with
    ``drop_last`` -- ``DistributedSampler`` then ``BatchSampler``."""
    per = m // world if drop_last else -(-m // world)
    pos = np.arange(rank, per * world, world, dtype=np.int64)
    if m:
        pos %= m
    if drop_last:
        pos = pos[: (per // batch) * batch]
    return pos


def split_batches(m: int, world: int, batch: int, drop_last: bool) -> int:
    """How many batches each rank gets when a sequence of ``m`` is split by ``split_positions``'s rule."""
    per = m // world if drop_last else -(-m // world)
    return per // batch if drop_last else -(-per // batch)


def pack_mask(mask: np.ndarray | None) -> str:
    """A consumed-position mask as text for a state (a bit per position, base64; JSON- and DCP-friendly); empty:
    nothing consumed before the split."""
    return "" if mask is None else base64.b64encode(np.packbits(mask.astype(bool)).tobytes()).decode("ascii")


def unpack_mask(text: Any, n: int) -> np.ndarray | None:
    if text is None or text == "":
        return None
    try:
        data = base64.b64decode(text, validate=True) if isinstance(text, str) else None
    except ValueError:
        data = None
    if data is None or len(data) != (n + 7) // 8:
        raise ValueError(
            f"the state's 'consumed' should be base64 text of {(n + 7) // 8} bytes (a bit per position of the "
            f"epoch's {n}), got {type(text).__name__} {str(text)[:40]!r}; pass the dict state_dict() returned, "
            f"unchanged"
        )
    return np.unpackbits(np.frombuffer(data, dtype=np.uint8), count=n).astype(bool)


def gather(states: Any, version_ok, not_a_state) -> tuple[dict, dict[int, int] | None]:
    """One state, or a list of every rank's states of one step: (the first state, each rank's batches done, or
    None when one state stands for all ranks). ``version_ok(state)`` says whether a dict is a loader position;
    ``not_a_state(state)`` is the error for one that is not."""
    many = isinstance(states, (list, tuple))
    group = list(states) if many else [states]
    if not group:
        raise ValueError("load_state_dict got an empty list: pass one state, or the states of all ranks")
    for s in group:
        if not version_ok(s):
            raise not_a_state(s)
    first = group[0]
    if not many:
        return first, None
    same = ("epoch", "seed", "consumed", "tokens_before", "tokens_per_batch", *SPLIT_KEYS)
    for s in group[1:]:
        diff = [k for k in same if s.get(k) != first.get(k) and k in s]
        if diff:
            raise ValueError(
                f"the states given to load_state_dict were not saved by the ranks of one loader at one step: they "
                f"differ in {', '.join(diff)}; pass the states that all ranks saved together"
            )
    world = int(first["world_size"])
    ranks = sorted(int(s.get("rank", -1)) for s in group)
    if ranks != list(range(world)):
        raise ValueError(
            f"load_state_dict got the states of ranks {ranks}, but they were saved with world_size={world}: pass "
            f"the states of all ranks 0 .. {world - 1} (one each), or a single state when all ranks had received "
            f"the same number of batches"
        )
    return first, {int(s["rank"]): int(s["batches_done"]) for s in group}
