"""The generic path's main side: dispatch to the worker processes, the iterator, errors and shutdown
(what runs in a worker, and the messages both sides speak, are ``_generic/worker_proc.py``'s).

Any Dataset that is not a ``fastload.Dataset`` runs here when ``num_workers > 0``. Workers run the user's
code through torch's own fetchers (``__getitems__``, ``drop_last``, ``batch_size=None`` and the end of an
IterableDataset behave as in torch), seeded like torch's ``worker_loop`` (``random``, ``torch``, numpy
via ``_generate_state``; ``base_seed`` drawn from the loader's generator after ``iter(sampler)``), with
torch's ``WorkerInfo``. Dispatch mirrors ``_MultiProcessingDataLoaderIter``: round robin, at most
``prefetch_factor * num_workers`` tasks out, in sampler order unless ``in_order=False``. Each worker
collates its batches straight into shared-memory slots; ``_shm`` holds the slots, how a batch is pickled
into one and rebuilt from it, and when a slot goes back to its worker.

Protocol, one duplex pipe per worker, no threads on either side:
  main -> worker  ``(op, arg, frees, drops)``, op TASK ``(idx, indices)`` or RESET (a persistent
                  iterator's next epoch); ``frees`` hand slots back, ``drops`` unmap them; ``None``
                  stops. The worker reads ahead, so a stop or reset skips the tasks still queued.
  worker -> main  ``(RESULT, idx, slot, payload, new_slots, retired)`` [+ an fd per new slot, SCM_RIGHTS],
                  ``(ERROR, idx, ExceptionWrapper)``, ``(STOP, idx)`` (iterable exhausted), ``(ACK, wid)``.

Errors: a Dataset exception is re-raised with the worker's traceback (``ExceptionWrapper``); a dead
worker (SIGKILL, OOM killer, segfault) is seen through its process sentinel while waiting and raised as
a RuntimeError in torch's words (``DataLoader worker (pid N) is killed by signal: Killed.``, which tools
match on), then fastload's detail; running out of file descriptors raises torch's "Too many open files"
advice; ``timeout`` raises torch's message; an IterableDataset yielding more than ``len(loader)`` warns
as torch does. ``break``, ``del``, gc,
the end of a non-persistent epoch and Ctrl-C stop the workers (a stop message; terminate after 5 s like
torch), join them and unmap every slot.

torch's own iterator runs instead for ``num_workers == 0``, ``pin_memory=True``, DataPipes, and
platforms without ``os.memfd_create``.
"""

from __future__ import annotations

import errno
import itertools
import multiprocessing
import os
import time
import warnings
from multiprocessing import connection, reduction

import torch
from torch.utils.data import _utils as _tutils
from torch.utils.data._utils import collate as _collate
from torch.utils.data.dataloader import _BaseDataLoaderIter, _DatasetKind
from torch.utils.data.datapipes.datapipe import IterDataPipe, MapDataPipe

from .._ring import Slot
from .shm import LENT, PENDING, WORKER, MappedSlot, SlotUnpickler, map_slot
from .worker_proc import ACK, ERROR, RESET, RESULT, STOP, TASK, HoldCtrlC, death_message, worker_loop


def fallback_reason(loader) -> str | None:
    """Why ``loader`` runs on torch's own iterator instead of the shared-memory workers (None: it does not)."""
    if loader.num_workers == 0:
        return "num_workers=0 loads in the main process"
    if not hasattr(os, "memfd_create"):
        return "os.memfd_create is not available on this platform"
    if loader.pin_memory:
        return "pin_memory=True"
    if isinstance(loader.dataset, (IterDataPipe, MapDataPipe)):
        return "a DataPipe dataset"
    return None


# -- main side -------------------------------------------------------------------------------------
def fd_limit_error(detail: str = "") -> RuntimeError:
    """torch's advice when descriptors run out, with what applies to fastload's slots (one descriptor each)."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    try:
        now = len(os.listdir("/proc/self/fd"))
    except OSError:
        now = "?"
    return RuntimeError(
        "Too many open files. Communication with the workers is no longer possible. Please increase the limit using "
        f"`ulimit -n` in the shell (this process has {now} descriptors open, soft limit {soft}; each worker has its "
        "own). fastload's workers "
        "hand each shared-memory slot over as a file descriptor, so holding fewer batches at once, or a lower "
        "num_workers or prefetch_factor, also helps; torch.multiprocessing.set_sharing_strategy('file_system') "
        "does not change fastload's slots." + (f" {detail}" if detail else "")
    )


class WorkerIterator(_BaseDataLoaderIter):
    """Iterator over a loader's batches, produced by worker processes into shared-memory slots.

    A ``_BaseDataLoaderIter`` by type, as torch's iterators are (Lightning tells a loader's iterator from
    other iterables that way, e.g. to leave it out when pickling a CombinedLoader); torch's base ``__init__``
    does not run: this class sets up what it uses itself, drawing the base seed at the same point."""

    def __init__(self, loader):
        self._shutdown = True  # until the workers exist, for __del__
        self._workers: list = []
        self._conns: list = []
        self._slots: dict[tuple[int, int], MappedSlot] = {}
        self._lent: list[tuple[MappedSlot, Slot]] = []  # (slot, the lease over this batch's storage)
        self._pid = os.getpid()  # a forked child that inherits this object must leave the workers alone
        loader.check_worker_number_rationality()
        self._dataset_kind = loader._dataset_kind
        self._dataset = loader.dataset
        self._num_yielded = 0
        self._IterableDataset_len_called = loader._IterableDataset_len_called
        self._index_sampler = loader._index_sampler
        self._num_workers = nw = loader.num_workers
        self._prefetch_factor = loader.prefetch_factor
        self._in_order = loader.in_order
        self._timeout = loader.timeout
        self._persistent = loader.persistent_workers
        self._sampler_iter = iter(self._index_sampler)  # as torch does, before the seed is drawn
        self._base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item())
        self._owned = [0] * nw  # slots each worker owns, as far as main knows
        self._frees: list[list[int]] = [[] for _ in range(nw)]
        self._drops: list[list[int]] = [[] for _ in range(nw)]
        self._task_info: dict = {}
        ctx = loader.multiprocessing_context or multiprocessing.get_context()
        fork = ctx.get_start_method() == "fork"
        collate_fn = None if loader.collate_fn is _collate.default_collate else loader.collate_fn
        self._shutdown = False
        try:
            for wid in range(nw):
                ours, theirs = ctx.Pipe(duplex=True)
                close = [c.fileno() for c in self._conns] + [ours.fileno()] if fork else []
                p = ctx.Process(
                    target=worker_loop,
                    daemon=True,
                    name=f"fastload-worker-{wid}",
                    args=(
                        theirs,
                        self._dataset_kind,
                        loader.dataset,
                        loader._auto_collation,
                        collate_fn,
                        loader.drop_last,
                        self._base_seed,
                        loader.worker_init_fn,
                        wid,
                        nw,
                        close,
                    ),
                )
                self._conns.append(ours)
                with HoldCtrlC():  # a started worker is always in _workers, where shutdown finds it
                    try:
                        p.start()
                    finally:
                        theirs.close()
                    self._workers.append(p)
            self._reset(loader, first_iter=True)
        except BaseException:
            self._shutdown_workers()
            raise

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __getstate__(self):
        raise NotImplementedError(f"{type(self).__name__} cannot be pickled")

    # -- epochs ------------------------------------------------------------------------------------
    def _reset(self, loader, first_iter: bool = False) -> None:
        nw = self._num_workers
        self._sampler_iter = iter(self._index_sampler)
        self._num_yielded = 0
        self._IterableDataset_len_called = loader._IterableDataset_len_called
        old = self._task_info
        self._send_idx = self._rcvd_idx = 0
        self._task_info = {}
        self._status = [True] * nw
        self._num_tasks = [0] * nw
        self._cycle = itertools.cycle(range(nw))
        if not first_iter:  # persistent workers: drop what the last epoch left in flight, like torch
            self._scan()
            for info in old.values():
                if len(info) == 2:
                    self._discard(*info)
            for w in range(nw):
                self._send(w, RESET, None)
            acks = nw
            while acks:
                w, msg = self._get()
                if msg[0] == ACK:
                    acks -= 1
                else:
                    self._discard(w, msg)
        self._primed = False  # the first tasks go out with the first next(), see prime()

    def _prime(self) -> None:
        """Send the epoch's first ``prefetch_factor * num_workers`` tasks. At the first ``next()``, not at
        ``iter()``: the loader fixes the epoch (and a sampler its order) no earlier (``Counted``)."""
        self._primed = True
        for _ in range(self._prefetch_factor * self._num_workers):
            self._try_put_index()

    # -- batches -----------------------------------------------------------------------------------
    def __next__(self):
        try:
            if not self._primed and not self._shutdown:
                self._prime()
            self._scan()
            data = self._next_data()
        except KeyboardInterrupt:
            self._shutdown_workers()
            raise
        self._num_yielded += 1
        if (
            self._dataset_kind == _DatasetKind.Iterable
            and self._IterableDataset_len_called is not None
            and self._num_yielded > self._IterableDataset_len_called
        ):
            warnings.warn(  # torch's words, which tools and tests match
                f"Length of IterableDataset {self._dataset} was reported to be {self._IterableDataset_len_called}"
                f"(when accessing len(dataloader)), but {self._num_yielded} samples have been fetched. "
                "For multiprocessing data-loading, this could be caused by not properly configuring the "
                "IterableDataset replica at each worker. Please see "
                "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples.",
                stacklevel=2,
            )
        return data

    def interrupted(self) -> None:
        """Ctrl-C reached the loop inside a wrapper of this iterator (``sampling.Counted``), past ``__next__``'s own
        handler: the workers are reaped now, not once the exception's traceback (whose frames hold the wrapper, and
        so this iterator) is let go -- a loop that catches KeyboardInterrupt would find them still alive."""
        self._shutdown_workers()

    def _next_data(self):
        while True:
            while self._rcvd_idx < self._send_idx:
                info = self._task_info.get(self._rcvd_idx)
                if info:
                    if len(info) == 2 or self._status[info[0]]:
                        break
                    del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
            else:
                if not self._persistent:
                    self._shutdown_workers()
                raise StopIteration
            if len(self._task_info[self._rcvd_idx]) == 2:
                w, msg = self._task_info.pop(self._rcvd_idx)
                self._rcvd_idx += 1
                return self._process(w, msg)
            w, msg = self._get()
            idx = msg[1]
            if msg[0] == STOP:
                self._status[w] = False
                self._try_put_index()
                continue
            if idx != self._rcvd_idx:
                if not self._in_order:
                    del self._task_info[idx]
                    return self._process(w, msg)
                self._task_info[idx] += (msg,)
            else:
                del self._task_info[idx]
                self._rcvd_idx += 1
                return self._process(w, msg)

    def _try_put_index(self) -> None:
        max_tasks = self._prefetch_factor * self._num_workers
        try:
            index = next(self._sampler_iter)
        except StopIteration:
            return
        active = [w for w in range(self._num_workers) if self._status[w]]
        if not active:
            return
        for _ in range(self._num_workers):
            w = next(self._cycle)
            if self._status[w] and (self._in_order or self._num_tasks[w] < max_tasks // len(active)):
                break
        else:  # torch would lose this index here; give it to the least busy worker instead
            w = min(active, key=lambda k: self._num_tasks[k])
        self._send(w, TASK, (self._send_idx, index))
        self._task_info[self._send_idx] = (w,)
        self._num_tasks[w] += 1
        self._send_idx += 1

    def _process(self, w: int, msg: tuple):
        self._num_tasks[w] -= 1
        self._try_put_index()
        if msg[0] == ERROR:
            err = msg[2]
            if issubclass(err.exc_type, OSError) and f"[Errno {errno.EMFILE}]" in err.exc_msg:
                self._shutdown_workers()
                raise fd_limit_error(f"The worker's error: {err.exc_msg.strip()}")
            err.reraise()
        _, _, sid, payload = msg[:4]
        if sid is None:
            return SlotUnpickler(payload, None).load()
        slot = self._slots[(w, sid)]
        view = torch.frombuffer(slot.mm, dtype=torch.uint8)  # this batch's own storage over the slot
        lease = Slot({"batch": view})
        try:
            batch = SlotUnpickler(payload, view.untyped_storage()).load()
        except BaseException:
            self._give_back(slot)
            raise
        slot.state = LENT
        self._lent.append((slot, lease))
        del view
        return batch

    # -- slots -------------------------------------------------------------------------------------
    def _scan(self) -> None:
        """Hand back the slots of batches nobody holds any more (bounded work per call)."""
        keep, held = [], 0
        limit = self._num_workers * (self._prefetch_factor + 2)
        for k, (slot, lease) in enumerate(self._lent):
            if held >= limit:
                keep.extend(self._lent[k:])
                break
            if not lease.held():
                self._give_back(slot)
            else:
                keep.append((slot, lease))
                held += 1
        self._lent = keep

    def _give_back(self, slot: MappedSlot) -> None:
        w, key = slot.wid, (slot.wid, slot.sid)
        if self._slots.get(key) is not slot:
            return
        if self._owned[w] > self._prefetch_factor:
            del self._slots[key]
            self._drops[w].append(slot.sid)
        else:
            slot.state = WORKER
            self._owned[w] += 1
            self._frees[w].append(slot.sid)

    def _discard(self, w: int, msg: tuple) -> None:
        if msg[0] == RESULT and msg[2] is not None:
            self._give_back(self._slots[(w, msg[2])])

    # -- messages ----------------------------------------------------------------------------------
    def _send(self, w: int, op: int, arg) -> None:
        try:
            self._conns[w].send((op, arg, self._frees[w], self._drops[w]))
        except OSError:
            self._fail(w)
        self._frees[w], self._drops[w] = [], []

    def _get(self) -> tuple[int, tuple]:
        """The next message from any worker; raises on timeout or when a worker has died."""
        deadline = time.monotonic() + self._timeout if self._timeout > 0 else None
        who = {c: w for w, c in enumerate(self._conns)}
        who.update({p.sentinel: w for w, p in enumerate(self._workers)})
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds ({self._waiting_on()})")
            ready = connection.wait(list(who), timeout=remaining)
            for r in ready:
                if isinstance(r, connection.Connection):
                    return who[r], self._recv(who[r])
            for r in ready:  # a sentinel, and nothing left to read from that worker
                if not self._conns[who[r]].poll():
                    self._fail(who[r])

    def _waiting_on(self) -> str:
        """Which worker the main process was waiting for, so that a stuck one can be found (py-spy dump)."""
        info = self._task_info.get(self._rcvd_idx)
        owing = [info[0]] if info and len(info) == 1 else range(len(self._workers))
        named = ", ".join(f"fastload worker {w} (pid {self._workers[w].pid})" for w in owing)
        what = f"batch {self._rcvd_idx} from" if info and len(info) == 1 else "any of"
        return f"waiting for {what} {named}; `py-spy dump --pid PID` shows where a worker is stuck"

    def _recv(self, w: int) -> tuple:
        with HoldCtrlC():  # the message is ready (waited for); an interrupt inside would leak its fds
            return self._recv_ready(w)

    def _recv_ready(self, w: int) -> tuple:
        conn = self._conns[w]
        fds: list[int] = []
        try:
            msg = conn.recv()
            for _ in msg[4] if msg[0] == RESULT else ():
                fds.append(reduction.recv_handle(conn))
        except (EOFError, OSError, RuntimeError) as e:
            for fd in fds:
                os.close(fd)
            # a descriptor the kernel could not pass (this process or the worker at its limit) arrives as
            # "received 0 items of ancdata" (see torch's NOTE [ DataLoader on Linux and open files limit ])
            if "ancdata" in str(e) or getattr(e, "errno", None) == errno.EMFILE:
                self._shutdown_workers()
                raise fd_limit_error() from None
            if isinstance(e, RuntimeError):
                raise
            self._fail(w)
        if msg[0] == RESULT:
            try:
                for (sid, cap), fd in zip(msg[4], fds):
                    self._slots[(w, sid)] = map_slot(w, sid, fd, cap)
                    self._owned[w] += 1
            finally:
                for fd in fds:
                    os.close(fd)
            for sid in msg[5]:
                if self._slots.pop((w, sid), None) is not None:
                    self._owned[w] -= 1
            if msg[2] is not None:
                self._slots[(w, msg[2])].state = PENDING
                self._owned[w] -= 1
        return msg

    def _fail(self, w: int):
        p = self._workers[w]
        with HoldCtrlC():  # see _shutdown_workers: an interrupt inside a join can lose the exit status
            p.join(timeout=1.0)
        code = p.exitcode
        self._shutdown_workers()
        raise RuntimeError(death_message(w, p.pid, code))

    # -- shutdown ----------------------------------------------------------------------------------
    def _shutdown_workers(self) -> None:
        """Stop, reap and unmap. A Ctrl-C can cut short only the polite request to stop; the reaping after
        it runs to the end and the interrupt is raised then. Safe to call again."""
        if os.getpid() != self._pid:
            return
        polite = not self._shutdown
        self._shutdown = True
        self._task_info, self._send_idx, self._rcvd_idx = {}, 0, 0  # a later next() ends the iteration
        try:
            if polite:
                self._ask_workers_to_stop()
        finally:
            # Ctrl-C is held back while the workers are reaped: one landing inside multiprocessing's
            # poll(), after waitpid() has reaped a worker and before its exit code is stored, makes that
            # Process look alive for ever (waitpid then fails with ECHILD), so it stays in
            # multiprocessing's children with its sentinel pipes open. Bounded: about a second a worker.
            with HoldCtrlC():
                for p in self._workers:
                    if p.is_alive():
                        p.terminate()
                while self._workers:
                    p = self._workers[0]
                    p.join(timeout=1.0)
                    if p.is_alive():
                        p.kill()
                        p.join()
                    self._workers.pop(0)
                while self._conns:
                    self._conns.pop().close()
                self._slots.clear()  # each mapping goes with its last view; batches still held stay valid
                self._lent.clear()

    def _ask_workers_to_stop(self) -> None:
        """Send each worker the stop message and wait up to MP_STATUS_CHECK_INTERVAL for it to exit,
        draining its pipe meanwhile; what is still alive then is terminated by the caller."""
        for c in self._conns:
            try:
                c.send(None)
            except OSError:
                pass
        live = {p.sentinel for p in self._workers}
        conns = set(self._conns)
        deadline = time.monotonic() + _tutils.MP_STATUS_CHECK_INTERVAL
        while live and (remaining := deadline - time.monotonic()) > 0:
            for r in connection.wait(list(live | conns), timeout=remaining):
                if r in live:
                    live.discard(r)
                    continue
                try:  # drain, so that a worker blocked on a large send can exit
                    msg = r.recv()
                    if msg[0] == RESULT:
                        for _ in msg[4]:
                            os.close(reduction.recv_handle(r))
                except (EOFError, OSError, RuntimeError):  # RuntimeError: an fd the kernel could not pass
                    conns.discard(r)

    def __del__(self):
        if _tutils is None or _tutils.python_exit_status is not False:
            return  # interpreter exit: multiprocessing terminates daemonic workers itself
        try:
            with HoldCtrlC():  # Python swallows an exception raised in __del__: never let one cut this short
                self._shutdown_workers()
        except Exception:
            pass
