"""The read-plan stage (remote datasets): the coming batches' shards downloaded ahead and pinned in the cache.

The dataset's read plan (``Dataset.read_plan``, ``formats/remote.py``'s ``ReadPlan``) looks ahead over a
stream of index batches; this stage feeds it the jobs' indices and hands each job on with its generator,
in order. A local dataset has no read plan and the chain leaves this stage out.

State (``stage.py``'s prefetching rule): each job the plan has taken carries the upstream's state after it; the
stage's state is that of the last job handed on (what it has read ahead is not part of it), and ``reset`` starts
a new read plan from there.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Iterator

from .stage import Stage, nested, upstream_state


class ReadAhead(Stage):
    def __init__(self, source: Any, reading: Callable[[Iterator], Iterator]):
        self.source, self.reading = source, reading
        # (generator, upstream state after the job) of the batches read ahead, in order
        self._held: collections.deque = collections.deque()
        self._snapshot = upstream_state(source)
        self._batches = reading(self._indices())

    def _indices(self):
        source = self.source
        for indices, rng in source:
            self._held.append((rng, upstream_state(source)))
            yield indices

    def __next__(self) -> Any:
        indices = next(self._batches)
        rng, self._snapshot = self._held.popleft()
        return indices, rng

    def state(self) -> dict:
        return nested(self._snapshot)

    def reset(self, state: dict | None = None) -> None:
        """Start over from ``state`` of the upstream: a new read plan, nothing read ahead."""
        super().reset(state)
        self._held.clear()
        self._snapshot = upstream_state(self.source)
        self._batches = self.reading(self._indices())
