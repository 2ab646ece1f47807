"""The files a Parquet or WebDataset source names, local or at a URL fsspec reads.

A source spec is one file, a folder (its files with the kind's suffixes, found recursively, sorted), a glob
(``data/train-*.parquet``) or a brace pattern (``shard-{000..009}.tar``, ``{a,b}``), each local or a URL
(``s3://bucket/...``; ``storage_options`` go to the fsspec backend). Files open by path in whichever process
reads them: a forked pack worker makes its own fsspec filesystem and its own file handles.
"""

from __future__ import annotations

import fnmatch
import glob as globlib
import os
import re
import warnings
from pathlib import Path
from typing import IO, Any, Iterable

from .._errors import SourceError
from .._install import pip_extra

# names Hugging Face (and most people) give a dataset's splits, as a file-name prefix or a folder name
SPLITS = ("train", "test", "validation", "valid", "val", "dev", "eval")
_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def is_url(spec: str) -> bool:
    return "://" in spec


def is_pattern(spec: str) -> bool:
    """A glob or a brace pattern (not a plain path)."""
    return any(c in spec for c in "*?[") or bool(_BRACE.search(spec))


def _glob_match(pattern: list[str], names: list[str]) -> bool:
    """Whether the path components ``names`` match the glob components ``pattern`` as ``glob.glob(recursive=True)``
    matches them: ``**`` is any number of components, none hidden; a wildcard component does not match a hidden
    name (one starting with '.') unless it starts with '.' itself; a plain component is the name."""
    if not pattern:
        return not names
    head, tail = pattern[0], pattern[1:]
    if head == "**":
        return any(
            _glob_match(tail, names[k:]) for k in range(len(names) + 1) if not any(_hidden(n) for n in names[:k])
        )
    if not names:
        return False
    name = names[0]
    if globlib.has_magic(head):
        ok = fnmatch.fnmatchcase(name, head) and (_hidden(head) or not _hidden(name))
    else:
        ok = name == head
    return ok and _glob_match(tail, names[1:])


def _hidden(name: str) -> bool:
    return name.startswith(".")


def expand_braces(spec: str) -> list[str]:
    """``shard-{000..002}.tar`` -> ``shard-000.tar, shard-001.tar, shard-002.tar`` (zero padding kept, as
    webdataset's braceexpand does); ``{a,b}`` lists; several groups multiply, left to right."""
    m = _BRACE.search(spec)
    if m is None:
        return [spec]
    body = m.group(1)
    rng = _RANGE.match(body)
    if rng:
        lo, hi = int(rng.group(1)), int(rng.group(2))
        width = len(rng.group(1)) if rng.group(1).lstrip("-").startswith("0") else 0
        step = 1 if hi >= lo else -1
        options = [str(v).zfill(width) for v in range(lo, hi + step, step)]
    elif "," in body:
        options = body.split(",")
    else:
        raise SourceError(
            f"source {spec!r}: the brace group {{{body}}} is neither a range such as {{000..009}} nor "
            f"a list such as {{a,b}}"
        )
    return [out for opt in options for out in expand_braces(spec[: m.start()] + opt + spec[m.end() :])]


class Files:
    """The sorted files a spec names (``what``: the kind, for messages; ``suffixes``: a folder's files)."""

    def __init__(
        self, spec: str | os.PathLike, suffixes: tuple[str, ...], what: str, storage_options: dict | None = None
    ):
        self.spec = os.fspath(spec)
        self.what = what
        self.url = is_url(self.spec)
        self.storage_options = dict(storage_options or {})
        self.protocol = self.spec.split("://", 1)[0] if self.url else ""
        self._fs: Any = None
        self._pid = -1
        if self.url:
            self.fs  # noqa: B018  (made now: a missing fsspec or backend says how to install it)
        self.paths = self._expand(suffixes)
        if not self.paths:
            raise SourceError(f"{what} source {self.spec} names no {'/'.join(suffixes)} file")

    # -- the filesystem -------------------------------------------------------------------------
    @property
    def fs(self) -> Any:
        """The fsspec filesystem (URL specs only); a forked child makes its own (fsspec's async loop and
        connections do not survive a fork)."""
        if self._fs is None or self._pid != os.getpid():
            try:
                import fsspec.core
            except ImportError:
                raise ImportError(
                    f"reading {self.spec} needs fsspec: {pip_extra('remote')} (s3fs for "
                    f"s3://; gcsfs for gs://, adlfs for az://)"
                ) from None
            try:
                self._fs, _ = fsspec.core.url_to_fs(
                    self.spec.split("{")[0] or self.spec, skip_instance_cache=True, **self.storage_options
                )
            except ImportError as e:
                raise ImportError(
                    f"{self.spec}: {e} (fastload reads object storage through fsspec's backends)"
                ) from None
            self._pid = os.getpid()
        return self._fs

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fs": None, "_pid": -1}

    def name(self, path: str) -> str:
        """``path`` as the user knows it (with its URL scheme)."""
        return f"{self.protocol}://{path}" if self.url and "://" not in path else path

    def open(self, path: str) -> IO[bytes]:
        try:
            return self.fs.open(path, "rb") if self.url else open(path, "rb")
        except (OSError, ValueError) as e:
            raise SourceError(f"cannot read {self.name(path)}: {e}") from None

    def identity(self, path: str) -> str:
        """What changes when the file does: size and modification time (a URL: size and ETag/mtime)."""
        try:
            if not self.url:
                st = os.stat(path)
                return f"{path}\0{st.st_size}\0{st.st_mtime_ns}"
            info = self.fs.info(path)
        except OSError as e:
            raise SourceError(f"cannot read {self.name(path)}: {e}") from None
        stamp = next(
            (
                info[k]
                for k in ("ETag", "etag", "md5", "mtime", "LastModified", "last_modified")
                if info.get(k) is not None
            ),
            "",
        )
        return f"{path}\0{info.get('size')}\0{stamp}"

    # -- expansion ------------------------------------------------------------------------------
    def _expand(self, suffixes: tuple[str, ...]) -> list[str]:
        out: list[str] = []
        for spec in expand_braces(self.spec):
            path = _strip_protocol(spec) if self.url else spec
            if any(c in spec for c in "*?["):
                found = sorted(self.fs.glob(path) if self.url else self._glob(path))
                found = [p for p in found if not self._isdir(p)]
                if not found:
                    raise SourceError(f"{self.what} source: the pattern {spec} matches no file")
                out.extend(found)
            elif self._isdir(path):
                found = self._folder_files(path, suffixes)
                if not found:
                    raise SourceError(f"{self.what} source: the folder {spec} holds no {'/'.join(suffixes)} file")
                check_one_split(spec, path, found, suffixes)
                out.extend(found)
            elif self._exists(path):
                out.append(path)
            else:
                raise SourceError(f"{self.what} source {spec} does not exist")
        return self._once(out)

    def _once(self, paths: list[str]) -> list[str]:
        """``paths`` with each file once, in order: a recursive glob follows a symlink loop (every file ~40 times
        over) and a brace pattern may name one file twice; said in one warning."""
        seen: set = set()
        out, again = [], []
        for p in paths:
            try:
                key = p if self.url else os.stat(p)[1:3]  # (st_ino, st_dev)
            except OSError:  # a dangling link: reading it says so, naming it
                key = p
            if key in seen:
                again.append(p)
                continue
            seen.add(key)
            out.append(p)
        if again:
            warnings.warn(
                f"the {self.what} source {self.spec} reaches {len(again)} file(s) more than once (a symlink loop, "
                f"or a pattern naming a file twice), e.g. {self.name(again[0])}: each file is read once",
                UserWarning,
                stacklevel=5,
            )
        return out

    def _glob(self, pattern: str) -> list[str]:
        """``glob.glob(pattern, recursive=True)``, but under ``**`` each real folder is listed once: glob follows
        every link to a folder, so a symlink loop repeats its files ~40 times, and two loops (``a/up -> ..``,
        ``b/up -> ..``) double the paths at every level: the glob never ended. Each ``**`` walks its base once
        (links followed, as glob does), then the rest of the pattern is matched with glob's rules."""
        parts = pattern.split(os.sep)
        if "**" not in parts:
            return globlib.glob(pattern)
        cut = parts.index("**")
        prefix, rest = os.sep.join(parts[:cut]), parts[cut:]
        from .imagefolder import _key, _walk

        bases = globlib.glob(prefix) if globlib.has_magic(prefix) else [prefix] if prefix or cut else [os.curdir]
        out: list[str] = []
        loops: list[str] = []
        for base in bases:
            if not os.path.isdir(base or os.sep):
                continue
            top = base or os.sep
            for folder, names in _walk(Path(top), {_key(top): top}, loops, f"a {self.what} source"):
                rel = os.path.relpath(folder, top)
                within = [] if rel == os.curdir else rel.split(os.sep)
                for n in names:
                    if _glob_match(rest, within + [n]):
                        path = os.path.join(folder, n)
                        out.append(
                            path[len(os.curdir) + 1 :] if not cut and path.startswith(os.curdir + os.sep) else path
                        )
        self._say_loops(loops, prefix or os.curdir)
        return out

    def _say_loops(self, loops: list[str], path: str) -> None:
        if loops:
            loops.sort(key=lambda m: "symlink loop" not in m)
            more = f" (and {len(loops) - 1} more such link(s))" if len(loops) > 1 else ""
            warnings.warn(
                f"a link in a {self.what} source folder leads to a folder reached already, under {path}: "
                f"{loops[0]}{more}; each file is read once, under the first path that reaches it (a folder "
                f"reached again through a link is skipped)",
                UserWarning,
                stacklevel=6,
            )

    def _isdir(self, path: str) -> bool:
        return self.fs.isdir(path) if self.url else os.path.isdir(path)

    def _exists(self, path: str) -> bool:
        return self.fs.exists(path) if self.url else os.path.exists(path)

    def _folder_files(self, path: str, suffixes: tuple[str, ...]) -> list[str]:
        if self.url:
            files: Iterable[str] = self.fs.find(path)
        else:  # links followed, each real folder once (a loop such as d/up -> .. repeated every file ~40 times)
            from .imagefolder import _key, _walk

            loops: list[str] = []
            found = _walk(Path(path), {_key(path): path}, loops, f"a {self.what} source")
            files = (os.path.join(d, n) for d, names in found for n in names)
            self._say_loops(loops, path)
        return sorted(f for f in files if f.lower().endswith(suffixes))


def warn_one_process(files: Files, why: str) -> None:
    """A URL source is packed by one process (``Source.parallel`` False): said once, with the reason."""
    warnings.warn(
        f"fastload: {files.spec} is read by one pack process, not one per core: {why}. For a faster "
        f"pack, copy the files to a local disk and pack the copy",
        UserWarning,
        stacklevel=4,
    )


def url_folder_files(spec: str, storage_options: dict | None) -> list[str]:
    """The names of the files under a URL folder (none when it is not a folder), to tell which kind it holds."""
    try:
        import fsspec.core
    except ImportError:
        return []
    try:
        fs, path = fsspec.core.url_to_fs(spec, skip_instance_cache=True, **(storage_options or {}))
        return list(fs.find(path)) if fs.isdir(path) else []
    except (OSError, ValueError, ImportError) as e:
        raise SourceError(f"cannot list {spec}: {e}") from None


def folder_holds(folder: Path, suffixes: tuple[str, ...], deep: bool) -> bool:
    """Whether a local folder holds files with these suffixes: at its top level, or anywhere (``deep``)."""
    if not deep:
        return any(e.is_file() and e.name.lower().endswith(suffixes) for e in os.scandir(folder))
    return any(n.lower().endswith(suffixes) for _, _, names in os.walk(folder, followlinks=True) for n in names)


def _split_of(relative: str) -> str | None:
    """The split a file belongs to by its name (``train-00000-of-00002.parquet``) or a folder (``test/x.tar``)."""
    parts = relative.replace("\\", "/").split("/")
    for p in parts[:-1]:
        if p.lower() in SPLITS:
            return p.lower()
    head = re.split(r"[-_.]", parts[-1], maxsplit=1)[0].lower()
    return head if head in SPLITS else None


def check_one_split(spec: str, path: str, files: list[str], suffixes: tuple[str, ...]) -> None:
    """A folder holding several splits (train and test files) would pack them into one dataset: refuse,
    naming a pattern that picks one."""
    splits: dict[str, str] = {}
    for f in files:
        rel = os.path.relpath(f, path) if "://" not in f else f[len(path) :].lstrip("/")
        s = _split_of(rel)
        if s is not None:
            splits.setdefault(s, rel)
    if len(splits) < 2:
        return
    split, example = next(iter(splits.items()))
    parts = example.replace("\\", "/").split("/")
    if split in (p.lower() for p in parts[:-1]):  # a split folder: name it
        pick = "/".join([spec.rstrip("/")] + parts[: [p.lower() for p in parts].index(split) + 1])
    else:
        pick = "/".join([spec.rstrip("/")] + parts[:-1] + [f"{parts[-1][: len(split)]}*{suffixes[0]}"])
    raise SourceError(
        f"the folder {spec} holds the splits {', '.join(sorted(splits))} ({len(files)} files), which "
        f"one dataset should not mix: name one split, e.g. '{pick}'"
    )


def _strip_protocol(url: str) -> str:
    import fsspec.core

    return fsspec.core.strip_protocol(url)
