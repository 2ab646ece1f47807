"""The read-plan stage (remote datasets): the coming batches' shards downloaded ahead and pinned in the cache.

The dataset's read plan (``Dataset.read_plan``, ``formats/remote.py``'s ``ReadPlan``) looks ahead over a
stream of index batches; this stage feeds it the jobs' indices and hands each job on with its generator,
in order. A local dataset has no read plan and the chain leaves this stage out.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Iterator

from .stage import Stage


class ReadAhead(Stage):
    def __init__(self, source: Any, reading: Callable[[Iterator], Iterator]):
        self.source, self.reading = source, reading
        self._rngs: collections.deque = collections.deque()  # the generators of the batches read ahead
        self._batches = reading(self._indices())

    def _indices(self):
        for indices, rng in self.source:
            self._rngs.append(rng)
            yield indices

    def __next__(self) -> Any:
        indices = next(self._batches)
        return indices, self._rngs.popleft()

    def reset(self, state: dict | None = None) -> None:
        """Start over from ``state`` of the upstream: a new read plan, nothing read ahead."""
        super().reset(state)
        self._rngs.clear()
        self._batches = self.reading(self._indices())
