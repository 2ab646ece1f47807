"""The one protocol every stage of the chain speaks, in the spirit of torchdata's ``nodes.BaseNode``.

A stage is an iterator over its upstream (``source``): ``next`` gives the next item, ``state()`` says where
it stands (a small dict, its upstream's nested under ``"source"``), ``reset(state)`` starts it over from
such a state (None: from where its upstream starts). A stage knows its upstream and the collaborators it
was handed (an order, a batcher, a slot ring, the stats), never the loader.

A stage that holds items ahead (read-ahead, a producer thread's queue, the device copies in flight) follows
torchdata's ``Prefetcher``: each item it holds carries its upstream's state as it was right after that item was
made, and the stage's own state is the upstream state of the next item it would hand out (``snapshot``): what
it holds ahead is not part of its state. Its ``reset`` drops what it holds, resets the upstream from that
state, and fills again from there. So a state saved anywhere in the chain, restored into a fresh chain, gives
the same rest of the stream.
"""

from __future__ import annotations

from typing import Any


class Stage:
    source: Any = None

    def __iter__(self):
        return self

    def __next__(self) -> Any:  # pragma: no cover - every stage defines it
        raise NotImplementedError

    def state(self) -> dict:
        return {"source": self.source.state()} if isinstance(self.source, Stage) else {}

    def reset(self, state: dict | None = None) -> None:
        if isinstance(self.source, Stage):
            self.source.reset(None if state is None else state.get("source"))

    def close(self) -> None:
        if isinstance(self.source, Stage):
            self.source.close()


def upstream_state(source: Any) -> dict | None:
    """``source``'s state now (None when it is no stage): what a prefetching stage records with each item."""
    return source.state() if isinstance(source, Stage) else None


def nested(snapshot: dict | None) -> dict:
    """A prefetching stage's state from its ``snapshot`` (the upstream state of the next item it hands out)."""
    return {} if snapshot is None else {"source": snapshot}


def innermost(state: dict | None) -> dict | None:
    """The first stage's part of a chain's nested ``state`` (``order.Jobs``'s: its epoch and next batch)."""
    while isinstance(state, dict) and "source" in state:
        state = state["source"]
    return state


def shape(state: Any) -> Any:
    """The structure of a nested state (its keys, level by level): two chains built alike have one shape."""
    if isinstance(state, dict):
        return tuple(sorted((k, shape(v)) for k, v in state.items() if k == "source" or isinstance(v, dict))) + (
            tuple(sorted(k for k, v in state.items() if k != "source" and not isinstance(v, dict))),
        )
    return None
