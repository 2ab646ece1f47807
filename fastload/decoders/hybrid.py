"""``decoder="auto"`` with a GPU: CPU threads and a GPU decoder share every batch.

A GPU machine has both a hardware/GPU JPEG decoder and many CPU cores; a loader that uses only one of
them leaves the other idle. :class:`HybridDecoder` is one decoder (``decode(sources, plan, out)``,
``_base.py``) made of two: :class:`HybridSplit` cuts each batch in two, the first ``k`` samples go to
the native decoder (libjpeg-turbo threads, GIL released) in a helper thread, into pinned host rows that
are then copied into ``out``, the other ``n - k`` to the GPU decoder in the calling thread, at the same time. Both
halves are timed while they run side by side, and ``k`` follows the ratio of the measured rates (smoothed), so both
finish together: the batch takes about ``n / (cpu_rate + gpu_rate)``. Each side keeps at least one sample so its rate
stays measured.

The GPU half is timed on the device: its work is queued and handed on with an event (nothing waits for it
on the host), so the time its call takes in this thread is how fast work is queued, not decoded (a slow GPU
would be handed ever more). Timing events recorded on the GPU decoder's stream before and after its half
(``DeviceTimer``) give the device time; it is read only once the end event has completed (a query, a batch
or a few later, never a synchronize), so the split follows the GPU's rate with that delay. The span runs
from the stream reaching the start event to its end, so where the GPU waits for this thread to queue the
work, that wait counts too: the rate is the lower of queuing and decoding. A GPU decoder without a stream of
its own (complete when its call returns) is timed on the host.

Pixels: the CPU and GPU decoders agree within the tolerances stated in ``dali.py``/``nvjpeg.py``, but
which samples each one decodes depends on timing, so with ``decoder="auto"`` batches are not bit-for-bit
reproducible (labels, order and crops are). Use ``decoder="native"`` where bit-exact batches matter.

Registered as ``'auto'``: :data:`KIND` chooses, per loader, native threads alone (no ``device='cuda'``, or no
usable GPU decoder: said in a warning) or the hybrid with the first usable GPU decoder of the registry.
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import torch

from .._ring import host_empty, pinned_memory_usable, streams_for, warn_once
from ._base import DecoderContext, DecoderKind, DecoderSetupError


class DeviceTimer:
    """Times work queued on ``stream`` (of the ring's streams backend ``streams``) with timing events."""

    def __init__(self, streams: Any, stream: Any):
        self.streams, self.stream = streams, stream

    def start(self) -> Any:
        return self.streams.record(self.stream, timing=True)

    def stop(self, start: Any) -> tuple[Any, Any]:
        return start, self.streams.record(self.stream, timing=True)

    def seconds(self, mark: tuple[Any, Any]) -> float | None:
        """The device time between ``start`` and ``stop``; None while the end has not completed (a query)."""
        start, end = mark
        return self.streams.elapsed(start, end) if self.streams.done(end) else None


class HybridSplit:
    """Where to cut the next batch, from the rates measured so far; runs the two halves concurrently."""

    PENDING = 8  # GPU halves whose device time is awaited at most; later ones go untimed until those complete

    def __init__(self, smoothing: float = 0.3, cpu_share: float = 0.5):
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing={smoothing!r} should be in (0, 1]")
        self.smoothing = smoothing
        self.cpu_share = float(cpu_share)
        self.cpu_rate: float | None = None  # samples/s while both run
        self.gpu_fields: dict[str, bool] = {}  # image field -> whether its hybrid has a GPU half (its set-up worked)
        self.gpu_rate: float | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pending: collections.deque = collections.deque()  # (samples, timer, mark) of GPU halves queued
        self._timing = threading.Lock()

    @property
    def cpu_only(self) -> bool:
        """No image field has a usable GPU decoder (decoder='auto' fell back everywhere): nothing to split."""
        return bool(self.gpu_fields) and not any(self.gpu_fields.values())

    def split(self, n: int) -> int:
        """How many of ``n`` samples the CPU decodes (the first ones)."""
        if n < 2:
            return n
        return min(n - 1, max(1, round(n * self.cpu_share)))

    def _update(self, k: int, t_cpu: float, m: int, t_gpu: float) -> None:
        a = self.smoothing
        if k and t_cpu > 0:
            r = k / t_cpu
            self.cpu_rate = r if self.cpu_rate is None else (1 - a) * self.cpu_rate + a * r
        if m and t_gpu > 0:
            r = m / t_gpu
            self.gpu_rate = r if self.gpu_rate is None else (1 - a) * self.gpu_rate + a * r
        if self.cpu_rate and self.gpu_rate:
            self.cpu_share = self.cpu_rate / (self.cpu_rate + self.gpu_rate)

    def _collect(self) -> None:
        """GPU rates from the halves whose end event has completed, oldest first (``stats`` may ask from
        another thread than the producer's)."""
        with self._timing:
            while self._pending:
                m, timer, mark = self._pending[0]
                seconds = timer.seconds(mark)
                if seconds is None:
                    return
                self._pending.popleft()
                self._update(0, 0.0, m, seconds)

    def run(
        self, n: int, cpu: Callable[[int], list], gpu: Callable[[int], list], timer: DeviceTimer | None = None
    ) -> list[tuple[int, str]]:
        """``cpu(k)`` decodes samples ``[0, k)``, ``gpu(k)`` samples ``[k, n)`` (positions relative to ``k``
        in its failures); both return ``[(position, message)]``. Returns the batch's failures. ``timer``: the
        GPU half's work is queued on its stream and timed there (None: it is complete when ``gpu`` returns)."""
        self._collect()
        k = self.split(n)
        on_device = timer is not None
        if on_device and len(self._pending) >= self.PENDING:
            timer = None  # the device has not finished the halves awaited: this one is not timed (host time is not its)

        def timed_cpu():
            t = time.perf_counter()
            fails = cpu(k)
            return fails, time.perf_counter() - t

        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="fastload-hybrid-cpu")
        future = self._pool.submit(timed_cpu) if k > 0 else None
        t = time.perf_counter()
        mark = timer.start() if timer is not None and k < n else None
        try:
            gpu_fails = gpu(k) if k < n else []
        finally:
            t_gpu = time.perf_counter() - t
            cpu_fails, t_cpu = future.result() if future is not None else ([], 0.0)
        with self._timing:
            if mark is not None:
                self._pending.append((n - k, timer, timer.stop(mark)))
            self._update(k, t_cpu, 0 if on_device else n - k, t_gpu)
        return sorted(list(cpu_fails) + [(k + j, msg) for j, msg in gpu_fails])

    def stats(self) -> dict:
        self._collect()  # halves completed since the latest batch (a query)
        return {"cpu_share": self.cpu_share, "cpu_rate": self.cpu_rate, "gpu_rate": self.gpu_rate}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class HybridDecoder:
    """``cpu`` (the native decoder) and ``gpu`` (a GPU decoder) decoding one batch together, cut by ``split``.

    The CPU share is decoded into host rows owned here (pinned where possible, ``rows`` samples) and copied
    into ``out`` on a side stream of ``streams`` (the ring's backend; made for ``out``'s device when None)
    that waits on the stream ``out`` was allocated on at its first use (``fence``). Nothing waits on the
    host: the copy stream also waits on the GPU decoder's event and records the batch's (``ready_event``),
    and host rows are refilled only once the copy that read them completed (a query; while every one is
    still being read, one more is made). One batch at a time (a lock), as the GPU decoders.
    """

    def __init__(self, cpu: Any, gpu: Any, split: HybridSplit, rows: int, streams: Any = None, field: str = ""):
        self.cpu, self.gpu, self.split, self.rows, self.field = cpu, gpu, split, rows, field
        split.gpu_fields[field] = gpu is not None  # None: this field's every sample to the CPU threads
        self._hosts: list[list] = []  # [pinned host rows, event after the copy that read them]
        self.streams = streams
        self.ready = None
        self._lock = threading.Lock()

    def fence(self, out: torch.Tensor) -> None:
        """``out`` is new: both streams that write it wait for its allocation stream's queued work."""
        if self.gpu is not None:
            self.gpu.fence(out)
        s = self._streams(out)
        s.wait(s.side, s.record(s.consumer()))
        s.record_stream(out, s.side)  # freed (the ring let go of it) only once our copies have run

    def after(self, event: Any) -> None:
        """Both halves' next writes (the GPU decoder's stream, our copy stream) come after ``event``."""
        if self.gpu is not None:
            self.gpu.after(event)
        self.streams.wait(self.streams.side, event)  # the backend skips a None event (never filled)

    def _timer(self) -> DeviceTimer | None:
        """Timing on the GPU decoder's stream (its own ``streams``, or those of the decoder a ``JpegOnly``
        wraps); None for a decoder without one, complete when its call returns."""
        gs = getattr(getattr(self.gpu, "decoder", self.gpu), "streams", None)
        side = getattr(gs, "side", None)
        return DeviceTimer(gs, side) if side is not None and hasattr(gs, "elapsed") else None

    def _streams(self, out: torch.Tensor) -> Any:
        if self.streams is None:
            self.streams = streams_for(out.device).fork("hybrid copy")
        return self.streams

    def decode(self, sources: Any, plan: Any, out: torch.Tensor) -> list[tuple[int, str]]:
        n = len(sources)
        s = self._streams(out)

        def cpu(k: int) -> list:
            entry = self._staging(n, out.shape[1:])
            host = entry[0][:k]
            fails = self.cpu.decode(sources[:k], plan.take(0, k), host.numpy())
            with s.side_context():
                s.copy(out[:k], host)
                entry[1] = s.record(s.side)  # these host rows are refilled only once it completed
            return fails

        with self._lock:
            if self.gpu is None:  # this field's GPU decoder could not be set up: every sample to the CPU threads
                fails = cpu(n)
            else:
                try:
                    fails = self.split.run(
                        n, cpu, lambda k: self.gpu.decode(sources[k:], plan.take(k, n), out[k:]), self._timer()
                    )
                except DecoderSetupError as e:  # set up again inside decode (DALI's rebuild) and failed
                    self._lose_gpu(e)
                    fails = cpu(n)  # the whole batch again, ordered after the GPU half's queued writes
            # one event for the whole batch: after the copy and after the GPU decoder's writes
            ready = getattr(self.gpu, "ready_event", None)  # None: a decoder complete when it returns
            s.wait(s.side, ready() if ready is not None else None)
            self.ready = s.record(s.side)
        return fails

    def _lose_gpu(self, err: Exception) -> None:
        """The GPU decoder failed to set itself up again mid-run: this field decodes with CPU threads from now on
        (one warning), after what the GPU decoder had queued (our copy stream waits for its stream), and the GPU
        decoder is closed (here, in the producer thread)."""
        gpu, self.gpu = self.gpu, None
        gs = getattr(getattr(gpu, "decoder", gpu), "streams", None)
        if getattr(gs, "side", None) is not None:
            self.streams.wait(self.streams.side, gs.record(gs.side))
        self.split.gpu_fields[self.field] = False
        name = type(getattr(gpu, "decoder", gpu)).__name__
        warn_once(
            f"auto-lost-{name}",
            f"fastload: decoder='auto' cannot use its GPU decoder any more "
            f"({name}: {err}); image field {self.field!r} is decoded by CPU threads only",
        )
        gpu.close()

    def ready_event(self) -> Any:
        """The event after the latest ``decode``'s last write (both halves)."""
        return self.ready

    def _staging(self, n: int, row_shape: tuple) -> list:
        """Host rows whose latest copy has completed (a query, never a wait), or new ones."""
        self._hosts = [e for e in self._hosts if e[0].shape[0] >= n and e[0].shape[1:] == row_shape]
        for entry in self._hosts:
            if self.streams.done(entry[1]):
                return entry
        entry = [host_empty((max(n, self.rows),) + tuple(row_shape), torch.uint8, pinned_memory_usable()), None]
        self._hosts.append(entry)
        return entry

    def release_unused(self) -> None:
        """The GPU decoder's (``ImageDecoder.release_unused``)."""
        release = getattr(self.gpu, "release_unused", None)
        if release is not None:
            release()

    def close(self) -> None:
        """Closes the GPU decoder; the CPU decoder and the split belong to the caller."""
        if self.gpu is not None:
            self.gpu.close()
        self._hosts = []


# -- the registry's 'auto' ----------------------------------------------------------------------------


def _installed_gpu_decoder() -> tuple[DecoderKind | None, list[str]]:
    """The first registered GPU decoder 'auto' may pair (``DecoderKind.pairs``) whose package imports and is
    usable. Any failure counts, not only ImportError: a torchvision built for another torch raises RuntimeError
    at import, a DALI below the floor is refused; each one that is installed but unusable is named in a
    warning, so decoder='auto' never silently loses a decoder the user installed."""
    from . import kind, names

    broken = []
    for name in names():
        k = kind(name)
        if not k.pairs:
            continue
        try:
            k.probe()
            return k, broken
        except ModuleNotFoundError:
            continue
        except Exception as e:  # noqa: BLE001  (whatever a broken install raises; named in the warning)
            broken.append(f"{name}: {type(e).__name__}: {e}")
    return None, broken


def _next_gpu_decoder(failed: DecoderKind, first: DecoderKind, why: list[str]) -> DecoderKind | None:
    """The next registered GPU decoder after ``failed`` that 'auto' may pair instead of ``first`` (the one its
    kind was chosen with: it must run whatever ``first`` runs) and whose package is usable; those installed but
    unusable are added to ``why``."""
    from . import kind, names

    order = names()
    for name in order[order.index(failed.name) + 1 :]:
        k = kind(name)
        if not k.pairs or (first.augments and not k.augments) or not set(k.refuses) <= set(first.refuses):
            continue
        try:
            k.probe()
            return k
        except ModuleNotFoundError:
            continue
        except Exception as e:  # noqa: BLE001  (as _installed_gpu_decoder)
            why.append(f"{name!r} ({type(e).__name__}: {e})")
    return None


def _choose(on_gpu: bool) -> DecoderKind:
    from . import kind

    if not on_gpu:
        return kind("native")
    partner, broken = _installed_gpu_decoder()
    if broken:
        instead = (
            "images are decoded by CPU threads only"
            if partner is None
            else f"CPU threads share each batch with {partner.name!r} instead"
        )
        warn_once(
            "auto-broken",
            "fastload: decoder='auto' could not use an installed GPU decoder (" + "; ".join(broken) + f"); {instead}",
        )
    if partner is None:
        if not broken:
            warn_once(
                "auto-decoder",
                "fastload: decoder='auto' found no GPU JPEG decoder (pip install "
                "nvidia-dali-cuda130, or a CUDA torchvision for nvJPEG); images are "
                "decoded by CPU threads only",
            )
        return kind("native")
    split = HybridSplit()
    chosen = [partner]  # the GPU decoder this loader pairs: another one (or None) once its set-up failed

    def make(ctx: DecoderContext) -> HybridDecoder:
        gpu, why = None, []
        while chosen[0] is not None:
            try:
                gpu = chosen[0].make(ctx)
                break
            except Exception as e:  # noqa: BLE001  (any set-up failure: an import, DALI's pipeline, the device)
                # it imported but cannot decode here (a torchvision without nvJPEG, a DALI that cannot build its
                # pipeline): the rows are on the device already, so the next usable GPU decoder or native
                # threads alone decode into them, and this loader does not try the broken one again
                why.append(f"{chosen[0].name!r} ({type(e).__name__}: {e})")
                chosen[0] = _next_gpu_decoder(chosen[0], partner, why)
        if why:
            instead = (
                "images are decoded by CPU threads only"
                if gpu is None
                else f"CPU threads share each batch with {chosen[0].name!r} instead"
            )
            warn_once("auto-unusable", f"fastload: decoder='auto' cannot use {', '.join(why)}; {instead}")
        return HybridDecoder(ctx.native, gpu, split, ctx.batch_size, ctx.fork_stream("hybrid copy"), ctx.field)

    # the native half runs the augmentation fused with decoding, the GPU half as its decoder does
    return DecoderKind("auto", make=make, gpu=True, split=split, augments=partner.augments, refuses=partner.refuses)


def _unchosen(ctx: DecoderContext) -> Any:
    raise RuntimeError("decoder='auto' stands for another decoder: make the kind its choose(on_gpu) returns")


KIND = DecoderKind("auto", make=_unchosen, choose=_choose)
