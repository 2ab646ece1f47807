"""Image fields of a batch: which decoder runs the plans, and the call that fills the slot's rows.

Every decoder is one interface (``decoders/_base.py``): ``decode(sources, plan, out)`` executes the
batch's plan (``transforms.ImagePipeline.plan``: a crop box and a flip per sample, from the batch's RNG) into
uint8 NHWC rows and reports failures per sample as ``(k, message)``. The decoder is picked by name from the
registry (``decoders/__init__.py``: native, dali, nvjpeg, auto); ``ImageDecoding.fill`` plans the batch,
gathers its encoded images as ``ImageSources`` (one reader call, plain data) and makes that one call.

GPU-side decoders write into a device buffer of the slot; the hybrid's CPU share is decoded into pinned
host rows of its own and copied into the same device buffer on a side stream. None of it makes the
producer thread wait for the GPU: ``fill`` returns with the work queued, and the event recorded after the
rows' last write (the decoder's, or the ``on_error`` fix-up's) is the batch's hand-over
(``ready_event(rows)``): whoever reads the rows (the device prefetcher's side stream) waits on it on the
device. A decoder's stream waits on the rows' allocation stream only at its first use of a buffer (``fence``):
a buffer whose batch was copied is written again only after that copy completed (the slot protocol). But a
batch filled and never read (an abandoned epoch, a reset, a DecodeError) frees its slot at once, its writes on
other streams (the hybrid's copy, the ``on_error`` fix-up) maybe still queued: so at every later fill the
decoder's streams wait on the buffer's latest hand-over event (``after``), a device-side wait that costs
nothing once the event completed, never one on the training stream.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from typing import Any

import torch

from .. import _ring, decoders
from .._augment.fallback_workers import FallbackRunner
from .._errors import where
from .._ring import warn_once
from .._schema import Field
from ..decoders._base import DecoderContext, ImageSources, host_rows_refusal
from ..decoders._staging import Uploads
from ..decoders.native import NativeDecoder


class ImageDecoding:
    """Runs one loader's image plans with the decoder it asked for (see the module docstring)."""

    def __init__(
        self,
        decoder: str,
        device: torch.device | None,
        batch_size: int,
        num_threads: int,
        augmented: tuple[str, ...] = (),
    ):
        """``augmented``: what the image pipelines plan beyond crop, resize and horizontal flip (their
        augmentations, padded crops), by name; only a decoder whose kind ``augments`` can run them."""
        kind = requested = decoders.kind(decoder)
        on_gpu = device is not None and device.type == "cuda"
        if kind.needs_gpu and not on_gpu:
            raise ValueError(f"decoder={decoder!r} decodes on the GPU: pass device='cuda' (or use decoder='native')")
        if kind.choose is not None:
            kind = kind.choose(on_gpu)  # 'auto': native threads alone, or with a GPU decoder (hybrid)
        why = kind.refusal(augmented)  # None: it runs the whole pipeline
        if why is None and kind.gpu and on_gpu:  # its rows on the device: not the per-sample transforms' host rows
            why = host_rows_refusal(augmented)
        if why is not None:
            if requested.choose is None:  # asked for by name: refuse it now, not at the first batch
                raise ValueError(f"decoder={decoder!r} {why}: use decoder='native' (or 'auto')")
            who = f" (not {kind.name!r}): {kind.name!r}" if kind.name != decoder else ": its GPU decoder"  # the hybrid
            warn_once(
                f"auto-augment-{kind.name}",
                f"fastload: decoder={decoder!r} decodes with native threads only{who} {why}",
            )
            kind = decoders.kind("native")
        self.decoder = decoder
        self.kind = kind
        self.hybrid = kind.split  # the hybrid's split (shared by the fields), else None
        # GPU decoders write straight into device buffers; DALI's CPU-only mode into the host slot
        self.device = device if kind.gpu and on_gpu else None
        self.batch_size = batch_size
        self.num_threads = num_threads
        self.native = NativeDecoder()
        self._streams = None
        self._uploads = None  # pinned staging of the fix-ups' row indices (decoders/_staging.py)
        self._ready: dict[int, Any] = {}  # device rows (data_ptr) -> the event after their latest write
        self._made = 0  # decoders made so far: each one fences a row buffer at its own first use of it
        self._fence_key: dict[str, tuple[str, int]] = {}  # field -> the key its decoder adds to Slot.fenced
        self._decoders: dict[str, Any] = {}  # per image field, made on its first batch (GPU ones need its size)
        self._reapers: list[threading.Thread] = []  # threads releasing the decoders' unused memory (end_epoch)
        self._fallbacks: dict[str, FallbackRunner] = {}  # per image field with transforms fastload does not know
        #: run those in worker processes (num_workers of them); False: in the calling thread, as ds.__getitems__
        #: does (torch's DataLoader: its own worker processes are the parallelism, and its num_workers=0 is asked for)
        self.fallback_processes = True
        #: the loader's ``timeout=`` (seconds, 0: none), for those workers' answers: its producer thread waits for
        #: them, and the loader joins that thread before it raises its own timeout error
        self.fallback_timeout = 0.0

    def bind_device(self) -> None:
        """Called at each iteration's start in the training thread: ``'cuda'`` becomes the device current
        there (a loader built before ``torch.cuda.set_device(local_rank)`` decodes on the rank's GPU; the
        producer thread's current device is not the training thread's)."""
        if self.device is not None and self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())

    @property
    def streams(self):
        """The streams backend of the device rows (``_ring.streams_for``), whose side stream is the rows'
        own: they are allocated and fixed up there, not on the training loop's stream, so a decoder never
        waits for the loop's queued work. Each GPU decoder forks a stream of its own from it."""
        if self._streams is None:
            self._streams = _ring.streams_for(self.device).fork("rows")
        return self._streams

    def buffers(self, name: str, shape: tuple, host_empty) -> dict[str, torch.Tensor]:
        """The slot buffers an image field needs: host rows, or device rows for the GPU decoders (allocated
        on the rows' stream; the decoder fences them on their first use)."""
        if self.device is None:
            return {name: host_empty(shape, torch.uint8)}
        with self.streams.side_context():
            return {name: self.streams.empty(shape, torch.uint8, False)}

    def move_rows(self, rows: torch.Tensor, dst: list[int], src: list[int]) -> None:
        """``rows[dst] = rows[src]`` on device rows (``on_error='skip'`` fix-ups), on a stream of our own after
        the decoder's writes (its ready event), handed on with an event as the decoder's: on the producer
        thread's default stream it was unordered with the prefetcher's copy unless the training loop also
        ran on that stream, and a synchronize here paced the producer by the GPU."""
        s = self.streams
        if self._uploads is None:
            self._uploads = Uploads(s)
        key = rows.data_ptr()
        with s.side_context():
            s.wait(s.side, self._ready.get(key))
            dst_t, src_t = self._uploads.put(dst, src)  # pinned: a pageable copy would wait for the stream
            s.launch(
                lambda: rows.index_copy_(0, dst_t, rows.index_select(0, src_t)),
                reads=(rows, dst_t, src_t),
                writes=(rows,),
                what="on_error fix-up",
            )
            self._ready[key] = s.record(s.side)

    def ready_event(self, rows: torch.Tensor) -> Any:
        """The event after the latest write of device rows ``rows`` (a slot's buffer): readers wait on it on
        the device before reading (None: host rows, complete)."""
        return self._ready.get(rows.data_ptr()) if self.device is not None else None

    def end_epoch(self) -> None:
        """A non-persistent loader's epoch is over (called in the training thread, its producer thread stopped):
        what stands for torch's worker processes goes, as torch's would, made again when needed: the per-sample
        transforms' worker processes. The decoders stay for the next epoch: making them again cost every epoch's
        first ``next()`` DALI's pipeline build (nvJPEG handles, the hardware decoder's set-up) in the training
        thread's wait for the first batch, and took 2-3 streams of torch's pool of 32 an epoch, which then alias
        (``_ring.draw_stream``). What they hold between epochs and can do without goes instead: the memory their
        libraries cache and do not use (DALI's pools' high water), released by ``release_unused`` in a
        short-lived thread of its own (``_trim_decoders``: it may synchronise the device), never in the training
        thread. ``close`` (the loader's ``Batcher.close``) closes the decoders."""
        for runner in self._fallbacks.values():
            runner.close()
        self._trim_decoders()

    def _trim_decoders(self) -> None:
        """Each decoder's ``release_unused`` (those that have one), in a daemon thread (one per epoch end, gone once
        done); the decoders stay."""
        trims = [d.release_unused for d in self._decoders.values() if hasattr(d, "release_unused")]
        self._reapers = [t for t in self._reapers if t.is_alive()]
        if trims:
            t = threading.Thread(target=_call_all, args=(trims,), name="fastload-decoder-trim", daemon=True)
            _REAPERS.add(t)
            t.start()
            self._reapers.append(t)

    def close(self) -> None:
        """The decoders (GPU ones with their device memory), the hybrid's thread and the per-sample workers; waits
        first for the memory releases an epoch's end handed to a thread of their own (``end_epoch``)."""
        for t in self._reapers:
            t.join()
        self._reapers = []
        _close_all(list(self._decoders.values()))
        self._decoders = {}
        for runner in self._fallbacks.values():
            runner.close()
        if self.hybrid is not None:
            self.hybrid.close()

    # -- filling -------------------------------------------------------------------------------------
    def fill(self, pool, pipeline, f: Field, slot, reader, at, rng, plans: dict | None = None) -> list[tuple[int, str]]:
        """Decode the batch's images of field ``f`` (``at``: the batch located by ``reader``, a
        ``formats.reader.PackedReader``) into ``slot``. Returns the failures ``[(position, message)]``.
        ``plans``: gets the batch's plan under ``f.name`` (the field's masks follow it)."""
        sources = ImageSources(*reader.image_sources(at, f.name))  # one reader call; the decoders read only this
        plan = pipeline.plan(sources.meta[:, 0], sources.meta[:, 1], rng)
        if plans is not None:
            plans[f.name] = plan
        rows = (slot.arrays if self.device is None else slot.tensors)[f.name][: sources.n]
        self.native.pool = pool  # the batcher's, which autotuning and persistent workers swap
        dec = self._decoders.get(f.name)
        if dec is None:
            self._made += 1  # a new decoder (after ``close``, the old ones' work may still be queued): a new stream
            dec = self._decoders[f.name] = self._decoder((int(rows.shape[1]), int(rows.shape[2])), f.name)
            self._fence_key[f.name] = (f.name, self._made)
        if self.device is None:
            failures = dec.decode(sources, plan, rows)
            if pipeline.fallback:
                self._fallback(f, pipeline, rows, plan, reader, at, failures)
            if pipeline.on_floats:
                self._after(f, pipeline, slot, rows, plan, reader, at, failures)
            return failures
        buf = slot.tensors[f.name]
        key = self._fence_key.get(f.name, (f.name, 0))
        latest = self._ready.get(buf.data_ptr())  # the buffer's previous batch's hand-over (None: never filled)
        if key not in slot.fenced:  # this decoder's first use of the buffer
            s = self.streams
            with s.side_context():
                # after an earlier decoder's writes still queued (an epoch left with batches decoded ahead),
                # and after the allocation stream's work on the buffer (fence: rule 3 of _ring.py)
                s.wait(s.side, latest)
                dec.fence(buf)
            slot.fenced.add(key)
        else:
            # every later fill: the previous batch may never have been read (an abandoned epoch, a reset, a
            # DecodeError), so its slot came back at once with its writes on other streams (the hybrid's copy,
            # the on_error fix-up) still queued; the decoder's streams wait on its hand-over on the device
            # (complete, and free, once a prefetcher's copy read it). Never the training stream.
            dec.after(latest)
        failures = dec.decode(sources, plan, rows)
        ready = getattr(dec, "ready_event", None)  # handed on with the decoder's event, never a host wait
        self._ready[buf.data_ptr()] = ready() if ready is not None else None
        return failures

    def start_fallbacks(self, pool: Any, pipelines: dict) -> None:
        """Start the worker processes of the image fields' per-sample transforms (``pipelines``: image field ->
        its pipeline) now, in the calling thread, as many as ``pool``'s threads: called where an iteration is
        made, before its producer thread runs (``_augment/fallback_workers.py``: no fork while threads run)."""
        if self.device is not None or not self.fallback_processes:
            return
        n = int(getattr(pool, "size", 0) or 0)
        for name, pipeline in pipelines.items():
            if pipeline.output_size is None:
                continue
            h, w = pipeline.output_size
            if pipeline.fallback:
                self._fallback_runner(name, pipeline).start(n, (h, w, 3))
            if pipeline.after:
                self._fallback_runner(name, pipeline, after=True).start(n, (h, w, 3 * pipeline.tensor.dtype.itemsize))

    def _fallback_runner(self, name: str, pipeline: Any, after: bool = False) -> FallbackRunner:
        key = f"{name}:after" if after else name
        runner = self._fallbacks.get(key)
        if runner is None:
            runner = self._fallbacks[key] = FallbackRunner(
                name,
                pipeline.after if after else pipeline.fallback,
                self.batch_size,
                "after ToDtype/Normalize, on the float image (which the batch then carries: 4x the bytes of uint8 "
                "to copy to a device)"
                if after
                else "after the native decode",
            )
        return runner

    def _fallback(
        self, f: Field, pipeline: Any, rows: Any, plan: Any, reader: Any, at: Any, failures: list, after: bool = False
    ) -> None:
        """The transforms fastload does not know (``pipeline.fallback``, or with ``after`` ``pipeline.after``
        on the float rows), per sample on the decoded rows."""
        runner = self._fallback_runner(f.name, pipeline, after)
        bad = {k for k, _ in failures}

        def where_k(k: int) -> str:
            seg = int(at.seg_ids[k])
            return where(reader.path, reader.shard(seg), int(reader.starts[seg] + at.local[k]), f.name)

        runner.run(
            rows,
            [k for k in range(len(rows)) if k not in bad],
            plan.after_seeds if after else plan.seeds,
            where_k,
            self.native.pool if self.fallback_processes else None,
            self.fallback_timeout,
        )

    def _after(
        self, f: Field, pipeline: Any, slot: Any, rows: Any, plan: Any, reader: Any, at: Any, failures: list
    ) -> None:
        """ToDtype/Normalize on the CPU into the slot's float rows, then the erasings with noise there
        (``pipeline.erase``, one torch fill per box, here) and the callables after them per sample (``pipeline.after``),
        through the workers as the rows' bytes (numpy has no bfloat16)."""
        n = len(rows)
        floats = slot.tensors[f"{f.name}:after"][:n]
        pipeline.tensor.apply(torch.from_numpy(rows).permute(0, 3, 1, 2), floats.permute(0, 3, 1, 2))
        if pipeline.erase:
            pipeline.run_erase(floats, plan)
        if not pipeline.after:
            return
        self._fallback(f, pipeline, floats.view(torch.uint8).numpy(), plan, reader, at, failures, after=True)

    def split_stats(self) -> dict | None:
        """The hybrid split's share and measured rates (``HybridSplit.stats``), or None without one: also where
        'auto' found its GPU decoder unusable when making it (every sample to the CPU threads, said in a warning)."""
        return None if self.hybrid is None or self.hybrid.cpu_only else self.hybrid.stats()

    def _decoder(self, out_hw: tuple[int, int], field: str = "") -> Any:
        """The decoder of image field ``field`` whose rows are ``out_hw`` (the registered kind's ``make``)."""
        return self.kind.make(
            DecoderContext(
                self.decoder,
                self.batch_size,
                out_hw,
                self.device,
                self.num_threads,
                self.native,
                lambda name: self.streams.fork(name),
                field,
            )
        )


_REAPERS: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()  # threads releasing decoders' memory (end_epoch)


@atexit.register
def _join_reapers() -> None:
    """At interpreter exit, wait for the threads still releasing decoders' memory: a daemon thread inside a native
    call (DALI's, GIL released) when Python finalizes is ended by pthread_exit as it takes the GIL back, which can abort
    the process (as fast/producer.py's ``_stop_producers`` says of the producer threads)."""
    for t in list(_REAPERS):
        if t is not threading.current_thread():
            t.join(timeout=30)


def _call_all(calls: list) -> None:
    """Each call; one that fails is named in a warning (in a thread of its own an exception would only reach
    threading.excepthook), the others still run."""
    for call in calls:
        try:
            call()
        except Exception as e:  # noqa: BLE001  (releasing cached memory must not fail the loader)
            warn_once(
                f"decoder-trim-{getattr(call, '__qualname__', call)}",
                f"fastload: releasing a decoder's unused "
                f"memory at an epoch's end failed ({type(e).__name__}: {e}); it is kept",
            )


def _close_all(decs: list) -> None:
    """Close each decoder (``ImageDecoding.close``); one that fails to is named in a warning, the others are still
    closed."""
    for dec in decs:
        try:
            dec.close()
        except Exception as e:  # noqa: BLE001  (a teardown failure must not leave the other decoders open)
            warn_once(
                f"decoder-close-{type(dec).__name__}",
                f"fastload: closing the {type(dec).__name__} of an "
                f"image field failed ({type(e).__name__}: {e}); its resources go when it is collected",
            )
