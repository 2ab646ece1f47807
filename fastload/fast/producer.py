"""The producer stage: the calling thread or a producer thread fills each batch, whichever the
measurements say is faster.

A producer thread overlaps filling the next batches with the caller's step: what ``num_workers > 0``
asks for, and what a training loop needs. But handing a batch over (queue, wake-up, GIL hand-over) has
a cost of its own, and when the caller does almost nothing between batches (a benchmark, an evaluation
loop over tiny records) and a batch costs little to fill, that cost is most of the work: then the
calling thread fills each batch itself. ``FillPolicy`` (one per loader, kept across epochs) holds the
median of the latest fill times and of the caller's times between batches and decides:

  * producer thread  while the fill time is unknown (the start of the first epoch), when filling costs
                     >= ``INLINE_BELOW`` per batch, or when the caller's own time per batch exceeds the
                     fill time (there is work to hide the fill behind);
  * calling thread   when filling is cheap and the caller's time is under half the fill time.

The switch happens mid-epoch in both directions: the producer hands the rest of the batch sequence
back (``_HANDBACK``, after the batches it already queued) or is started on it. Which thread fills a
batch changes neither the batches nor their RNGs nor resume: the sequence is one iterator, consumed
by one thread at a time. ``num_workers`` stays the size of the native pool in both modes.

GPU decoders (``decoder='nvjpeg'/'dali'/'auto'`` with ``device='cuda'``) always fill in a producer thread,
even at ``num_workers=0``: their calls are long host work (nvJPEG's and DALI's host phases, the plan's
uploads) that the training thread should not pay; they hand each batch on with an event, not a host wait.

With ``device='cuda'`` the producer thread is also where the host ring's bound is kept: at its limit a fill
waits for the oldest pending copy there (``fill.py``); a fill in the calling thread grows further first. That
wait gives up when the thread is told to stop, so stopping it (``close``, ``reset``: joins in the training
thread) never waits for the GPU.

State (``stage.py``'s prefetching rule): the producer thread queues each batch with the upstream's state right
after it was filled, and the stage's state is that of the last batch handed on (what the thread has queued ahead
is not part of it); filling in the calling thread, it holds nothing and its state is the upstream's. The thread
starts at the first ``next()`` (so a chain built and then ``reset`` to a saved state fills nothing twice).
"""

from __future__ import annotations

import atexit
import collections
import queue
import threading
import weakref
from typing import Any

from .fill import Stopped, mark_producer
from .stage import Stage, nested, upstream_state

INLINE_BELOW = 1e-3  # seconds per batch fill from which a producer thread always fills
SAMPLES = 3  # measurements needed before the policy changes the mode (a cold first batch does not decide)

_END = object()
_HANDBACK = object()
_CLOSED = object()  # put by ``close`` after the thread stopped: wakes a ``next()`` waiting in another thread


class FillPolicy:
    """Median fill time and caller time per batch (latest 8 each); whether a producer thread should fill."""

    def __init__(self):
        self.fills: collections.deque = collections.deque(maxlen=8)
        self.steps: collections.deque = collections.deque(maxlen=8)

    @staticmethod
    def _median(values) -> float | None:
        values = sorted(values)  # a snapshot (the producer thread appends concurrently); np.median costs
        return values[len(values) // 2] if len(values) >= SAMPLES else None  # more than a tiny batch

    @property
    def fill_cost(self) -> float | None:
        return self._median(self.fills)

    @property
    def step_cost(self) -> float | None:
        return self._median(self.steps)

    def threaded(self, now: bool) -> bool:
        """Whether a producer thread should fill the next batches; ``now`` is the current mode."""
        fill, step = self.fill_cost, self.step_cost
        if fill is None or step is None:
            return now
        if fill >= INLINE_BELOW:
            return True
        return step > fill if not now else step >= 0.5 * fill


class _Producer:
    """State shared by the iterator and its background thread (which must not own the iterator,
    so that dropping the iterator after ``break`` stops the thread)."""

    def __init__(self, depth: int):
        self.thread: threading.Thread | None = None
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.handback = threading.Event()
        self.reserved: set[int] = set()
        self.lock = threading.Lock()
        self.states: collections.deque = collections.deque()  # the upstream's state after each queued batch

    def put(self, item) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False


_LIVE: "weakref.WeakSet[_Producer]" = weakref.WeakSet()  # producers whose thread may still run


@atexit.register
def _stop_producers() -> None:
    """At interpreter exit, before finalization: stop every producer thread and wait for the batch it is
    filling. A daemon thread still inside a native call (GIL released) when Python finalizes is ended by
    pthread_exit as it takes the GIL back, and that forced unwind through the binding's GIL guard aborted the
    whole process ("terminate called without an active exception", exit 134) -- e.g. a script that stops
    mid-epoch, or a DDP rank whose last epoch's iterator was not drained."""
    producers = list(_LIVE)
    for p in producers:
        p.stop.set()
    for p in producers:
        if p.thread is not None and p.thread is not threading.current_thread():
            p.thread.join(timeout=30)


class Produce(Stage):
    """Filled slots from ``source`` (the ``Fill`` stage), made in a producer thread or in the calling thread as
    ``policy`` decides (module docstring). ``threads`` is whether a producer thread may run at all
    (``num_workers > 0``, or GPU decoders: ``always``); ``depth`` the batches it keeps ready; ``timeout``
    torch's. ``ready`` is how many batches the producer had queued when the last one was handed on (the
    stats' queue depth). ``on_close`` runs when the epoch ends or the iteration is dropped (a
    non-persistent loader's ``Batcher.end_epoch``); ``stats.end_epoch`` then too. ``release(slot)`` ends the
    reservation of a filled slot that ``reset`` drops from the queue (``fill.Reservations.release``)."""

    def __init__(
        self,
        source: Any,
        policy: FillPolicy,
        stats: Any,
        *,
        threads: bool,
        always: bool,
        depth: int,
        timeout: float,
        on_close=None,
        release=None,
    ):
        self.source, self.policy, self.stats, self.release = source, policy, stats, release
        self.ready = 0
        self.threads, self.always, self.depth, self.timeout = threads, always, depth, timeout
        self.on_close = on_close
        self.done = 0  # batches handed on
        self.closed = False
        self.thread = None
        self.producer = None
        self.begun = False  # the first next() decides whether a producer thread fills (``_begin``)
        self._snapshot: dict | None = None  # with a producer thread: the upstream state after the last batch handed on

    def _threaded(self, now: bool) -> bool:
        return self.always or self.policy.threaded(now)

    def _begin(self) -> None:
        self.begun = True
        if self.threads and self._threaded(True):
            self._start_producer()

    def _start_producer(self) -> None:
        """Fill the remaining batches in a background thread (the batch sequence and RNGs are unchanged)."""
        self._snapshot = upstream_state(self.source)  # nothing pulled since the last batch handed on
        self.producer = _Producer(self.depth)
        self.thread = threading.Thread(
            target=_produce, name="fastload-batcher", daemon=True, args=(self.producer, self.source, self.release)
        )
        self.producer.thread = self.thread
        _LIVE.add(self.producer)
        self.thread.start()

    def _take_back(self) -> None:
        """The producer has stopped pulling from the batch sequence: fill in this thread from now on."""
        self.thread.join()
        self.thread = None
        self.producer = None

    def __next__(self):
        if self.closed:  # ran out, failed, or closed: its thread is gone and nothing more comes (no wait)
            raise StopIteration
        if not self.begun:
            self._begin()
        return self._next_threaded() if self.producer is not None else self._next_inline()

    def _next_threaded(self):
        p = self.producer
        try:
            item = p.queue.get(timeout=self.timeout if self.timeout > 0 else None)
        except queue.Empty:
            self.close()
            raise RuntimeError(f"DataLoader timed out after {self.timeout} seconds") from None
        if item is _END or item is _CLOSED:
            self.close()
            raise StopIteration
        if item is _HANDBACK:
            self._take_back()
            return self._next_inline()
        if isinstance(item, BaseException):
            self.close()
            raise item
        self._snapshot = p.states.popleft()  # appended before the batch was queued
        self.ready = p.queue.qsize()
        self.done += 1
        if not p.handback.is_set() and not self._threaded(True):
            p.handback.set()  # cheap batches, a caller that waits on them: the hand-off costs more than it hides
        return item

    def _next_inline(self):
        try:
            item = next(self.source)
        except StopIteration:
            self.close()
            raise
        self.ready = 0
        self.done += 1
        if self.threads and self._threaded(False):
            self._start_producer()  # batches got expensive, or the caller has work to hide them behind
        return item

    def _stop_producer(self) -> list:
        """Stop the producer thread, wait for it, and return what it had queued."""
        p, self.producer = self.producer, None
        p.stop.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join()
        self.thread = None
        items = []
        while True:
            try:
                items.append(p.queue.get_nowait())
            except queue.Empty:
                return items

    def state(self) -> dict:
        return nested(self._snapshot) if self.producer is not None else super().state()

    def reset(self, state: dict | None = None) -> None:
        """Start over from ``state`` (the upstream's, nested under ``"source"``): a running producer thread is
        stopped first and the batches it had queued are dropped, their slots' reservations ended; the next
        ``next()`` starts filling again."""
        if self.producer is not None:
            for item in self._stop_producer():
                if isinstance(item, tuple) and self.release is not None:
                    self.release(item[0])
        super().reset(state)
        self.done, self.ready, self.begun, self._snapshot = 0, 0, False, None

    def close(self) -> None:
        """Stop the producer thread and wait for the batch it is filling; end the epoch (once). A producer waiting
        for the GPU at the host ring's bound gives up at once (``fill.Stopped``): the join waits for host work
        only, never for the device."""
        if self.producer is not None:
            self.producer.stop.set()
            if self.thread is not None and self.thread is not threading.current_thread():
                self.thread.join()
            self.thread = None
            try:  # a next() of another thread waiting for the stopped thread's next batch ends (StopIteration)
                self.producer.queue.put_nowait(_CLOSED)
            except queue.Full:  # then nobody waits: the next get() takes a batch at once
                pass
        if not self.closed:
            self.closed = True
            self.stats.end_epoch()
            if self.on_close is not None:
                self.on_close()

    def __del__(self):  # dropped without close (e.g. Ctrl-C before the iterator holding it was made)
        try:
            self.close()
        except Exception:
            pass


def _produce(p: _Producer, source, release=None) -> None:
    # a fill here may wait for the GPU's pending copies (fill.py), the training thread never does; it gives up
    # when ``stop`` is set, so that joining this thread never makes the training thread wait for the GPU
    mark_producer(p.stop)
    try:
        while not p.stop.is_set():
            if p.handback.is_set():
                p.put(_HANDBACK)  # after every batch already queued; this thread no longer touches `source`
                return
            try:
                item = next(source)
            except StopIteration:
                p.put(_END)
                return
            p.states.append(upstream_state(source))  # before the batch: whoever takes the batch finds its state
            if not p.put(item):  # stopped: the batch it filled goes nowhere, its slot is free again
                if release is not None:
                    release(item[0])
                return
    except Stopped:  # told to stop while waiting for a pending copy: no slot taken, nothing to hand on
        return
    except BaseException as e:  # handed to the consumer, re-raised there
        p.put(e)
