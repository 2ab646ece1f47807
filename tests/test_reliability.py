"""Reliability: packs killed at chosen and at random moments, a full disk, shutdown leaving nothing behind on
every path, eight concurrent readers, and a short soak (``make soak`` runs bench/soak.py for 50 epochs).

Kills run the pack in a forked child that SIGKILLs itself at a named point (hooks on os.replace, the shard
writer's file writes, the removal of the resume state and LMDB's transactions: 26 points in all) or is
SIGKILLed by the parent after a seeded random delay.
After each kill: the destination either does not open (an unfinished pack) or opens complete and equal to
an uninterrupted pack; running the pack again resumes, and the result is byte-for-byte the reference
(LMDB: key for key), with ``fastload verify`` passing.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import random
import resource
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import fastload
from fastload import FastloadError, Field, FormatError
from fastload import transforms as T
from fastload.cli import main as cli
from fastload.formats import _manifest as manifest_format
from fastload.formats import lmdb as lmdb_format
from fastload.formats import shards as shards_format

from conftest import make_image_folder
from forking import in_child

pytestmark = pytest.mark.timeout(120)

FIELDS = {"var": Field.ndarray("var", "<f4", (None, 2))}


class Samples(list):
    """A map-style dataset of dict samples of every non-image kind."""


def make_samples(n: int, seed: int = 0) -> Samples:
    rng = np.random.default_rng(seed)
    return Samples({
        "label": int(rng.integers(-1000, 1000)),
        "emb": rng.standard_normal(4).astype("<f4"),
        "var": rng.standard_normal((i % 4, 2)).astype("<f4"),
        "raw": rng.bytes(int(rng.integers(1, 200))),
        "text": "ünï " * (i % 3) + str(i),
    } for i in range(n))


def dir_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


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


# -- a pack's worker process killed from outside --------------------------------------------------------

class SlowSamples(torch.utils.data.Dataset):
    def __len__(self):
        return 300

    def __getitem__(self, i):
        time.sleep(0.002)
        return {"x": np.full(16, i, np.float32), "name": f"s{i}"}


def test_pack_worker_killed_is_an_error_not_a_hang(tmp_path):
    dest = tmp_path / "out"
    threads = threading.active_count()
    killed = []

    def killer():
        deadline = time.time() + 20
        while time.time() < deadline and not killed:
            kids = multiprocessing.active_children()
            if kids and dest.exists() and len(list(dest.glob("shard-*.fls"))) >= 1:
                os.kill(kids[0].pid, signal.SIGKILL)
                killed.append(kids[0].pid)
            time.sleep(0.01)

    t = threading.Thread(target=killer)
    t.start()
    try:
        with pytest.raises(FastloadError, match=r"pack worker process died unexpectedly .*SIGKILL.*resume"):
            fastload.pack(SlowSamples(), dest, workers=2, shard_size="4K")
    finally:
        t.join()
    assert killed
    assert multiprocessing.active_children() == []
    assert threading.active_count() == threads
    fastload.pack(SlowSamples(), dest, workers=2, shard_size="4K")
    fastload.pack(SlowSamples(), tmp_path / "ref", workers=2, shard_size="4K")
    assert dir_bytes(dest) == dir_bytes(tmp_path / "ref")


# -- shutdown leaves nothing behind -----------------------------------------------------------------------

@dataclass(frozen=True)
class Resources:
    """What this process holds. Only what appears counts as left behind: a thread or process that goes
    away is not a leak (OpenBLAS, for one, ends its thread pool at every fork and starts it when needed)."""

    threads: frozenset      # OS thread ids (native pool threads included)
    children: frozenset     # child processes, zombies included
    fds: frozenset          # (descriptor, what it points at)
    shm: frozenset          # /dev/shm entries this process tree could have made
    maps: frozenset         # mappings of dataset files and shared-memory slots

    def new_since(self, before: "Resources") -> dict:
        return {name: sorted(getattr(self, name) - getattr(before, name)) for name in
                ("threads", "children", "fds", "shm", "maps") if getattr(self, name) - getattr(before, name)}


def _children() -> frozenset:
    """Child processes as 'pid command line'."""
    kids = set()
    for task in os.listdir("/proc/self/task"):
        try:
            kids.update(Path(f"/proc/self/task/{task}/children").read_text().split())
        except OSError:
            pass
    out = set()
    for pid in kids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            stat, cmd = "", "?"
        name, state = stat[stat.find("(") + 1:stat.rfind(")")], stat[stat.rfind(")") + 2:][:1]
        out.add(f"{pid} ({name}) {state} {cmd[:60]}")
    return frozenset(out)


def _own_threads() -> frozenset:
    """This process's threads that fastload could have started: Python threads and unnamed native ones
    inherit the process name. Threads a library named itself (grpc's "event_engine", "grpc_global_tim",
    "timer_manager" left by an earlier Ray test in the same pytest process) come and go on their own."""
    own = os.path.basename(os.path.realpath("/proc/self/exe"))[:15]
    out = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if name in (own, "python", "python3", "pytest"):
            out.add(tid)
    return frozenset(out)


def resources(*roots: Path) -> Resources:
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.add((int(fd), os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:
            pass
    keys = [str(os.getpid()), "fastload"]
    shm = frozenset(n for n in os.listdir("/dev/shm") if any(k in n for k in keys))
    with open("/proc/self/maps") as f:
        maps = frozenset(line.split()[0] + " " + line.split()[-1] for line in f
                         if "fastload-slot" in line or any(str(r) in line for r in roots))
    return Resources(_own_threads(), _children(), frozenset(fds), shm, maps)


def left_behind(before: Resources, *roots: Path, timeout: float = 2.0) -> dict:
    """What appeared since ``before`` and is still there once threads and processes that were told to
    stop have had ``timeout`` seconds to go. Empty when nothing was left behind."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        new = resources(*roots).new_since(before)
        if not new or time.monotonic() > deadline:
            return new
        time.sleep(0.02)


@pytest.fixture(scope="module")
def image_datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    folder = make_image_folder(root / "src", classes=4, per_class=12)
    fastload.pack(folder, root / "shards", workers=0, shard_size="16K")
    fastload.pack(folder, root / "lmdb", workers=0, format="lmdb")
    return root


class Tensors(torch.utils.data.Dataset):
    """Any dataset: the generic path (shared-memory worker processes)."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.001)
        return torch.full((3, 16, 16), i, dtype=torch.uint8), i


PATHS = ["fast-shards", "fast-lmdb", "generic"]


def make_loader(path: str, root: Path, **kw):
    if path == "generic":
        loader = fastload.DataLoader(Tensors(), batch_size=4, shuffle=True, num_workers=2, **kw)
        assert not loader.fast_path
        return loader
    ds = fastload.open(root / path.split("-")[1],
                       transforms={"image": [T.RandomResizedCrop(32), T.RandomHorizontalFlip()]})
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, seed=0, **kw)
    assert loader.fast_path
    return loader


class Interrupter:
    """Ctrl-C at a random moment: SIGINT to this process from another thread. The handler raises once per
    arming; the sender arms again only if the loop still makes progress (a KeyboardInterrupt raised inside
    a ``__del__`` is swallowed by Python), so no second one can land after the loop has stopped."""

    def __init__(self, delay: float):
        self.delay = delay
        self.armed = False
        self.progress = 0
        self.go = threading.Event()  # set by the loop once inside its try block
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def tick(self) -> None:
        self.progress += 1

    def _handler(self, signum, frame):
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt

    def _run(self):
        self.go.wait()
        if self.done.wait(self.delay):
            return
        seen = None
        while not self.done.is_set():
            if not self.armed and self.progress != seen:
                seen = self.progress
                self.armed = True
            if self.armed:
                os.kill(os.getpid(), signal.SIGINT)
            self.done.wait(0.05)

    def __enter__(self):
        self.previous = signal.signal(signal.SIGINT, self._handler)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.go.set()
        self.thread.join()
        self.armed = False
        for _ in range(10):  # a signal still pending runs the disarmed handler
            time.sleep(0.002)
        signal.signal(signal.SIGINT, self.previous)
        return False


def _run_until_interrupted(loader, delay: float) -> None:
    with Interrupter(delay) as ir:
        try:
            ir.go.set()
            while True:
                for _ in loader:
                    ir.tick()
        except KeyboardInterrupt:
            pass


HOWS = ["break", "exception", "del", "ctrl-c", "epoch-end"]

# Ctrl-C while the generic path starts or joins its workers: test_ctrl_c_while_* pin those two windows down.
SHUTDOWN_CASES = [(p, h) for p in PATHS for h in HOWS]


# a SIGINT may land in a fork hook or a __del__, where Python swallows it: the Interrupter sends another
CTRL_C_NOISE = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@CTRL_C_NOISE
@pytest.mark.parametrize("path, how", SHUTDOWN_CASES)
def test_shutdown_leaves_nothing(image_datasets, path, how):
    root = image_datasets
    gc.collect()
    before = resources(root)
    loader = make_loader(path, root)
    expected = len(loader)
    if how == "break":
        for k, _ in enumerate(loader):
            if k == 2:
                break
        del _
    elif how == "exception":
        with pytest.raises(RuntimeError, match="step failed"):
            for k, batch in enumerate(loader):
                if k == 1:
                    raise RuntimeError("step failed")
        del batch  # a batch still held keeps its slot (by design)
    elif how == "del":
        it = iter(loader)
        next(it)
        next(it)
        del it
    elif how == "ctrl-c":
        for delay in (0.0, 0.05):
            _run_until_interrupted(loader, delay)
    else:
        assert sum(1 for _ in loader) == expected
    gc.collect()
    # the loader still works after any of these, and a full epoch ends clean
    assert sum(1 for _ in loader) == expected
    del loader
    assert not left_behind(before, root)


@CTRL_C_NOISE
@pytest.mark.parametrize("path", ["fast-shards", "fast-lmdb", "generic"])
def test_ctrl_c_at_random_moments(image_datasets, path):
    """Ten SIGINTs at seeded random moments of a loop over epochs."""
    root = image_datasets
    gc.collect()
    before = resources(root)
    loader = make_loader(path, root)
    rng = random.Random(path)
    for _ in range(10):
        _run_until_interrupted(loader, rng.uniform(0, 0.2))
    assert sum(1 for _ in loader) == len(loader)
    del loader
    assert not left_behind(before, root)


class Stuck(torch.utils.data.Dataset):
    """Samples after the first batch take a minute: the workers are busy when told to stop."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i >= 4:
            time.sleep(60)
        return torch.zeros(4)


def test_ctrl_c_while_workers_are_joined(image_datasets, monkeypatch):
    from fastload import _workers

    before = resources(image_datasets)
    monkeypatch.setattr(_workers._tutils, "MP_STATUS_CHECK_INTERVAL", 0.2)  # busy workers are terminated sooner
    it = iter(fastload.DataLoader(Stuck(), batch_size=4, num_workers=2))
    next(it)
    real_join = multiprocessing.process.BaseProcess.join

    def join(self, timeout=None):  # Ctrl-C while the shutdown waits for the first terminated worker
        monkeypatch.setattr(multiprocessing.process.BaseProcess, "join", real_join)
        raise KeyboardInterrupt

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "join", join)
    with pytest.raises(KeyboardInterrupt):
        it._shutdown_workers()
    del it
    assert not left_behind(before, image_datasets, timeout=0.5)


def test_ctrl_c_while_workers_start(image_datasets, monkeypatch):
    from multiprocessing import popen_fork

    before = resources(image_datasets)
    loader = make_loader("generic", image_datasets)
    real_launch = popen_fork.Popen._launch

    def launch(self, process_obj):  # Ctrl-C right after the second worker was forked, before start returns
        real_launch(self, process_obj)
        if process_obj.name.endswith("-1"):
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(popen_fork.Popen, "_launch", launch)
    with pytest.raises(KeyboardInterrupt):
        iter(loader)
    monkeypatch.undo()
    del loader
    assert not left_behind(before, image_datasets, timeout=0.5)


def test_killed_worker_is_a_clear_error_and_leaves_nothing(image_datasets):
    before = resources(image_datasets)
    loader = make_loader("generic", image_datasets)
    it = iter(loader)
    next(it)
    victim = it._workers[0].pid
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=rf"^DataLoader worker \(pid {victim}\) is killed by signal: Killed\. \(fastload worker 0, SIGKILL"):
        for _ in range(100):
            next(it)
    del it
    assert sum(1 for _ in loader) == len(loader)  # a fresh epoch starts fresh workers
    del loader
    assert not left_behind(before, image_datasets)


@pytest.mark.parametrize("fmt", ["shards", "lmdb"])
def test_closing_a_dataset_releases_its_files(image_datasets, fmt):
    root = image_datasets / fmt
    gc.collect()
    before = resources(root)
    ds = fastload.open(root)
    for i in range(len(ds)):
        ds[i]
    assert resources(root).new_since(before)["maps"]  # the shards / the environment are mapped
    del ds
    assert not left_behind(before, root)


# -- eight readers at once ------------------------------------------------------------------------------

def _digest_rank(path: Path, rank: int, world: int) -> str:
    import hashlib

    h = hashlib.sha256()
    ds = fastload.open(path, transforms={"image": [T.RandomResizedCrop(24), T.RandomHorizontalFlip()]})
    for images, labels in fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=11, rank=rank,
                                              world_size=world, num_workers=2):
        h.update(images.numpy().tobytes())
        h.update(labels.numpy().tobytes())
    raw = fastload.open(path, decode=False)
    whole = hashlib.sha256(b"".join(raw[i][0] + raw[i][1].to_bytes(8, "little") for i in range(len(raw))))
    return h.hexdigest() + ":" + whole.hexdigest()


@pytest.mark.parametrize("fmt", ["shards", "lmdb"])
def test_eight_concurrent_readers_get_the_bytes_of_one(image_datasets, fmt):
    path = image_datasets / fmt
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(8)
    queue = ctx.Queue()

    def reader(rank):
        barrier.wait(timeout=30)  # all eight read at the same time
        queue.put((rank, _digest_rank(path, rank, 8)))

    procs = [ctx.Process(target=reader, args=(r,)) for r in range(8)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=90) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    alone = {r: _digest_rank(path, r, 8) for r in range(8)}
    assert got == alone
    assert len({d.split(":")[0] for d in got.values()}) == 8  # each rank read its own part
    assert len({d.split(":")[1] for d in got.values()}) == 1  # and every process saw the same dataset


# -- a short soak ---------------------------------------------------------------------------------------

def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("path", ["fast-shards", "generic"])
def test_short_soak_is_flat(image_datasets, path):
    """Eight epochs: after the first, RSS stays within 5% and descriptors and threads do not move."""
    loader = make_loader(path, image_datasets, persistent_workers=path == "generic")
    samples = []
    for epoch in range(8):
        for _ in loader:
            pass
        gc.collect()
        samples.append((_rss(), len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))))
    rss = [s[0] for s in samples[1:]]
    if not os.environ.get("FASTLOAD_SANITIZER_RUN"):  # ASan's quarantine and shadow memory move RSS
        assert max(rss) <= 1.05 * min(rss), [r >> 20 for r in rss]
    assert len({s[1] for s in samples[1:]}) == 1, samples
    assert len({s[2] for s in samples[1:]}) == 1, samples
