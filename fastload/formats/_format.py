"""``Format``: everything fastload knows about one on-disk layout, in one object.

Each format module (``shards.py``, ``lmdb.py``) defines one subclass and ``registry.py`` lists one
instance of each; the reader, the packer and the command line ask the registry, never a module. A new
on-disk format is one new module with a ``Format`` subclass (every method below) plus one line in
``registry.FORMATS``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable


class Format:
    """One on-disk layout. ``name`` is ``fastload pack --format``'s choice and the manifest's ``layout``."""

    name: str = ""
    marker: str = ""  # what marks a folder as this format, for "not a dataset: no ..." ("manifest.json")
    # packed in parts and to a URL: its files are written independently, renamed into place by ``merge``,
    # uploaded one by one as they are finished (``on_shard``)
    parts: bool = False
    arrays: bool = False  # has an ``array_sink`` (fixed-size numpy sources without per-sample Python)

    # -- reading ------------------------------------------------------------------------------
    def detect(self, path: Path) -> bool:
        """A local folder holds this format's data (finished or not): ``read_manifest`` asks each format."""
        raise NotImplementedError

    def manifest(self, path: Path) -> Any:
        """The validated ``Manifest`` of a local dataset this format ``detect``ed; ``FormatError`` otherwise."""
        raise NotImplementedError

    def check(self, manifest: Any, where: str) -> None:
        """What a parsed manifest of this layout must also satisfy (``Manifest.parse`` checks only what every
        format shares); ``FormatError`` naming ``where`` otherwise. Called by ``manifest`` and by whoever
        reads this layout's manifest another way (a URL, a part to merge)."""

    def segments(self, path: Path, manifest: Any) -> list:
        """The segments ``PackedReader`` reads: ``open``, ``close``, ``count``, ``schema``, ``label`` (a shard's
        file name for messages, or None), ``row``/``take`` (column rows), ``blob`` (one value), and for the
        native calls ``column_region(field)`` (a fixed-size column in one piece: ``(buffer, byte offset)``, or
        None, then ``row_sources(field, idx, row_bytes)``) and ``blob_sources(field, idx)``, each giving
        ``(regions, region or None when all in regions[0], offset[, length])`` (see ``shards.ShardSegment``)."""
        raise NotImplementedError

    def verify(self, path: Path, manifest: Any, progress: Callable[[int], None] | None = None) -> list[str]:
        """Every byte checked against the manifest: one message per problem, empty when sound."""
        raise NotImplementedError

    def describe(self, path: Path, manifest: Any) -> list[str]:
        """``fastload inspect``'s lines about the files."""
        raise NotImplementedError

    def verified(self, manifest: Any) -> str:
        """``fastload verify``'s OK line: what was checked."""
        raise NotImplementedError

    def where(self, files: int) -> str:
        """A pack summary's "where": e.g. "3 shard(s)"."""
        raise NotImplementedError

    # -- writing (the packer, ``fastload/pack/``) -----------------------------------------------
    def sink(
        self,
        dest: Path,
        src: Any,
        params: dict,
        shard_bytes: int,
        state: dict | None,
        span: tuple[int, int],
        on_shard: Callable[[Path], None] | None,
        keep_state: bool,
    ) -> Any:
        """The writer taking encoded samples one at a time: ``next_sample``, ``state["skipped"]``, ``add(i,
        encoded)``, ``skip(record)``, ``finish() -> Manifest``, ``close()``, ``total_bytes()``."""
        raise NotImplementedError

    def array_sink(
        self,
        dest: Path,
        src: Any,
        params: dict,
        shard_bytes: int,
        state: dict | None,
        span: tuple[int, int],
        on_shard: Callable[[Path], None] | None,
        keep_state: bool,
    ) -> Any:
        """Where ``arrays`` is True: a writer for a fixed-size numpy source a column slice at a time
        (``run(progress, label)``, then ``finish``); otherwise ``sink`` takes the samples one by one."""
        raise NotImplementedError

    def array_rows(self, src: Any, shard_bytes: int) -> int:
        """Where ``arrays`` is True: source samples per unit an ``array_sink`` writes (packing in parts splits
        a numpy source by these units)."""
        raise NotImplementedError

    def owns(self, name: str) -> bool:
        """``name`` (in a dataset folder, without a ``.tmp`` suffix) is a file this format's pack writes:
        the only files ``--overwrite`` and clean-ups ever remove."""
        raise NotImplementedError

    def read_state(self, dest: Path) -> dict | None:
        """The resume state of an unfinished pack in ``dest`` (None: none there)."""
        raise NotImplementedError

    def complete(self, dest: Path) -> bool:
        """``dest`` holds a finished dataset of this format."""
        raise NotImplementedError

    def foreign(self, dest: Path, names: list[str]) -> str | None:
        """What ``dest`` holds of this format's kind that fastload did not write (never to be removed), in a
        few words for the refusal; None when nothing."""
        return None

    def nothing_committed(self, dest: Path, names: list[str]) -> bool:
        """``names`` (no ``.tmp`` files among them) are only the scratch of a pack killed before its first
        commit, safe to remove."""
        return False

    def is_write_error(self, e: BaseException) -> bool:
        """``e`` is a failed write raised by this format's own library (not an ``OSError``)."""
        return False
