"""What every source adapter provides to the packer."""

from __future__ import annotations

from typing import Any

from .._schema import Schema


class Source:
    """A sized sequence of samples with a schema.

    ``load(i)`` runs in pack worker processes and returns the sample's values in schema order;
    ``describe(i)`` names the sample for error messages (a file path where there is one).
    """

    schema: Schema
    metadata: dict = {}
    #: False when loading is trivial (in-memory arrays): the packer then skips worker processes.
    parallel: bool = True
    #: True when load() only names files and plain values (no user Python code runs per sample).
    files_only: bool = False

    def __len__(self) -> int:
        raise NotImplementedError

    def load(self, i: int) -> list[Any]:
        raise NotImplementedError

    def describe(self, i: int) -> str:
        return f"sample {i}"

    def fingerprint(self) -> str:
        """A string that changes when the source's content list changes (guards pack resume)."""
        return f"{type(self).__name__}:{len(self)}"
