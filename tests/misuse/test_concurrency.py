"""Concurrency misuse: threads, fork and signals during an iteration of a fast-path loader.

What must hold (``fastload.DataLoader``'s docstring, "Threads"): a fast-path loader runs one iteration at a
time; from another thread a second ``iter(loader)`` is refused at once with an error naming the fix (one loader
per thread), never a batch holding another batch's pixels and never a hang; one iterator shared by threads
hands each batch whole to one of them; ``state_dict()`` from another thread is a position between batches;
``load_state_dict()`` from another thread during an iteration is refused; loaders over one dataset are
independent. An iteration belongs to the process that started it: a forked child iterates the loader afresh.
A signal during ``next()`` leaves no thread behind and the loader reusable.

Races are run many times over; every wait has a bound, so a hang fails the test instead of blocking the run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

import fastload
from fastload._fill.batcher import Batcher
from fastload.fast import producer

from conftest import open_train

pytestmark = pytest.mark.timeout(240)

KW = dict(batch_size=8, shuffle=True, seed=3)  # the loader (num_workers per test)
JOIN = 60  # seconds a thread of a test may take before it counts as hung


def grab(batches) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in batches]


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, rx) and torch.equal(y, ry) for (x, y), (rx, ry) in zip(a, b))


def reference(path, epochs: int = 2, **kw) -> list[list]:
    """Each epoch's batches of a loader run alone, in one thread."""
    loader = fastload.DataLoader(open_train(path), **kw)
    return [grab(loader) for _ in range(epochs)]


def run_threads(targets, timeout: float = JOIN) -> None:
    threads = [threading.Thread(target=t, daemon=True, name=f"user-{k}") for k, t in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    hung = [t.name for t in threads if t.is_alive()]
    assert not hung, f"threads still running after {timeout}s (a hang): {hung}"


def producer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fastload-batcher"]


@pytest.fixture
def threaded(monkeypatch):
    """Every batch filled by the producer thread (the fill policy fills cheap batches inline otherwise)."""
    monkeypatch.setattr(producer, "INLINE_BELOW", 0.0)


@pytest.fixture
def slow_fill(monkeypatch):
    """``slow_fill.delay``: seconds each batch's fill sleeps first (0: none), to hold a next() in flight."""
    real = Batcher.fill

    class Slow:
        delay = 0.0

    def fill(self, *a, **k):
        if Slow.delay:
            time.sleep(Slow.delay)
        return real(self, *a, **k)

    monkeypatch.setattr(Batcher, "fill", fill)
    return Slow


# -- threads ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_two_threads_iterating_one_loader_never_mix_batches_or_hang(image_shards, workers):
    """The issue's case: one loader, `for batch in loader` in two threads at once. Before: batches holding
    another batch's images under the right labels, a stopped iterator after some batches, or a hang. Now each
    thread either runs a whole epoch exactly as a loader alone does, or is refused before any batch with an
    error naming the fix."""
    kw = KW | dict(num_workers=workers)
    ref = reference(image_shards, **kw)
    for trial in range(12):
        loader = fastload.DataLoader(open_train(image_shards), **kw)
        gate = threading.Barrier(2)
        got: list = [None, None]

        def consume(k):
            batches = []
            gate.wait()
            try:
                for x, y in loader:
                    batches.append((x.clone(), y.clone()))
                got[k] = ("ok", batches)
            except RuntimeError as e:
                got[k] = (str(e), batches)

        run_threads([lambda: consume(0), lambda: consume(1)])
        epochs = []
        for outcome, batches in got:
            if outcome == "ok":
                match = [e for e, r in enumerate(ref) if same(batches, r)]
                assert match, f"trial {trial}: a thread got {len(batches)} batches that are no epoch of the loader"
                epochs += match
            else:
                assert "its own loader" in outcome and "thread" in outcome, outcome
                assert batches == [], f"trial {trial}: refused after {len(batches)} batches: {outcome}"
        assert epochs and len(set(epochs)) == len(epochs), f"trial {trial}: epochs {epochs}"


@pytest.mark.parametrize("workers", [0, 2])
def test_one_iterator_shared_by_threads_hands_each_batch_whole_once(image_shards, workers):
    """Three threads pulling next() from one iterator: together they get the epoch's batches, each once and
    whole (before: two threads filling through one chain at once, or starting it twice)."""
    kw = KW | dict(num_workers=workers)
    ref = reference(image_shards, epochs=1, **kw)[0]
    for trial in range(12):
        it = iter(fastload.DataLoader(open_train(image_shards), **kw))
        gate = threading.Barrier(3)
        got: list = []
        errors: list = []

        def pull():
            gate.wait()
            try:
                for x, y in it:
                    got.append((x.clone(), y.clone()))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))

        run_threads([pull] * 3)
        assert not errors, f"trial {trial}: {errors}"
        left = list(ref)
        for x, y in got:
            k = next((k for k, (rx, ry) in enumerate(left) if torch.equal(x, rx) and torch.equal(y, ry)), None)
            assert k is not None, f"trial {trial}: a batch that is none of the epoch's (or one handed out twice)"
            left.pop(k)
        assert not left, f"trial {trial}: {len(left)} of the epoch's batches never came"


def test_iter_from_another_thread_is_refused_at_once_until_the_iteration_ends(image_shards):
    loader = fastload.DataLoader(open_train(image_shards), **KW, num_workers=2)
    ref = reference(image_shards, epochs=4, **KW, num_workers=2)
    it = iter(loader)
    first = grab([next(it)])
    seen: list = []

    def other():
        try:
            iter(loader)
            seen.append("no error")
        except RuntimeError as e:
            seen.append(str(e))

    run_threads([other])
    assert "thread 'user-0'" in seen[0] and "its own loader" in seen[0] and "close()" in seen[0], seen[0]
    # the running iteration is untouched
    assert same(first + grab(it), ref[0])
    # it ran out: another thread may iterate now (the next epoch)
    run_threads([lambda: seen.append(grab(loader))])
    assert same(seen[1], ref[1])
    # an iteration whose thread has ended no longer runs: another thread takes over (it stops that one)
    held: list = []
    run_threads([lambda: held.append((lambda i: (i, next(i)))(iter(loader)))])
    assert same(grab(loader), ref[3])  # epoch 2's iteration, stopped after one batch, then epoch 3
    with pytest.raises(RuntimeError, match="newer iter"):
        next(held[0][0])


def test_close_from_another_thread_while_next_waits_never_hangs(image_shards, threaded, slow_fill):
    """Before: close() stopped the producer thread, which dropped the batch it was filling, and the next() waiting
    for it in the loop's thread waited forever."""
    loader = fastload.DataLoader(open_train(image_shards), **KW, num_workers=2)
    it = iter(loader)
    next(it)
    slow_fill.delay = 0.5
    out: list = []

    def loop():
        try:
            while True:
                out.append(next(it))
        except StopIteration:
            out.append("stop")

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    time.sleep(0.2)  # the loop's next() waits for the producer now
    it.close()
    t.join(JOIN)
    assert not t.is_alive(), "the loop's next() still waits after close() (a hang)"
    assert out[-1] == "stop"
    with pytest.raises(StopIteration):
        next(it)


def test_next_after_the_epoch_ran_out_or_after_close_never_hangs(image_shards, threaded):
    """Before: with the producer thread filling, a next() after StopIteration, or after close(), waited forever
    on the producer's queue; torch's iterator raises StopIteration again."""
    loader = fastload.DataLoader(open_train(image_shards), **KW, num_workers=2)
    out: list = []

    def after():
        it = iter(loader)
        out.append(len(grab(it)))
        for _ in range(2):
            try:
                next(it)
                out.append("a batch")
            except StopIteration:
                out.append("stop")
        it = iter(loader)
        next(it)
        it.close()
        try:
            next(it)
            out.append("a batch after close")
        except StopIteration:
            out.append("stop")

    run_threads([after], timeout=JOIN)
    assert out == [len(loader), "stop", "stop", "stop"]


def test_state_dict_from_another_thread_is_a_position_between_batches(image_shards):
    """A checkpoint thread saving while the loop runs (pinned: correct before too): each state is the position
    after the batches handed out so far, and resumes to exactly the batches that came next."""
    kw = KW | dict(num_workers=2)
    ref = reference(image_shards, epochs=2, **kw)
    per = len(ref[0])
    loader = fastload.DataLoader(open_train(image_shards), **kw)
    handed = [0]
    done = threading.Event()
    states: list = []

    def checkpoint():
        while not done.is_set():
            before = handed[0]
            s = loader.state_dict()
            states.append((before, s, handed[0]))

    def loop():
        try:
            for _ in range(2):
                for _batch in loader:
                    handed[0] += 1
                    time.sleep(0.002)
        finally:
            done.set()

    run_threads([loop, checkpoint])
    assert len(states) > 10
    for before, s, after in states:
        at = s["epoch"] * per + s["batches_done"]
        assert before <= at <= after + 1, (before, s, after)
    picks = [s for _, s, _ in states if 0 < s["batches_done"]][:: max(1, len(states) // 4)][:4]
    for s in picks:
        resumed = fastload.DataLoader(open_train(image_shards), **kw)
        resumed.load_state_dict(s)
        assert same(grab(resumed), ref[s["epoch"]][s["batches_done"]:])


def test_load_state_dict_from_another_thread_during_an_iteration_is_refused(image_shards):
    """Before: it was taken silently, and the running iteration went on with the loaded seed (other crops)."""
    kw = KW | dict(num_workers=2)
    ref = reference(image_shards, epochs=1, **kw)[0]
    saved = fastload.DataLoader(open_train(image_shards), **(kw | dict(seed=99)))
    it0 = iter(saved)
    next(it0), next(it0)
    state = saved.state_dict()
    loader = fastload.DataLoader(open_train(image_shards), **kw)
    it = iter(loader)
    head = grab([next(it)])
    seen: list = []

    def other():
        try:
            loader.load_state_dict(state)
            seen.append("no error")
        except RuntimeError as e:
            seen.append(str(e))

    run_threads([other])
    assert "load_state_dict()" in seen[0] and "its own loader" in seen[0], seen[0]
    assert same(head + grab(it), ref)
    loader.load_state_dict(state)  # once the iteration ran out, from any thread
    run_threads([lambda: seen.append(loader.state_dict())])
    assert seen[1]["seed"] == 99 and seen[1]["batches_done"] == 2


@pytest.mark.parametrize("workers", [0, 2])
def test_load_state_dict_in_the_iterating_thread_stops_the_running_iteration(image_shards, workers):
    """load_state_dict() in the thread that runs an iteration replaces the position and seed that iteration reads:
    was, it went on (a producer thread filling ahead too) with the loaded seed's crops over its own order, batches
    neither loader makes. Now it stops, its next() saying why, and iter(loader) runs from the loaded position."""
    kw = KW | dict(num_workers=workers)
    saved = fastload.DataLoader(open_train(image_shards), **(kw | dict(seed=99)))
    ref = reference(image_shards, epochs=1, **(kw | dict(seed=99)))[0]
    it0 = iter(saved)
    next(it0), next(it0)
    state = saved.state_dict()
    loader = fastload.DataLoader(open_train(image_shards), **kw)
    it = iter(loader)
    next(it)
    loader.load_state_dict(state)
    with pytest.raises(RuntimeError, match=r"load_state_dict\(\) was called on its loader.*iter\(loader\)"):
        next(it)
    assert same(grab(loader), ref[2:])


def test_set_epoch_from_another_thread_is_whole_before_an_iteration_starts(image_shards, monkeypatch):
    """set_epoch() writes the next epoch, drops a loaded mid-epoch position and sets the user's sampler's epoch in
    several steps; an iteration starting in another thread meanwhile read half of it: was, "epoch 3" run with the
    sampler still at the loaded epoch 0 (epoch 0's order). It now holds the loader's lock, as iter() does."""
    from fastload._front import sampling as _sampling

    ds = open_train(image_shards)

    def make():
        sampler = torch.utils.data.DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=5)
        return fastload.DataLoader(ds, batch_size=8, sampler=sampler, seed=3)

    ref = make()
    ref.set_epoch(3)
    want = [y.clone() for _, y in ref]
    saved = make()
    it = iter(saved)
    next(it), next(it)
    state = saved.state_dict()
    loader = make()
    loader.load_state_dict(state)  # a mid-epoch position of epoch 0
    real = _sampling.SamplerOrder.drop_resume
    inside = threading.Event()

    def slow_drop(self):
        inside.set()
        time.sleep(0.5)  # the window: the epoch is written, the loaded position not yet dropped
        real(self)

    monkeypatch.setattr(_sampling.SamplerOrder, "drop_resume", slow_drop)
    setter = threading.Thread(target=lambda: loader.set_epoch(3), daemon=True)
    setter.start()
    assert inside.wait(JOIN)
    got = [y.clone() for _, y in loader]
    setter.join(JOIN)
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("fmt", ["shards", "lmdb"])
@pytest.mark.parametrize("workers", [0, 2])
def test_loaders_over_one_dataset_in_threads_are_independent(packed_images_by_format, fmt, workers):
    """One dataset object, a loader per thread (the fix the errors above name); pinned: they were independent
    before too (the dataset keeps no per-iteration state: the reader's handles are read-only and each loader
    has its own batcher, slots, plans and decoders)."""
    path = packed_images_by_format / fmt
    ds = open_train(path)
    seeds = [3, 3, 4]
    refs = {s: grab(fastload.DataLoader(open_train(path), **(KW | dict(seed=s, num_workers=workers))))
            for s in set(seeds)}
    for trial in range(5):
        got: dict = {}
        gate = threading.Barrier(len(seeds))

        def run(k, seed):
            loader = fastload.DataLoader(ds, **(KW | dict(seed=seed, num_workers=workers)))
            gate.wait()
            got[k] = grab(loader)

        run_threads([lambda k=k, s=s: run(k, s) for k, s in enumerate(seeds)])
        for k, s in enumerate(seeds):
            assert same(got.get(k, []), refs[s]), f"trial {trial}: thread {k} (seed {s}) got other batches"


# -- fork ---------------------------------------------------------------------------------------------------
def in_child(fn, timeout: float = JOIN) -> tuple[int | str, str]:
    """Run ``fn()`` in a forked child: (exit code, or "hung" when it ran past ``timeout`` and was killed; what it
    wrote). The child never returns into pytest."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            msg = str(fn())
        except BaseException as e:  # noqa: BLE001 - the parent reads it
            msg, code = f"{type(e).__name__}: {e}", 3
        os.write(w, msg.encode()[:60000])
        os._exit(code)
    os.close(w)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            code = "hung"
            break
        time.sleep(0.05)
    with os.fdopen(r, "rb") as f:
        return code, f.read().decode(errors="replace")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() in a process with threads
def test_fork_during_an_iteration(image_shards, threaded):
    """Mid-epoch, with the producer thread running, the process forks. The child iterates the same loader (an
    iteration of its own: the next epoch) and a new loader over the same dataset, each exactly as in the parent;
    the parent's iterator in the child says it belongs to the parent (before: it handed out the batches the
    parent's producer thread had queued at the fork, then waited forever for that thread). The parent's iteration
    is untouched."""
    kw = KW | dict(num_workers=2)
    ref = reference(image_shards, epochs=2, **kw)
    ds = open_train(image_shards)
    loader = fastload.DataLoader(ds, **kw)
    it = iter(loader)
    head = grab([next(it), next(it)])

    def same_loader():
        return "same" if same(grab(loader), ref[1]) else "different batches"

    def new_loader():
        return "same" if same(grab(fastload.DataLoader(ds, **kw)), ref[0]) else "different batches"

    assert in_child(same_loader) == (0, "same")
    assert in_child(new_loader) == (0, "same")
    code, msg = in_child(lambda: next(it))
    assert code == 3 and "RuntimeError" in msg and "forked" in msg and "iter(loader) in this process" in msg, \
        (code, msg)
    assert same(head + grab(it), ref[0])


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_fork_while_another_thread_is_inside_next(image_shards, threaded, slow_fill):
    """A thread forks while the loop's thread is inside next() (holding the loader's lock): the child iterates the
    loader all the same (its lock is the child's own; the lock is new in this change, which without a new one per
    process hung here)."""
    kw = KW | dict(num_workers=2)
    ref = reference(image_shards, epochs=2, **kw)
    loader = fastload.DataLoader(open_train(image_shards), **kw)
    it = iter(loader)
    slow_fill.delay = 1.0
    inside = threading.Thread(target=lambda: next(it), daemon=True)  # the first batch: filled in a second
    inside.start()
    time.sleep(0.3)
    slow_fill.delay = 0.0  # in the child (and in the parent once the batch in flight is filled)
    result = in_child(lambda: "same" if same(grab(loader), ref[1]) else "different batches", timeout=30)
    inside.join(JOIN)
    assert result == (0, "same")


# -- signals ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_sigint_inside_next_leaves_no_thread_and_the_loader_reusable(image_shards, slow_fill, workers):
    """Ctrl-C while the loop waits inside next() (pinned): KeyboardInterrupt promptly, the same thread iterates
    the loader again at once (the interrupted iteration stopped by it, as by any newer one), and once the
    interrupted iterator is dropped no producer thread is left."""
    kw = KW | dict(num_workers=workers)
    ref = reference(image_shards, epochs=2, **kw)
    before = len(producer_threads())
    loader = fastload.DataLoader(open_train(image_shards), **kw)
    it = iter(loader)
    next(it)
    slow_fill.delay = 2.0
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    main = threading.main_thread().ident
    timer = threading.Timer(0.3, lambda: signal.pthread_kill(main, signal.SIGINT))
    try:
        t = time.monotonic()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            for _ in range(10):  # the batches filled ahead come at once; then it waits for a slow one
                next(it)
        assert time.monotonic() - t < 5
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    slow_fill.delay = 0.0
    assert same(grab(loader), ref[1])
    with pytest.raises(RuntimeError, match="newer iter"):
        next(it)
    del it
    deadline = time.monotonic() + 10
    while len(producer_threads()) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(producer_threads()) <= before, [t.name for t in producer_threads()]


SIGTERM_SCRIPT = """
import json, signal, sys, time, fastload
from fastload import transforms as T
mode, out = sys.argv[1], sys.argv[2]
stop = []
if mode == "exit":
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
else:
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
ds = fastload.open({path!r}, transforms={{"image": [T.RandomResizedCrop(32), T.RandomHorizontalFlip()]}})
loader = fastload.DataLoader(ds, batch_size=8, shuffle=True, seed=3, num_workers=2)
print("ready", flush=True)
for epoch in range(1000):
    for k, batch in enumerate(loader):
        time.sleep(0.05)
        if stop:
            json.dump(loader.state_dict(), open(out, "w"))
            print("saved", flush=True)
            sys.exit(0)
"""


@pytest.mark.parametrize("mode", ["exit", "flag"])
def test_sigterm_handler_during_iteration(image_shards, tmp_path, mode):
    """A job scheduler's SIGTERM while the loop runs (pinned): a handler that calls sys.exit ends the process at
    once with its code and nothing on stderr (no abort from the producer thread at exit); a handler that sets a
    flag lets the loop save state_dict() and stop, and that state resumes to exactly the batches that came
    next."""
    import json

    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(SIGTERM_SCRIPT.format(path=str(image_shards))))
    out = tmp_path / "state.json"
    env = dict(os.environ, PYTHONPATH=str(Path(fastload.__file__).parent.parent))
    proc = subprocess.Popen([sys.executable, str(script), mode, str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        stdout, err = proc.communicate(timeout=JOIN)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the process hung after SIGTERM")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "terminate called" not in err, err
    if mode == "flag":
        assert "saved" in stdout
        state = json.loads(out.read_text())
        ref = reference(image_shards, epochs=state["epoch"] + 1, **KW, num_workers=2)
        resumed = fastload.DataLoader(open_train(image_shards), **KW, num_workers=2)
        resumed.load_state_dict(state)
        assert same(grab(resumed), ref[state["epoch"]][state["batches_done"]:])
