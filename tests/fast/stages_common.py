"""What the stage tests share: ``Handed``, the producer stage's interface to ``Collate`` over given items."""

from __future__ import annotations


class Handed:
    """The producer stage as ``Collate`` sees it: an iterator over ``items`` and its queue depth (0)."""

    ready = 0

    def __init__(self, items):
        self.items = iter(items)

    def __next__(self):
        return next(self.items)
