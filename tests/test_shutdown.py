"""Shutdown leaves nothing behind: threads, processes, descriptors, mappings and /dev/shm before and after
every way a loop can end (break, exception, del, a reference cycle, Ctrl-C, epoch end) on every loader path,
Ctrl-C at random moments, inside worker start and join, and to a real process group, a killed worker, and a
short soak (``make soak`` runs bench/soak.py for 50 epochs). Crash safety of packs: pack/test_crash.py.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

import fastload
from fastload import transforms as T

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parent.parent


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
    shm_seen: frozenset = field(default=frozenset(), compare=False)  # every /dev/shm entry at the time

    def new_since(self, before: "Resources") -> dict:
        new = {name: getattr(self, name) - getattr(before, name)
               for name in ("threads", "children", "fds", "shm", "maps")}
        new["shm"] -= before.shm_seen  # named after a worker pid, but there before (another process's)
        return {name: sorted(v) for name, v in new.items() if v}


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


def resources(*roots: Path, pids=()) -> Resources:
    """What this process holds now; ``pids``: worker processes whose /dev/shm entries count as ours too."""
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.add((int(fd), os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:
            pass
    ours = re.compile("|".join([rf"(?<!\d){p}(?!\d)" for p in (os.getpid(), *pids)] + ["fastload"]))
    seen = frozenset(os.listdir("/dev/shm"))
    shm = frozenset(n for n in seen if ours.search(n))
    with open("/proc/self/maps") as f:
        maps = frozenset(line.split()[0] + " " + line.split()[-1] for line in f
                         if "fastload-slot" in line or any(str(r) in line for r in roots))
    return Resources(_own_threads(), _children(), frozenset(fds), shm, maps, seen)


def left_behind(before: Resources, *roots: Path, timeout: float = 2.0, pids=()) -> dict:
    """What appeared since ``before`` and is still there once threads and processes that were told to
    stop have had ``timeout`` seconds to go. Empty when nothing was left behind. ``pids``: worker
    processes started since ``before`` (``started_pids``), whose /dev/shm entries count as ours."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        new = resources(*roots, pids=pids).new_since(before)
        if not new or time.monotonic() > deadline:
            return new
        time.sleep(0.02)


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


HOWS = ["break", "exception", "del", "gc", "ctrl-c", "epoch-end"]

# Ctrl-C while the generic path starts or joins its workers: test_ctrl_c_while_* pin those two windows down.
SHUTDOWN_CASES = [(p, h) for p in PATHS for h in HOWS]


# a SIGINT may land in a fork hook or a __del__, where Python swallows it: the Interrupter sends another
CTRL_C_NOISE = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture
def started_pids(monkeypatch) -> list:
    """The pids of the processes multiprocessing starts during the test (the generic path's workers)."""
    pids = []
    real_start = multiprocessing.process.BaseProcess.start

    def start(self):
        try:
            real_start(self)
        finally:
            if self._popen is not None:
                pids.append(self._popen.pid)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start)
    return pids


@CTRL_C_NOISE
@pytest.mark.parametrize("path, how", SHUTDOWN_CASES)
def test_shutdown_leaves_nothing(packed_images_by_format, started_pids, path, how):
    root = packed_images_by_format
    gc.collect()
    before = resources(root)
    loader = make_loader(path, root)
    expected = len(loader)
    if how == "break":
        it = iter(loader)  # an iterator made and dropped unused first
        del it
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
    elif how == "gc":  # the iterator sits in a reference cycle: only the cycle collector ends it
        it = iter(loader)
        next(it)
        cycle = [it]
        cycle.append(cycle)
        del it, cycle
        gc.collect()
    elif how == "ctrl-c":
        for delay in (0.0, 0.05):
            _run_until_interrupted(loader, delay)
    else:  # every batch still held: the workers are gone all the same once the epoch ends
        kept = list(loader)
        assert len(kept) == expected and multiprocessing.active_children() == []
        del kept
    gc.collect()
    # the loader still works after any of these, and a full epoch ends clean
    assert sum(1 for _ in loader) == expected
    del loader
    assert not left_behind(before, root, pids=started_pids)


@CTRL_C_NOISE
@pytest.mark.parametrize("path", ["fast-shards", "fast-lmdb", "generic"])
def test_ctrl_c_at_random_moments(packed_images_by_format, path):
    """Ten SIGINTs at seeded random moments of a loop over epochs."""
    root = packed_images_by_format
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


def test_ctrl_c_while_workers_are_joined(packed_images_by_format, monkeypatch):
    from fastload._generic import workers as _workers

    before = resources(packed_images_by_format)
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
    assert not left_behind(before, packed_images_by_format, timeout=0.5)


def test_ctrl_c_right_after_a_worker_is_reaped(packed_images_by_format, monkeypatch):
    """A SIGINT landing inside multiprocessing's poll(), after waitpid() reaped a worker and before the exit
    code is stored: that Process would look alive for ever (waitpid then fails with ECHILD), stay among
    multiprocessing's children with its pipes open, and be sent SIGTERM/SIGKILL by pid later. The reap holds
    Ctrl-C back and raises it once every worker is reaped."""
    from fastload._generic import workers as _workers

    before = resources(packed_images_by_format)
    monkeypatch.setattr(_workers._tutils, "MP_STATUS_CHECK_INTERVAL", 0.2)
    it = iter(fastload.DataLoader(Stuck(), batch_size=4, num_workers=2))
    next(it)
    real_waitpid = os.waitpid

    def waitpid(pid, options):
        got = real_waitpid(pid, options)
        if got[0] == pid:  # reaped: the signal is handled before waitpid's caller runs its next line
            monkeypatch.setattr(os, "waitpid", real_waitpid)
            signal.raise_signal(signal.SIGINT)
        return got

    monkeypatch.setattr(os, "waitpid", waitpid)
    with pytest.raises(KeyboardInterrupt):
        it._shutdown_workers()
    assert os.waitpid is real_waitpid  # the signal did land
    del it
    gc.collect()
    assert multiprocessing.active_children() == []
    assert not left_behind(before, packed_images_by_format, timeout=0.5)


def test_ctrl_c_while_workers_start(packed_images_by_format, monkeypatch):
    from multiprocessing import popen_fork

    before = resources(packed_images_by_format)
    loader = make_loader("generic", packed_images_by_format)
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
    assert not left_behind(before, packed_images_by_format, timeout=0.5)


@pytest.mark.parametrize("wid", [0, 1])
def test_killed_worker_is_a_clear_error_and_leaves_nothing(packed_images_by_format, wid):
    """Reported with its pid and worker number, not hung on; a fresh epoch starts fresh workers."""
    before = resources(packed_images_by_format)
    loader = make_loader("generic", packed_images_by_format)
    it = iter(loader)
    next(it)
    victim = it._workers[wid].pid
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=rf"^DataLoader worker \(pid {victim}\) is killed by signal: Killed\. \(fastload worker {wid}, SIGKILL"):
        for _ in range(100):
            next(it)
    del it
    assert sum(1 for _ in loader) == len(loader)  # a fresh epoch starts fresh workers
    del loader
    assert not left_behind(before, packed_images_by_format)


def test_ctrl_c_past_the_fetch_stops_the_workers_before_the_loop_sees_it(packed_images_by_format, monkeypatch):
    """A Ctrl-C that lands after a batch arrived, still inside the generic path's ``Counted`` (counting it): a loop
    catching KeyboardInterrupt finds no worker alive, though the exception's traceback still holds the iterators
    (was: 2 children alive there; test_ctrl_c_leaves_nothing saw it once under load)."""
    from fastload.fast.position import Progress

    calls = {"n": 0}

    def second_call_interrupted(real):
        def call(self, *a, **kw):
            calls["n"] += 1
            if calls["n"] == 2:
                raise KeyboardInterrupt
            return real(self, *a, **kw)
        return call

    monkeypatch.setattr(Progress, "advance", second_call_interrupted(Progress.advance))
    loader = make_loader("generic", packed_images_by_format)
    alive = None
    try:
        for _ in loader:
            pass
    except KeyboardInterrupt:
        alive = [p.pid for p in multiprocessing.active_children()]
    assert alive == [], f"worker processes {alive} still alive when the loop caught Ctrl-C"


CTRL_C = textwrap.dedent("""
    import multiprocessing, sys, threading, time
    sys.path[:0] = [{root!r}, {tests!r}]
    import fastload
    from workers_common import Slow
    loader = fastload.DataLoader(Slow(0.05, n=100000), batch_size=4, num_workers=2)
    try:
        for b in loader:
            print("READY", flush=True)
    except KeyboardInterrupt:
        print("INTERRUPTED", len(multiprocessing.active_children()), threading.active_count(), flush=True)
""")


@pytest.mark.timeout(40)
@pytest.mark.parametrize("target", ["group", "main"])
def test_ctrl_c_leaves_nothing(target):
    script = CTRL_C.format(root=str(ROOT), tests=str(ROOT / "tests"))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "READY"
        if target == "group":  # what a terminal's Ctrl-C does
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "INTERRUPTED 0 1" in out and proc.returncode == 0
    for _ in range(50):  # every process of the group is gone
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("worker processes outlived the interrupted loader")


def test_closing_a_dataset_releases_its_files(packed_images):
    root = packed_images
    gc.collect()
    before = resources(root)
    ds = fastload.open(root)
    for i in range(len(ds)):
        ds[i]
    assert resources(root).new_since(before)["maps"]  # the shards / the environment are mapped
    del ds
    assert not left_behind(before, root)


# -- a short soak ---------------------------------------------------------------------------------------

def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("path", ["fast-shards", "generic"])
def test_short_soak_is_flat(packed_images_by_format, path):
    """Eight epochs: after the first, RSS stays within 5% and descriptors and threads do not move."""
    loader = make_loader(path, packed_images_by_format, persistent_workers=path == "generic")
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


EXIT_MID_EPOCH = """
import sys
import fastload
from fastload import transforms as T
ds = fastload.open(sys.argv[1], transforms={"image": [T.RandomResizedCrop(224)]})
it = iter(fastload.DataLoader(ds, batch_size=16, num_workers=1, seed=0))
next(it)
# the script ends here, while the producer thread decodes the next batches with the GIL released
"""


def test_a_script_that_ends_mid_epoch_exits_cleanly(tmp_path):
    """A process that ends while the producer thread is inside the native decode (a script stopping mid-epoch,
    a DDP rank whose last iterator was not drained) aborted with 'terminate called without an active
    exception' (exit 134) in most runs: Python's finalization ends daemon threads with pthread_exit when they
    take the GIL back, and that unwind through the binding's GIL guard calls std::terminate. The producers are
    now stopped and joined at exit (CI saw it once in a Lightning ddp_spawn rank)."""
    import io

    from PIL import Image

    from conftest import jpeg_bytes

    samples = [{"image": Image.open(io.BytesIO(jpeg_bytes(1000, 1400, seed=i))), "label": i} for i in range(32)]
    fastload.pack(samples, tmp_path / "ds", workers=0)
    (tmp_path / "run.py").write_text(EXIT_MID_EPOCH)
    for _ in range(4):
        r = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "ds")], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0 and "terminate called" not in r.stderr, (r.returncode, r.stderr[-500:])
