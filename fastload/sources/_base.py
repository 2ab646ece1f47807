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


def class_metadata(labels: dict[str, list[str]]) -> dict:
    """A dataset's class names as metadata, from its ``ClassLabel`` columns (``labels``: column -> names): every
    column's under ``class_names``, and ``classes``: the names of the column called label/labels, or of the only
    one. With several and none of them the label (CIFAR-100's fine_label and coarse_label), no ``classes``:
    either would be a guess. Shared by the Parquet and the Hugging Face ``datasets`` adapters."""
    if not labels:
        return {}
    out: dict = {"class_names": labels}
    main: str | None = next((k for k in ("label", "labels") if k in labels), None)
    if main is None and len(labels) == 1:
        main = next(iter(labels))
    if main is not None:
        out["classes"] = labels[main]
    return out
