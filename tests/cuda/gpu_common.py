"""What the GPU tests share: the tests/ folder on sys.path (for conftest's data builders), which GPU decoders
import, the marks that skip a module cleanly without them, a forced lag on the consumer stream, and batch
comparison on the device (no host sync inside a loop: the counts are read once, at the end).

Import failures of torchvision or DALI of any kind (a torchvision built for another torch raises
RuntimeError at import) count as "not installed" here, so that collection never errors on a GPU machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _imports(module: str) -> bool:
    try:
        __import__(module)
        return True
    except Exception:  # noqa: BLE001  (any failure: the module is unusable here)
        return False


HAVE_TV = _imports("torchvision.io")
HAVE_DALI = _imports("nvidia.dali")
CUDA = torch.cuda.is_available()

NEEDS_CUDA = [pytest.mark.cuda, pytest.mark.skipif(not CUDA, reason="needs a CUDA device")]
NEEDS_CUDA_AND_TORCHVISION = [pytest.mark.cuda, pytest.mark.skipif(not (CUDA and HAVE_TV),
                                                                   reason="needs CUDA and torchvision")]
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
MAD_TOLERANCE = 4.0  # mean absolute difference per sample, GPU decoders vs the DCT-scaled native decode


def decoder_param(name: str):
    """A pytest param for decoder ``name``, skipped where its GPU decoder is missing ('auto' needs one of
    them, or it would compare native with native)."""
    missing = {"nvjpeg": not HAVE_TV, "dali": not HAVE_DALI, "auto": not (HAVE_TV or HAVE_DALI)}.get(name, False)
    return pytest.param(name, marks=pytest.mark.skipif(missing, reason=f"decoder={name!r} needs its GPU decoder"))


_CYCLES_PER_MS: list[float] = []


def cycles_per_ms() -> float:
    """GPU clock cycles per millisecond of ``torch.cuda._sleep`` (measured once)."""
    if not _CYCLES_PER_MS:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)  # warm-up
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        end.synchronize()
        _CYCLES_PER_MS.append(10_000_000 / max(start.elapsed_time(end), 1e-3))
    return _CYCLES_PER_MS[0]


def lag(ms: float) -> None:
    """Queue ``ms`` of GPU work on the current stream: the host runs ahead, as behind a real model."""
    torch.cuda._sleep(int(ms * cycles_per_ms()))


class DeviceCheck:
    """Compares batches with references on the GPU, on the current stream, after whatever was queued
    there (the forced lag): mismatches accumulate in device counters that the host reads once, in
    ``assert_clean``, after synchronising every stream it compared on (so a test never has to order its
    consumer streams with each other for the counters' sake). ``refs``: ``[(images, labels)]`` on the CPU,
    moved to the GPU before the loop.

    ``mode``: ``"exact"``; ``("atol", a)`` the largest absolute difference; ``("mad", m)`` the mean absolute
    difference per sample (GPU decoders against the native decode)."""

    def __init__(self, refs: list, mode="exact"):
        self.refs = [(x.cuda(), y.cuda()) for x, y in refs]
        self.mode = mode
        self.bad_images = torch.zeros((), dtype=torch.int64, device="cuda")
        self.bad_labels = torch.zeros((), dtype=torch.int64, device="cuda")
        torch.cuda.synchronize()  # before the loop: no sync inside it, and every stream sees these written
        self.k = 0
        self.host_errors: list[str] = []
        self.streams: list = []  # the streams it compared on (a test may switch): read after their work

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        stream = torch.cuda.current_stream()
        if stream not in self.streams:  # its memory is used there too: not reused before that work ran
            self.streams.append(stream)
            for t in [self.bad_images, self.bad_labels] + [t for pair in self.refs for t in pair]:
                t.record_stream(stream)
        k, self.k = self.k, self.k + 1
        if k >= len(self.refs):
            self.host_errors.append(f"batch {k}: more batches than the {len(self.refs)} expected")
            return
        rx, ry = self.refs[k]
        if x.shape != rx.shape or y.shape != ry.shape or x.dtype != rx.dtype or not x.is_cuda:
            self.host_errors.append(f"batch {k}: {x.dtype} {tuple(x.shape)} on {x.device}, expected "
                                    f"{rx.dtype} {tuple(rx.shape)}")
            return
        self.bad_labels += (y != ry).any()
        if self.mode == "exact":
            self.bad_images += (x != rx).any()
        elif self.mode[0] == "atol":
            self.bad_images += ((x.float() - rx.float()).abs() > self.mode[1]).any()
        else:
            self.bad_images += ((x.float() - rx.float()).abs().flatten(1).mean(1) > self.mode[1]).any()

    def assert_clean(self, what: str = "") -> None:
        for stream in self.streams:  # after the loop: the counters' last writes, on whichever stream, done
            stream.synchronize()
        bad_x, bad_y = int(self.bad_images), int(self.bad_labels)
        assert not self.host_errors, f"{what}: {self.host_errors[:3]}"
        assert self.k == len(self.refs), f"{what}: {self.k} batches, expected {len(self.refs)}"
        assert bad_x == 0 and bad_y == 0, (f"{what}: {bad_x} batches with wrong pixels, {bad_y} with wrong labels "
                                           f"of {self.k}")


def corrupt_sample(packed: Path, index: int) -> None:
    """Zero the JPEG header of sample ``index`` inside its shard (packing checks files; this gets past it)."""
    import fastload

    ds = fastload.open(packed, decode=False)
    seg, local = ds.locate(index)
    shard = Path(packed) / seg.name
    data = bytearray(shard.read_bytes())
    start = seg.data_start["image"] + int(seg.offsets["image"][local])
    data[start + 2:start + 22] = bytes(20)
    shard.write_bytes(bytes(data))


# -- fresh processes: one per test function, not one per case --------------------------------------------------

_FRESH_DRIVER = """
import json, sys, time, traceback
ns = {"__name__": "fresh_cases"}
exec(compile(sys.argv[1], "<fresh script>", "exec"), ns)
for case_id, kwargs in json.loads(sys.argv[2]):
    print(json.dumps({"start": case_id}), flush=True)
    t = time.perf_counter()
    try:
        rec = {"id": case_id, "ok": True, "out": str(ns["run"](**kwargs))}
    except BaseException:  # noqa: B036  (a case's failure is its result; the next case still runs)
        rec = {"id": case_id, "ok": False, "error": traceback.format_exc()[-3000:]}
    finally:
        if "torch" in sys.modules:  # a case that raised inside the mode must not leave it on for the next
            sys.modules["torch"].cuda.set_sync_debug_mode(0)
    rec["seconds"] = round(time.perf_counter() - t, 2)
    print(json.dumps(rec), flush=True)
"""


def _skipped_at_collection(item) -> bool:
    for mark in item.iter_markers():
        if mark.name == "skip" or (mark.name == "skipif" and mark.args and mark.args[0] is True):
            return True
    return False


class FreshProcess:
    """Runs every selected case of one parametrized test in ONE new Python process (CUDA starts once, not once per
    case), each case from its own first batch: ``script`` defines ``run(**params)``, called once per case with
    the case's parameters (and ``common``, the same for every case), its return value the case's result. The
    first case's test starts the process for all cases of that test that pytest will run (skipped and deselected
    ones aside); every test then reads its own case's line. A case that raises fails alone, with its traceback;
    a process that dies or runs past ``timeout`` fails the case it was in and names it to the cases after it.

    What a separate process per case gave that this does not: a CUDA context, torch's caching allocators and
    imported modules that no earlier case touched. Each case still builds its own loader, ring, slots,
    Normalize constants and decoders under the sync debug mode, which is what these tests are about."""

    def __init__(self, script: str, timeout: float = 240):
        self.script, self.timeout = script, timeout
        self._results: dict[str, dict] | None = None
        self.log: list[str] = []

    def result(self, request, **common) -> str:
        """This case's return value of ``run``; fails the test with the case's traceback or the process's end."""
        if self._results is None:
            self._results = self._run_all(request, common)
        rec = self._results[request.node.callspec.id]
        assert rec["ok"], rec["error"]
        return rec["out"]

    def _run_all(self, request, common: dict) -> dict[str, dict]:
        import json
        import os
        import subprocess

        node = request.node
        cases = [(i.callspec.id, {**common, **i.callspec.params}) for i in request.session.items
                 if getattr(i, "originalname", None) == node.originalname and i.module is node.module
                 and not _skipped_at_collection(i)]
        root = Path(__file__).resolve().parents[2]
        env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        results: dict[str, dict] = {}
        current, why = None, ""
        try:
            r = subprocess.run([sys.executable, "-c", _FRESH_DRIVER, self.script, json.dumps(cases)],
                               capture_output=True, text=True, timeout=self.timeout, env=env)
            stdout, why = r.stdout, f"exit status {r.returncode}: {r.stderr[-2000:]}"
        except subprocess.TimeoutExpired as e:
            out = e.stdout or b""
            stdout = out.decode(errors="replace") if isinstance(out, bytes) else out
            why = f"stopped after {self.timeout:.0f} s"
        for line in stdout.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                self.log.append(line)
                continue
            if "start" in rec:
                current = rec["start"]
            else:
                results[rec["id"]], current = rec, None
        for case_id, _ in cases:
            if case_id not in results:
                error = (f"the process ended while this case ran ({why})" if case_id == current else
                         f"not run: the process ended while case {current!r} ran ({why})")
                results[case_id] = {"id": case_id, "ok": False, "error": error}
        return results
