"""``fastload.mix``: several packed datasets as one, sampled by weight, on the fast path.

A mix (``Mixed``) is a ``fastload.Dataset`` whose index space is the concatenation of its datasets' (the first
dataset's samples first): its reader is one ``PackedReader`` over all their segments (shards, LMDB, remote
shards), each segment wrapped so that it answers in the mix's field names (``fields=`` renames a dataset's
fields). The native batcher, the collate and the device stage see one dataset; a batch's samples come from
whichever datasets the order drew. The order is ``fast/mixing.py``'s: each epoch a sequence of ``num_samples``
global indices drawn by weight, split over ranks, batched and resumed like a plain dataset's.

Everything that could make two datasets disagree in a batch is refused here, naming the dataset and the field:
a missing or extra field, another kind, dtype or shape, other image transforms, another Pad, decode or as_dict.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from .dataset import Dataset
from .._schema import Schema
from .._augment.mix import resolve_batch
from .._transforms.sequences import Pad
from ..fast.mixing import Mixing
from ..formats.reader import joined


class Mixed(Dataset):
    """A mix of packed datasets (``fastload.mix``): ``len`` is their total size, ``mix[i]`` the ``i``-th sample of
    their concatenation (in the mix's field names); ``fastload.DataLoader`` draws its epochs by weight
    (``mixing``, ``fast/mixing.py``). ``members`` are the datasets by name."""

    def __init__(
        self,
        members: dict[str, Dataset],
        mixing: Mixing,
        schema: Schema,
        stored: dict[str, dict],
        pipelines: dict,
        sequences: dict,
        batch_transforms: Any,
    ):
        first = next(iter(members.values()))
        self.members, self.mixing, self.schema, self._stored = members, mixing, schema, stored
        self.as_dict, self.decode = first.as_dict, first.decode
        self.pipelines, self.sequences = pipelines, sequences
        self.transforms = dict(pipelines) | sequences  # by the mix's field names
        self.path = f"mix({', '.join(members)})"
        self._remote = None
        self._lease = None
        self.batch_mix = resolve_batch(batch_transforms, schema, pipelines, self.as_dict)
        self._open_reader()

    def _open_reader(self) -> None:
        parts = [(name, ds.reader, self._stored[name]) for name, ds in self.members.items()]
        self._reader = joined(parts, self.schema, self.path)
        self._finalizer = weakref.finalize(self, self._reader.close)

    @property
    def format(self) -> str:
        return "mix"

    @property
    def classes(self) -> list[str] | None:
        """The members' class names when they all have the same ones, else None."""
        got = [ds.classes for ds in self.members.values()]
        return got[0] if all(c == got[0] for c in got) else None

    @property
    def metadata(self) -> dict:
        return {"mix": {name: ds.metadata for name, ds in self.members.items()}}

    def __len__(self) -> int:
        return int(self.mixing.offsets[-1])

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{n}: {len(ds)} samples, {q} per epoch" for (n, ds), q in zip(self.members.items(), self.mixing.quotas)
        )
        return f"fastload.mix({parts}; {self.schema})"

    @property
    def remote(self) -> bool:
        return any(ds.remote for ds in self.members.values())

    def remote_stats(self) -> dict | None:
        """Each remote member's ``remote_stats()`` by name; None when every member is local."""
        got = {name: ds.remote_stats() for name, ds in self.members.items() if ds.remote}
        return got or None

    def read_plan(self, batches: Any) -> Any:
        """Each remote member's read plan fed that member's samples of the coming batches (local indices), in step
        with the batches: a batch is handed on once every member's shards it needs are in the cache."""
        remote = [(d, ds) for d, ds in enumerate(self.members.values()) if ds.remote]
        return batches if not remote else self._read_ahead(batches, remote)

    def _read_ahead(self, batches: Any, remote: list) -> Iterator:
        main, *feeds = itertools.tee(batches, len(remote) + 1)
        plans = [ds.read_plan(self._local(feed, d)) for (d, ds), feed in zip(remote, feeds)]
        try:
            for item, *_ in zip(main, *plans):
                yield item
        finally:
            for p in plans:
                close = getattr(p, "close", None)
                if close is not None:
                    close()

    def _local(self, batches: Iterator, d: int) -> Iterator[np.ndarray]:
        lo, hi = int(self.mixing.offsets[d]), int(self.mixing.offsets[d + 1])
        for item in batches:
            idx = np.asarray(item, dtype=np.int64)
            yield idx[(idx >= lo) & (idx < hi)] - lo


def mix(
    datasets: Mapping[str, Dataset],
    weights: Mapping[str, float] | Sequence[float] | None = None,
    *,
    num_samples: int | None = None,
    seed: int | None = None,
    fields: Mapping[str, Mapping[str, str | None]] | None = None,
    batch_transforms: Any = None,
) -> Mixed:
    """Several packed datasets (``fastload.open``'s, local or remote) as one, sampled by weight.

    ``weights``: ``{name: weight}`` (every name once) or a list in ``datasets``' order, each >= 0; default: the
    datasets' sizes (each sample equally likely). An epoch of ``fastload.DataLoader(mix, ...)`` is ``num_samples``
    samples (default: the total size), ``round(num_samples * weight / sum(weights))`` of them from each dataset
    (largest remainder). Each dataset is read without replacement, pass after pass, each pass a new permutation
    (``shuffle=True``) or in its stored order (``shuffle=False``, interleaved evenly): a small dataset with a
    large weight is repeated within an epoch, a large one with a small weight goes on next epoch where this one
    stopped. The draw is keyed by ``seed`` (default: the loader's seed) and the epoch: the same on every rank and
    at any ``num_workers``; ranks split it like a plain dataset's and ``state_dict()`` resumes mid-epoch.

    ``fields``: ``{name: {stored field: mix field, ...}}`` renames a dataset's fields to the mix's (the first
    dataset's names, after its own renaming); ``None`` as the mix field leaves a field out. After renaming, every
    dataset must have the same fields (kind, dtype, shape), the same image transforms and Pad, and the same
    ``decode``/``as_dict``: anything else is refused here, naming the dataset and the field.

    ``batch_transforms`` (MixUp/CutMix, as ``fastload.open``'s) apply to the mix's batches; the datasets must
    have none of their own. ``loader.stats()["mix"]`` counts the samples each dataset gave the batches handed out.
    """
    members = _members(datasets)
    names = list(members)
    renames = _renames(members, fields)
    schemas = {name: _renamed_schema(name, ds, renames[name]) for name, ds in members.items()}
    first = names[0]
    schema = schemas[first]
    for name in names[1:]:
        _same_fields(first, schema, name, schemas[name], renames[name])
    stored = {name: {f: _stored(renames[name], f) for f in schema.names} for name in names}
    pipelines, sequences = _same_transforms(members, stored, schema)
    mixing = Mixing(
        names,
        [len(ds) for ds in members.values()],
        _weights(members, weights),
        _num_samples(members, num_samples),
        seed,
    )
    return Mixed(members, mixing, schema, stored, pipelines, sequences, batch_transforms)


def _members(datasets: Any) -> dict[str, Dataset]:
    if not isinstance(datasets, Mapping) or not datasets:
        raise TypeError(
            f"fastload.mix takes a dict of named datasets, e.g. fastload.mix({{'a': fastload.open(...), 'b': "
            f"fastload.open(...)}}, weights={{'a': 0.7, 'b': 0.3}}); got {datasets!r}"
        )
    out: dict[str, Dataset] = {}
    for name, ds in datasets.items():
        if not isinstance(name, str):
            raise TypeError(f"fastload.mix: dataset names are str, got {name!r}")
        if isinstance(ds, Mixed):
            raise TypeError(f"fastload.mix: dataset '{name}' is a mix already; mix its datasets directly")
        if not isinstance(ds, Dataset):
            raise TypeError(
                f"fastload.mix: dataset '{name}' is a {type(ds).__name__}, not a fastload.Dataset: open it "
                f"with fastload.open (pack it first with fastload.pack)"
            )
        out[name] = ds
    first, ref = next(iter(out.items()))
    for name, ds in out.items():
        for attr in ("decode", "as_dict"):
            if getattr(ds, attr) != getattr(ref, attr):
                raise ValueError(
                    f"fastload.mix: dataset '{name}' was opened with {attr}={getattr(ds, attr)}, dataset "
                    f"'{first}' with {attr}={getattr(ref, attr)}: open them alike"
                )
        if ds.batch_mix is not None:
            raise ValueError(
                f"fastload.mix: dataset '{name}' has batch_transforms of its own; give them to "
                f"fastload.mix(..., batch_transforms=...) instead, which mixes the mix's batches"
            )
        for f, spec in ds.sequences.items():
            if not isinstance(spec, Pad):
                raise ValueError(
                    f"fastload.mix: dataset '{name}' field '{f}' has {type(spec).__name__}, which forms its own "
                    f"batches by length; a mix draws its batches by weight: pad the field with T.Pad instead"
                )
    return out


def _renames(members: dict[str, Dataset], fields: Any) -> dict[str, dict[str, str | None]]:
    """Per dataset: its stored field -> the mix's name (None: left out), checked against its schema."""
    fields = {} if fields is None else fields
    if not isinstance(fields, Mapping):
        raise TypeError(f"fastload.mix: fields= maps a dataset's name to {{stored field: mix field}}, got {fields!r}")
    unknown = [n for n in fields if n not in members]
    if unknown:
        raise ValueError(f"fastload.mix: fields= names dataset '{unknown[0]}', which is not one of {list(members)}")
    out: dict[str, dict[str, str | None]] = {}
    for name, ds in members.items():
        mapping = fields.get(name) or {}
        if not isinstance(mapping, Mapping):
            raise TypeError(
                f"fastload.mix: fields['{name}'] should be a dict {{stored field: mix field}}, got {mapping!r}"
            )
        for stored, new in mapping.items():
            if stored not in ds.schema:
                raise ValueError(
                    f"fastload.mix: fields['{name}'] renames field '{stored}', which dataset '{name}' does not "
                    f"have; its fields are {list(ds.schema.names)}"
                )
            if new is not None and not (isinstance(new, str) and new.isidentifier()):
                raise ValueError(
                    f"fastload.mix: fields['{name}']['{stored}'] = {new!r} should be a field name (an "
                    f"identifier) or None (leave the field out)"
                )
        out[name] = dict(mapping)
    return out


def _renamed_schema(name: str, ds: Dataset, rename: dict[str, str | None]) -> Schema:
    kept = []
    for f in ds.schema:
        new = rename.get(f.name, f.name)
        if new is not None:
            kept.append(dataclasses.replace(f, name=new))
    seen: dict[str, str] = {}
    for old, f in zip([f.name for f in ds.schema if rename.get(f.name, f.name) is not None], kept):
        if f.name in seen:
            raise ValueError(
                f"fastload.mix: dataset '{name}' would have two fields named '{f.name}' (its '{seen[f.name]}' "
                f"and '{old}'): rename one of them in fields['{name}']"
            )
        seen[f.name] = old
    if not kept:
        raise ValueError(f"fastload.mix: fields['{name}'] leaves dataset '{name}' no field")
    return Schema(kept)


def _stored(rename: dict[str, str | None], mixed: str) -> str:
    """The stored name of mix field ``mixed`` in a dataset renamed by ``rename``."""
    return next((old for old, new in rename.items() if new == mixed), mixed)


def _as_stored(mixed: str, rename: dict) -> str:
    old = _stored(rename, mixed)
    return f"field '{mixed}'" if old == mixed else f"field '{mixed}' (stored as '{old}')"


def _same_fields(first: str, ref: Schema, name: str, schema: Schema, rename: dict) -> None:
    missing = [f for f in ref.names if f not in schema]
    if missing:
        raise ValueError(
            f"fastload.mix: dataset '{name}' has no field '{missing[0]}', which dataset '{first}' has; its fields "
            f"(after fields=) are {list(schema.names)}: rename one of them with fields={{'{name}': {{'<its "
            f"field>': '{missing[0]}'}}}}"
        )
    extra = [f for f in schema.names if f not in ref]
    if extra:
        raise ValueError(
            f"fastload.mix: dataset '{name}' has {_as_stored(extra[0], rename)}, which dataset '{first}' "
            f"has not (its fields: {list(ref.names)}): rename it to one of those, or leave it out with "
            f"fields={{'{name}': {{'{_stored(rename, extra[0])}': None}}}}"
        )
    for f in ref:
        g = schema[f.name]
        if (g.kind, g.dtype, g.shape) != (f.kind, f.dtype, f.shape):
            raise ValueError(
                f"fastload.mix: dataset '{name}' {_as_stored(f.name, rename)} is {_describe(g)}, but dataset "
                f"'{first}''s is {_describe(f)}: a batch holds both, so they must agree"
            )


def _describe(f: Any) -> str:
    parts = [f"kind {f.kind}"]
    if f.dtype is not None:
        parts.append(f"dtype {f.dtype}")
    if f.shape is not None:
        parts.append(f"shape {tuple(f.shape)}")
    return ", ".join(parts)


def _same_transforms(members: dict[str, Dataset], stored: dict[str, dict], schema: Schema) -> tuple[dict, dict]:
    """The mix's image pipelines and Pads by mix field: every dataset's must be the first's."""
    names = list(members)
    first = names[0]
    pipelines: dict = {}
    sequences: dict = {}
    for f in schema.names:
        ref_pipe = members[first].pipelines.get(stored[first][f])
        ref_seq = members[first].sequences.get(stored[first][f])
        for name in names[1:]:
            pipe = members[name].pipelines.get(stored[name][f])
            seq = members[name].sequences.get(stored[name][f])
            if pipe != ref_pipe:
                raise ValueError(
                    f"fastload.mix: dataset '{name}' transforms['{stored[name][f]}'] are {pipe!r}, dataset "
                    f"'{first}''s transforms['{stored[first][f]}'] are {ref_pipe!r}: a batch is decoded and "
                    f"transformed as one, so open every dataset with the same transforms for field '{f}'"
                )
            if repr(seq) != repr(ref_seq):
                raise ValueError(
                    f"fastload.mix: dataset '{name}' field '{stored[name][f]}' has {seq!r}, dataset '{first}''s "
                    f"field '{stored[first][f]}' has {ref_seq!r}: open every dataset with the same Pad for '{f}'"
                )
        if ref_pipe is not None:
            pipelines[f] = ref_pipe
        if ref_seq is not None:
            sequences[f] = ref_seq
    return pipelines, sequences


def _weights(members: dict[str, Dataset], weights: Any) -> list[float]:
    names = list(members)
    if weights is None:
        got = [float(len(ds)) for ds in members.values()]
    elif isinstance(weights, Mapping):
        missing = [n for n in names if n not in weights]
        extra = [n for n in weights if n not in members]
        if missing or extra:
            raise ValueError(
                f"fastload.mix: weights should name every dataset once ({names}); "
                + (f"missing {missing}" if missing else f"unknown {extra}")
            )
        got = [weights[n] for n in names]
    elif isinstance(weights, (list, tuple, np.ndarray)):
        if len(weights) != len(names):
            raise ValueError(
                f"fastload.mix: {len(weights)} weights for {len(names)} datasets ({names}); give one per dataset, "
                f"in the same order, or a dict {{name: weight}}"
            )
        got = list(weights)
    else:
        raise TypeError(f"fastload.mix: weights should be a dict {{name: weight}} or a list, got {weights!r}")
    out = []
    for n, w in zip(names, got):
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)):
            raise TypeError(f"fastload.mix: the weight of dataset '{n}' is {w!r}, not a number")
        if not math.isfinite(float(w)) or float(w) < 0:
            raise ValueError(f"fastload.mix: the weight of dataset '{n}' is {w!r}; weights are finite and >= 0")
        if float(w) > 0 and len(members[n]) == 0:
            raise ValueError(f"fastload.mix: dataset '{n}' has no samples but weight {w}; give it weight 0")
        out.append(float(w))
    if sum(out) <= 0:
        raise ValueError(f"fastload.mix: every weight is 0 ({dict(zip(names, out))}); at least one must be > 0")
    return out


def _num_samples(members: dict[str, Dataset], num_samples: Any) -> int:
    if num_samples is None:
        total = sum(len(ds) for ds in members.values())
        if total == 0:
            raise ValueError("fastload.mix: every dataset is empty")
        return total
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
        raise ValueError(f"fastload.mix: num_samples={num_samples!r} should be an int >= 1 (samples per epoch)")
    return int(num_samples)
