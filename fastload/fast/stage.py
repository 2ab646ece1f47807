"""The one protocol every stage of the chain speaks, in the spirit of torchdata's ``nodes.BaseNode``.

A stage is an iterator over its upstream (``source``): ``next`` gives the next item, ``state()`` says where
it stands (a small dict, its upstream's nested under ``"source"``), ``reset(state)`` starts it over from
such a state (None: from where its upstream starts). A stage knows its upstream and the collaborators it
was handed (an order, a batcher, a slot ring, the stats), never the loader.
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
