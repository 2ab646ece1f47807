"""Crash safety of the pack writers: packs killed at chosen and at random moments, a full disk (a killed
pack worker: test_encode_pool.py; shutdown of loaders and leaks: test_shutdown.py).

Kills run the pack in a forked child that SIGKILLs itself at a named point (hooks on os.replace, the shard
writer's file writes, the removal of the resume state and LMDB's transactions: 26 points in all) or is
SIGKILLed by the parent after a seeded random delay.
After each kill: the destination either does not open (an unfinished pack) or opens complete and equal to
an uninterrupted pack; running the pack again resumes, and the result is byte-for-byte the reference
(LMDB: key for key), with ``fastload verify`` passing.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import fastload
from fastload import FastloadError, Field, FormatError
from fastload.cli import main as cli
from fastload.formats import _manifest as manifest_format
from fastload.formats import lmdb as lmdb_format
from fastload.formats import shards as shards_format

from conftest import Samples, dir_bytes
from forking import in_child

pytestmark = pytest.mark.timeout(120)

FIELDS = {"var": Field.ndarray("var", "<f4", (None, 2))}


def make_samples(n: int, seed: int = 0) -> Samples:
    """Dict samples of every non-image kind."""
    rng = np.random.default_rng(seed)
    return Samples({
        "label": int(rng.integers(-1000, 1000)),
        "emb": rng.standard_normal(4).astype("<f4"),
        "var": rng.standard_normal((i % 4, 2)).astype("<f4"),
        "raw": rng.bytes(int(rng.integers(1, 200))),
        "text": "ünï " * (i % 3) + str(i),
    } for i in range(n))


def lmdb_items(path: Path) -> dict[bytes, bytes]:
    env = lmdb_format._lmdb().open(str(path), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor()}
    finally:
        env.close()


def content(path: Path, fmt: str):
    return dir_bytes(path) if fmt == "shards" else lmdb_items(path)


def verify_ok(path: Path) -> None:
    result = CliRunner().invoke(cli, ["verify", str(path)])
    assert result.exit_code == 0, result.output


def opens_only_complete(dest: Path, reference: Path, fmt: str) -> bool:
    """A killed pack's destination either refuses to open or is complete and equal to the reference.
    Returns True when it opened."""
    try:
        ds = fastload.open(dest, decode=False)
    except FormatError:
        return False
    ref = fastload.open(reference, decode=False)
    try:
        assert len(ds) == len(ref)
        assert all(canon(ds[i]) == canon(ref[i]) for i in range(len(ds)))
    finally:
        ds.close()
        ref.close()
    verify_ok(dest)
    return True


def canon(sample: tuple) -> tuple:
    return tuple((str(v.dtype), tuple(v.shape), v.numpy().tobytes()) if isinstance(v, torch.Tensor) else v
                 for v in sample)


# -- kill points ----------------------------------------------------------------------------------------

def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class FileProxy:
    """A file object whose ``write`` a test replaces; everything else goes to the real file."""

    def __init__(self, fh):
        self.fh = fh

    def __getattr__(self, name):
        return getattr(self.fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.fh.__exit__(*exc)


class KillAt:
    """Hooks a pack (in a forked child) so that it SIGKILLs itself at the n-th occurrence of an event."""

    def __init__(self, event: str, n: int):
        self.event, self.n = event, n
        self.counts: dict[str, int] = {}

    def hit(self, event: str) -> None:
        self.counts[event] = self.counts.get(event, 0) + 1
        if event == self.event and self.counts[event] == self.n:
            _die()

    def install(self) -> None:  # only ever in the child: nothing is restored
        import builtins
        import pathlib

        real_replace, real_open, real_unlink = os.replace, builtins.open, pathlib.Path.unlink
        hooks = self
        names = {".fls.tmp": "shard", "pack_state.json.tmp": "state", "manifest.json.tmp": "manifest"}

        def kind(path) -> str | None:
            name = os.fspath(path)
            return next((k for suffix, k in names.items() if name.endswith(suffix)), None)

        def replace(src, dst, *a, **k):
            what = kind(src)
            if what:
                hooks.hit(f"{what}.before-rename")
            real_replace(src, dst, *a, **k)
            if what:
                hooks.hit(f"{what}.renamed")

        class Writer(FileProxy):
            def __init__(self, fh, what):
                super().__init__(fh)
                self.what = what

            def write(self, data):
                if self.what == "manifest":  # half the text reaches the disk, then the kill
                    half = len(data) // 2
                    self.fh.write(data[:half])
                    self.fh.flush()
                    hooks.hit("manifest.partial")
                    return half + self.fh.write(data[half:])
                n = self.fh.write(data)
                self.fh.flush()
                hooks.hit("shard.partial")
                return n

        def open_(path, mode="r", *a, **k):
            fh = real_open(path, mode, *a, **k)
            what = kind(path) if "w" in mode else None
            return Writer(fh, what) if what in ("shard", "manifest") else fh

        def unlink(self, *a, **k):
            real_unlink(self, *a, **k)
            if self.name == "pack_state.json":
                hooks.hit("state.removed")

        os.replace = replace
        shards_format.open = open_  # the shard and manifest writers' module-level names, not every open()
        manifest_format.open = open_
        pathlib.Path.unlink = unlink
        self._lmdb_hooks()

    def _lmdb_hooks(self) -> None:
        hooks = self
        real_init = lmdb_format.LmdbWriter.__init__
        real_finish = lmdb_format.LmdbWriter.finish

        class Txn:
            def __init__(self, txn):
                self.txn = txn

            def put(self, key, value, *a, **k):
                hooks.hit("lmdb.put-manifest" if key == lmdb_format.MANIFEST_KEY else "lmdb.put")
                return self.txn.put(key, value, *a, **k)

            def __getattr__(self, name):
                return getattr(self.txn, name)

            def __enter__(self):
                self.txn.__enter__()
                return self

            def __exit__(self, kind, *rest):
                if kind is None:
                    hooks.hit("lmdb.before-commit")
                out = self.txn.__exit__(kind, *rest)
                if kind is None:
                    hooks.hit("lmdb.committed")
                return out

        class Env:
            def __init__(self, env):
                self.env = env

            def begin(self, *a, write=False, **k):
                txn = self.env.begin(*a, write=write, **k)
                return Txn(txn) if write else txn

            def __getattr__(self, name):
                return getattr(self.env, name)

        def init(self, *a, **k):
            real_init(self, *a, **k)
            self.env = Env(self.env)

        def finish(self, manifest):
            hooks.hit("lmdb.finish")
            return real_finish(self, manifest)

        lmdb_format.LmdbWriter.__init__ = init
        lmdb_format.LmdbWriter.finish = finish


SHARD_POINTS = [  # (event, occurrence): 14 points of a 6-shard pack (19 writes a shard), in pack order
    ("state.before-rename", 1),     # the first resume state written, not yet in place
    ("state.renamed", 1),           # the first resume state in place, nothing else
    ("shard.partial", 1),           # the first shard's header only
    ("shard.partial", 10),          # half of the first shard
    ("shard.before-rename", 1),     # first shard complete under its temporary name
    ("shard.renamed", 1),           # first shard in place, not yet recorded
    ("state.before-rename", 3),     # second shard done, its record not in place
    ("shard.partial", 48),          # inside the third shard
    ("shard.renamed", 3),
    ("state.renamed", 7),           # every shard done and recorded, no manifest
    ("manifest.partial", 1),        # half a manifest under its temporary name
    ("manifest.before-rename", 1),
    ("manifest.renamed", 1),        # the dataset is complete; its resume state is still there
    ("state.removed", 1),           # complete, the directory not yet synced
]
LMDB_POINTS = [  # a 4-chunk LMDB pack: 16 puts a chunk, then the manifest
    ("lmdb.put", 1),                # inside the first chunk's transaction
    ("lmdb.before-commit", 1),      # the first chunk written, not committed
    ("lmdb.committed", 1),
    ("lmdb.put", 40),               # inside the third chunk's transaction
    ("lmdb.committed", 3),
    ("lmdb.finish", 1),             # every chunk committed, no manifest
    ("lmdb.put-manifest", 1),       # the manifest put, not committed
    ("lmdb.before-commit", 5),
    ("lmdb.committed", 5),          # complete
]
ARRAY_POINTS = [("shard.partial", 3), ("state.before-rename", 2), ("shard.renamed", 2)]  # numpy arrays, columnar


def _source(kind: str):
    if kind == "arrays":
        rng = np.random.default_rng(1)
        return {"x": rng.standard_normal((300, 6)).astype("<f4"), "y": np.arange(300)}
    return make_samples(48)


def _pack_kwargs(kind: str, fmt: str) -> dict:
    if kind == "arrays":
        return dict(format=fmt, workers=0, shard_size="2K")
    return dict(format=fmt, workers=0, schema=FIELDS, shard_size="1500")


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    out = {}
    old = lmdb_format.DEFAULT_ROWS_PER_CHUNK
    lmdb_format.DEFAULT_ROWS_PER_CHUNK = 12  # 4 chunks for 48 samples
    try:
        for kind, fmt in (("samples", "shards"), ("samples", "lmdb"), ("arrays", "shards")):
            dest = root / f"{kind}-{fmt}"
            fastload.pack(_source(kind), dest, **_pack_kwargs(kind, fmt))
            out[kind, fmt] = dest
    finally:
        lmdb_format.DEFAULT_ROWS_PER_CHUNK = old
    assert len(list(out["samples", "shards"].glob("*.fls"))) == 6
    assert len(list(out["arrays", "shards"].glob("*.fls"))) >= 4
    return out


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(lmdb_format, "DEFAULT_ROWS_PER_CHUNK", 12)


def _kill_resume_check(dest: Path, reference: Path, kind: str, fmt: str, hooks: KillAt) -> None:
    def child():
        hooks.install()
        fastload.pack(_source(kind), dest, **_pack_kwargs(kind, fmt))

    code = in_child(child)
    assert code == -signal.SIGKILL, f"the pack was not killed at {hooks.event} #{hooks.n} (exit {code})"
    opened = opens_only_complete(dest, reference, fmt)
    finish(dest, reference, kind, fmt, opened)


def finish(dest: Path, reference: Path, kind: str, fmt: str, opened: bool) -> None:
    """Run the pack again: it resumes (or finds the dataset already complete); the result is the reference."""
    try:
        summary = fastload.pack(_source(kind), dest, **_pack_kwargs(kind, fmt))
    except FastloadError as e:  # killed after it had completed: the same command says so
        assert opened and "already holds a packed dataset" in str(e), e
    else:
        assert summary.samples == len(_source(kind)["y"] if kind == "arrays" else _source(kind))
    assert content(dest, fmt) == content(reference, fmt)
    verify_ok(dest)


@pytest.mark.parametrize("event, n", SHARD_POINTS, ids=[f"{e}#{n}" for e, n in SHARD_POINTS])
def test_killed_pack_shards(references, tmp_path, event, n):
    _kill_resume_check(tmp_path / "out", references["samples", "shards"], "samples", "shards", KillAt(event, n))


@pytest.mark.parametrize("event, n", LMDB_POINTS, ids=[f"{e}#{n}" for e, n in LMDB_POINTS])
def test_killed_pack_lmdb(references, tmp_path, small_chunks, event, n):
    _kill_resume_check(tmp_path / "out", references["samples", "lmdb"], "samples", "lmdb", KillAt(event, n))


@pytest.mark.parametrize("event, n", ARRAY_POINTS, ids=[f"{e}#{n}" for e, n in ARRAY_POINTS])
def test_killed_pack_arrays(references, tmp_path, event, n):
    _kill_resume_check(tmp_path / "out", references["arrays", "shards"], "arrays", "shards", KillAt(event, n))


@pytest.mark.parametrize("fmt", ["shards", "lmdb"])
def test_killed_at_random_moments_then_resumed(tmp_path, small_chunks, fmt):
    """SIGKILLs at seeded random moments, each run resuming the one before, until a run finishes."""
    kw = _pack_kwargs("samples", fmt)
    reference = tmp_path / "reference"
    t0 = time.perf_counter()
    fastload.pack(make_samples(600), reference, **kw)
    span = time.perf_counter() - t0
    dest = tmp_path / "out"
    rng = random.Random(f"kill-{fmt}")
    for _ in range(4):  # a pack that finished before 3 kills ran faster than the reference: kill sooner
        shutil.rmtree(dest, ignore_errors=True)
        kills, opened = 0, False
        for _ in range(40):
            code = in_child(lambda: fastload.pack(make_samples(600), dest, **kw),
                            kill_after=rng.uniform(0, span / 2))
            assert code in (0, -signal.SIGKILL), code
            kills += code == -signal.SIGKILL
            opened = opens_only_complete(dest, reference, fmt)  # killed: it opens only if it was complete
            if code == 0:
                assert opened
            if opened:
                break
        if kills >= 3:
            break
        span /= 2
    assert kills >= 3, f"only {kills} runs were killed before finishing"
    try:
        fastload.pack(make_samples(600), dest, **kw)
    except FastloadError as e:
        assert "already holds a packed dataset" in str(e)
    assert content(dest, fmt) == content(reference, fmt)
    verify_ok(dest)


@pytest.mark.parametrize("leftover", [{"lock.mdb": 8192}, {"lock.mdb": 8192, "data.mdb": 0},
                                      {"lock.mdb": 8192, "data.mdb": 4096}], ids=["lock", "empty", "one-page"])
def test_lmdb_killed_while_creating_its_environment_starts_over(references, tmp_path, small_chunks, leftover):
    """Killed inside LMDB's environment creation (found by the random-moment kills under load): the files
    hold no transaction, so the same command starts over instead of refusing the destination."""
    dest = tmp_path / "out"
    dest.mkdir()
    for name, size in leftover.items():
        (dest / name).write_bytes(bytes(size))
    fastload.pack(_source("samples"), dest, **_pack_kwargs("samples", "lmdb"))
    assert content(dest, "lmdb") == content(references["samples", "lmdb"], "lmdb")
    verify_ok(dest)


# -- a full disk ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt, where", [("shards", "first shard"), ("shards", "largest shard"),
                                        ("lmdb", 20000), ("lmdb", 40000)])
def test_file_size_limit_gives_a_clear_error_and_resumes(references, tmp_path, small_chunks, fmt, where):
    """RLIMIT_FSIZE makes the kernel refuse writes past a size per file (EFBIG), as a full disk refuses
    them (ENOSPC): the pack stops with a clear error and nothing that opens as complete."""
    reference = references["samples", fmt]
    if fmt == "lmdb":
        limit = where
    else:
        shards = [p.stat().st_size for p in sorted(reference.glob("*.fls"))]
        limit = {"first shard": shards[0] - 1, "largest shard": max(shards) - 1}[where]
        assert where != "largest shard" or shards.index(max(shards)) > 0  # a failure midway
    dest = tmp_path / "out"
    message = tmp_path / "message"

    def child():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write instead of a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        try:
            fastload.pack(_source("samples"), dest, **_pack_kwargs("samples", fmt))
        except FastloadError as e:
            resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
            message.write_text(str(e))
            os._exit(7)

    assert in_child(child) == 7
    text = message.read_text()
    assert f"cannot write the dataset at {dest}" in text and "run the same pack again" in text
    if fmt == "shards":
        assert "file size limit" in text and ".fls.tmp" in text
        assert not list(dest.glob("*.tmp")), "a partial file was left behind"
    with pytest.raises(FormatError):
        fastload.open(dest)
    fastload.pack(_source("samples"), dest, **_pack_kwargs("samples", fmt))
    assert content(dest, fmt) == content(reference, fmt)
    verify_ok(dest)


@pytest.mark.parametrize("where", ["third shard", "manifest"])
def test_disk_full_midway(references, tmp_path, monkeypatch, where):
    """ENOSPC once some bytes are written: what was finished is kept, and the pack resumes from it."""
    reference = references["samples", "shards"]
    dest = tmp_path / "out"
    shards = [p.stat().st_size for p in sorted(reference.glob("*.fls"))]
    budget = {"left": sum(shards[:2]) + 100 if where == "third shard" else sum(shards) + 100}
    real_open = open

    class Full(FileProxy):
        def write(self, data):
            budget["left"] -= len(data)
            if budget["left"] < 0:
                raise OSError(28, "No space left on device")
            return self.fh.write(data)

    for writer in (shards_format, manifest_format):  # the shard and the manifest writers
        monkeypatch.setattr(writer, "open", lambda p, m="r", *a, **k: Full(real_open(p, m, *a, **k)),
                            raising=False)
    with pytest.raises(FastloadError, match="No space left on device.*the disk is full"):
        fastload.pack(_source("samples"), dest, **_pack_kwargs("samples", "shards"))
    monkeypatch.undo()
    assert not list(dest.glob("*.tmp"))
    state = json.loads((dest / "pack_state.json").read_text())
    assert len(state["shards"]) == (2 if where == "third shard" else len(shards))
    with pytest.raises(FormatError, match="unfinished pack"):
        fastload.open(dest)
    summary = fastload.pack(_source("samples"), dest, **_pack_kwargs("samples", "shards"))
    assert summary.resumed_from > 0
    assert content(dest, "shards") == content(reference, "shards")
