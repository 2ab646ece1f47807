"""``fastload.doctor``: run a few steps of a training loop, measure what slows it, say where and how to fix it.

Two ways in: ``doctor(loop_fn, steps=N)`` calls ``loop_fn()`` (your training loop, or ``fastload doctor
script.py`` running a script) and stops it after ``N`` batches; ``doctor(loader, model=m, steps=N)``
drives the loop itself (a forward pass, and a backward pass when the model has trainable parameters).
While it runs, every DataLoader iteration (torch's or fastload's) is timed from the loop's side, and a
few torch entry points are watched (anomaly mode, profilers, ``zero_grad``, ``DataParallel``).

Findings, each with the measured numbers, the line or setting, and the fix:

* ``input-bound`` -- the loop waited for data more than 10% of its time (the first batch, the warm-up,
  is left out); its fix reads the loader waited on (``_input_fix``): packing and fastload.DataLoader only for a
  loop that does not use them, a ``num_workers`` only where the measured counts show one faster;
  ``fast-path`` -- a fastload.Dataset on the generic path, with the reason;
* ``num_workers`` -- for a fastload loader on the fast path, ``num_workers`` gives under 70% of the
  samples/s of the best count measured on this machine (``_autotune.measure``);
* ``anomaly`` -- autograd anomaly detection on; ``profiler`` -- a torch profiler running;
* ``zero-grad`` -- ``zero_grad(set_to_none=False)`` (writes zeros into every gradient every step);
* ``data-parallel`` -- ``nn.DataParallel`` instead of DistributedDataParallel;
* on CUDA only (listed as skipped elsewhere): ``sync`` -- host-device synchronisations per step
  (``torch.cuda.set_sync_debug_mode``); ``cudnn-shapes`` -- batch shapes changing under
  ``cudnn.benchmark``; ``cudnn-benchmark`` -- benchmark off with fixed shapes; ``autocast`` -- fp32
  matmuls/convolutions on a tensor-core GPU without autocast.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

INPUT_BOUND = 0.10
WORKERS_SHORTFALL = 0.70
WORKERS_HELP = 1.15  # the input-bound fix says "num_workers=N" only when N measured this much faster than the loader's
_HERE = os.path.dirname(os.path.abspath(__file__))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))


class _Stop(BaseException):
    """Ends the user's loop after the requested steps (a BaseException: ``except Exception`` lets it pass)."""


@dataclass
class Finding:
    code: str
    title: str
    measured: str
    where: str
    fix: str

    def __str__(self) -> str:
        return (
            f"[{self.code}] {self.title}\n    measured: {self.measured}\n    where:    {self.where}\n"
            f"    fix:      {self.fix}"
        )


@dataclass
class Report:
    steps: int
    wait_s: float
    step_s: float
    findings: list[Finding] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: how many DataLoaders (torch's or fastload's) the loop iterated; 0: nothing about input was measured
    loaders: int = 1

    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def __str__(self) -> str:
        if not self.loaders:
            return (
                "fastload doctor: saw no DataLoader: the loop never iterated a torch or fastload DataLoader, so "
                "nothing about its input was measured (does the script build its loader and loop over it when "
                "run as __main__, with these arguments?)" + "".join(f"\n  {n}" for n in self.notes)
            )
        loop = self.wait_s + self.step_s
        share = self.wait_s / loop if loop > 0 else 0.0
        lines = [
            f"fastload doctor: {self.steps} steps measured; waiting for data {self.wait_s:.3f} s, in the step "
            f"{self.step_s:.3f} s ({share:.0%} of the loop waiting)"
        ]
        lines += [f"  {n}" for n in self.notes]
        if self.findings:
            lines.append(f"{len(self.findings)} finding(s):")
            lines += [str(f) for f in self.findings]
        else:
            lines.append("no findings: nothing measured here slows the loop")
        if self.skipped:
            lines.append("skipped: " + "; ".join(f"{c} ({why})" for c, why in self.skipped))
        return "\n".join(lines)


def _user_frame(skip: int = 2) -> str:
    """``file:line`` of the nearest caller outside fastload, torch and this module."""
    f = sys._getframe(skip)
    while f is not None:
        path = os.path.abspath(f.f_code.co_filename)
        if not path.startswith((_HERE, _TORCH)) and "importlib" not in path and "runpy" not in path:
            return f"{f.f_code.co_filename}:{f.f_lineno}"
        f = f.f_back
    return "(unknown)"


class _Watched:
    """An iterator that times ``next`` (the loop waiting for data) and the time between (the step)."""

    def __init__(self, session: "_Session", it, loader, where: str):
        self.session, self.it, self.loader, self.where = session, it, loader, where
        self.last: float | None = None

    def __iter__(self):
        return self

    def __len__(self):
        return len(self.it)

    def __next__(self):
        s = self.session
        if s.steps >= s.max_steps:
            raise _Stop
        t0 = time.perf_counter()
        if self.last is not None:
            s.step_s += t0 - self.last
            s.on_step_end()
        batch = next(self.it)
        t1 = time.perf_counter()
        if s.seen_batches:  # the first batch of the run is start-up, not steady-state waiting
            s.wait_s += t1 - t0
            s.wait_by[self.where] = s.wait_by.get(self.where, 0.0) + (t1 - t0)
        s.seen_batches += 1
        s.steps += 1
        s.record_batch(batch)
        self.last = time.perf_counter()
        return batch


class _Session:
    """Hooks installed while the loop runs; every one is removed on exit."""

    def __init__(self, max_steps: int):
        self.max_steps = max_steps
        self.steps = self.seen_batches = 0
        self.wait_s = self.step_s = 0.0
        self.wait_by: dict[str, float] = {}
        self.loaders: dict[int, tuple[Any, str]] = {}
        self.anomaly_at: str | None = None
        self.anomaly_steps = self.profiler_steps = 0
        self.profiler_at: str | None = None
        self.zero_grad: dict[str, list[float]] = {}
        self.data_parallel: dict[str, int] = {}
        self.shapes: list[tuple] = []
        self.autocast_off_steps = 0
        self.fp32_forward = 0
        self.sync_warnings = 0
        self._undo: list[Callable[[], None]] = []
        self.cuda = torch.cuda.is_available()

    # -- installation ------------------------------------------------------------------------------
    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = owner.__dict__[name]
        setattr(owner, name, make(original))
        self._undo.append(lambda: setattr(owner, name, original))

    def __enter__(self) -> "_Session":
        from .._front import loader as _loader

        session = self
        # torch's own class from fastload's bases, not the module attribute: code that swapped
        # torch.utils.data.DataLoader for fastload's would have this patch the same class twice
        torch_loader = next(c for c in _loader.DataLoader.__mro__[1:] if c.__name__ == "DataLoader")
        for cls in (torch_loader, _loader.DataLoader):

            def make_iter(orig):
                @functools.wraps(orig)
                def __iter__(loader):
                    where = _user_frame()
                    session.loaders[id(loader)] = (loader, where)
                    return _Watched(session, orig(loader), loader, where)

                return __iter__

            self._patch(cls, "__iter__", make_iter)

        def make_anomaly(orig):
            @functools.wraps(orig)
            def __init__(obj, mode, *a, **k):
                if mode:
                    session.anomaly_at = _user_frame()
                return orig(obj, mode, *a, **k)

            return __init__

        self._patch(torch.autograd.set_detect_anomaly, "__init__", make_anomaly)

        def make_profile(orig):
            @functools.wraps(orig)
            def __enter__(obj):
                session.profiler_at = _user_frame()
                return orig(obj)

            return __enter__

        self._patch(torch.profiler.profile, "__enter__", make_profile)
        self._patch(torch.autograd.profiler.profile, "__enter__", make_profile)

        def make_zero_grad(orig):
            @functools.wraps(orig)
            def zero_grad(obj, set_to_none: bool = True):
                t = time.perf_counter()
                out = orig(obj, set_to_none)
                if not set_to_none:
                    session.zero_grad.setdefault(_user_frame(), []).append(time.perf_counter() - t)
                return out

            return zero_grad

        self._patch(torch.optim.Optimizer, "zero_grad", make_zero_grad)
        self._patch(torch.nn.Module, "zero_grad", make_zero_grad)

        def pre_hook(module, args):
            if isinstance(module, torch.nn.DataParallel):
                key = f"{type(module.module).__name__} wrapped in nn.DataParallel, called at {_user_frame()}"
                session.data_parallel[key] = session.data_parallel.get(key, 0) + 1
            if session.cuda and any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
                if not torch.is_autocast_enabled("cuda"):
                    session.autocast_off_steps += 1
                if any(p.dtype == torch.float32 for p in module.parameters(recurse=False)):
                    session.fp32_forward += 1

        handle = torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
        self._undo.append(handle.remove)
        if self.cuda:
            previous = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("warn")
            self._undo.append(lambda: torch.cuda.set_sync_debug_mode(previous))
            self._warnings = warnings.catch_warnings(record=True)
            self._recorded = self._warnings.__enter__()
            warnings.simplefilter("always")
            self._undo.append(lambda: self._warnings.__exit__(None, None, None))
        return self

    def __exit__(self, *exc) -> bool:
        while self._undo:
            self._undo.pop()()
        if self.cuda:
            self.sync_warnings = sum("synchronizing operation" in str(w.message) for w in self._recorded)
        return exc[0] is _Stop

    # -- per step --------------------------------------------------------------------------------
    def on_step_end(self) -> None:
        if torch.is_anomaly_enabled():
            self.anomaly_steps += 1
        if torch._C._autograd._profiler_enabled():
            self.profiler_steps += 1

    def record_batch(self, batch: Any) -> None:
        first = _first_tensor(batch)
        if first is not None:
            self.shapes.append(tuple(first.shape))


def _first_tensor(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for v in batch:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def _drive(loader, model: torch.nn.Module | None) -> Callable[[], None]:
    """The loop ``doctor(loader, model=...)`` runs: forward the first tensor, backward when trainable."""

    def loop() -> None:
        while True:
            for batch in loader:
                if model is None:
                    continue
                x = _first_tensor(batch)
                params = [p for p in model.parameters() if p.requires_grad]
                x = x.to(next(model.parameters()).device) if params else x
                if x.dtype == torch.uint8:
                    x = x.float().div_(255)
                out = model(x)
                if params and isinstance(out, torch.Tensor):
                    out.float().mean().backward()

    return loop


def doctor(
    target: Any,
    *,
    model: torch.nn.Module | None = None,
    steps: int = 20,
    measure_workers: bool = True,
    budget_s: float = 1.5,
) -> Report:
    """Run ``steps`` batches of a training loop and report, with measured numbers, what slows it.

    ``target``: a callable running your loop (stopped after ``steps`` batches), or a DataLoader (then
    ``model`` is run on the first tensor of each batch). ``measure_workers`` times fastload fast-path
    loaders at each candidate ``num_workers`` (about ``budget_s`` seconds per loader). Returns a
    ``Report``; ``print(report)`` shows it.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps={steps!r} should be an int >= 2 (the first batch is start-up and is not counted)")
    loop = target if callable(target) and not hasattr(target, "__iter__") else _drive(target, model)
    session = _Session(steps)
    with session:
        loop()
    return _report(session, measure_workers, budget_s)


def _report(s: _Session, measure_workers: bool, budget_s: float) -> Report:
    from .._front.dataset import Dataset as PackedDataset
    from .._front.loader import DataLoader as FastLoader, fill_parts

    r = Report(steps=s.steps, wait_s=s.wait_s, step_s=s.step_s, loaders=len(s.loaders))
    loop = s.wait_s + s.step_s
    share = s.wait_s / loop if loop > 0 else 0.0
    later: list[Finding] = []
    rates_by: dict[str, dict[int, float]] = {}  # the measured samples/s by num_workers of each fast-path loader
    for loader, where in s.loaders.values():
        if isinstance(loader, FastLoader) and not loader.fast_path and isinstance(loader.dataset, PackedDataset):
            later.append(
                Finding(
                    "fast-path",
                    "a fastload.Dataset runs on the generic path",
                    f"fast_path=False: {loader.fast_path_reason}",
                    f"the loader iterated at {where}",
                    "remove what the reason names (see fastload.FastPathWarning)",
                )
            )
        if measure_workers and isinstance(loader, FastLoader) and fill_parts(loader) is not None:
            f = _workers_finding(loader, where, budget_s, r, rates_by)
            if f is not None:
                later.append(f)
    if share > INPUT_BOUND:
        where = max(s.wait_by, key=s.wait_by.get) if s.wait_by else "(the loader)"
        waited = next((ld for ld, w in s.loaders.values() if w == where), None)
        r.findings.append(
            Finding(
                "input-bound",
                "the loop waits for data",
                f"{s.wait_s:.3f} s of {loop:.3f} s waiting for the next batch ({share:.0%}) over {s.steps - 1} steps "
                f"(first batch excluded)",
                f"the loop over the loader at {where}",
                _input_fix(waited, rates_by.get(where)),
            )
        )
    r.findings += later
    if s.anomaly_steps or s.anomaly_at:
        r.findings.append(
            Finding(
                "anomaly",
                "autograd anomaly detection is on",
                f"on during {s.anomaly_steps} of {max(s.steps - 1, 1)} steps "
                "(every backward records and checks each op)",
                s.anomaly_at or "torch.autograd.set_detect_anomaly(True) before the doctor ran",
                "remove torch.autograd.set_detect_anomaly(True) / detect_anomaly() outside debugging",
            )
        )
    if s.profiler_steps or s.profiler_at:
        r.findings.append(
            Finding(
                "profiler",
                "a torch profiler is running",
                f"on during {s.profiler_steps} of {max(s.steps - 1, 1)} steps",
                s.profiler_at or "a profiler entered before the doctor ran",
                "profile a few steps with a schedule (torch.profiler.schedule(wait, warmup, active)), then stop it",
            )
        )
    for where, times in s.zero_grad.items():
        r.findings.append(
            Finding(
                "zero-grad",
                "zero_grad(set_to_none=False) writes zeros into every gradient",
                f"{len(times)} calls, {1e3 * sum(times) / len(times):.3f} ms per call",
                where,
                "zero_grad() (set_to_none=True, the default since torch 2.0): no memset, and the next backward "
                "writes instead of accumulating",
            )
        )
    for what, calls in s.data_parallel.items():
        r.findings.append(
            Finding(
                "data-parallel",
                "nn.DataParallel instead of DistributedDataParallel",
                f"{calls} forward calls through DataParallel (one process replicates the model every step)",
                what,
                "DistributedDataParallel, one process per GPU (torchrun, Lightning strategy='ddp', accelerate)",
            )
        )
    _gpu_findings(s, r)
    return r


def _input_fix(loader: Any, rates: dict[int, float] | None) -> str:
    """What would feed the loop faster, read from the loader it waited on and what was measured of it: no advice
    the loop already follows (fastload.DataLoader on the fast path), no "more num_workers" where the measured
    counts show they do not help."""
    from .._front.dataset import Dataset as PackedDataset
    from .._front.loader import DataLoader as FastLoader

    fixes: list[str] = []
    fast = isinstance(loader, FastLoader) and loader.fast_path
    if fast and rates:
        best = max(rates, key=rates.get)
        mine = rates.get(loader.num_workers, 0.0)
        shown = ", ".join(f"{k}: {v:,.0f}" for k, v in sorted(rates.items()))
        if rates[best] > WORKERS_HELP * mine:
            fixes.append(f"num_workers={best} (measured samples/s by num_workers: {shown})")
        else:
            fixes.append(
                f"not more num_workers: they do not raise the rate here (measured samples/s by num_workers: "
                f"{shown}), so decoding and transforming the images is the limit: store them smaller "
                f"(fastload pack --max-side N) or use lighter per-sample transforms"
                + (", or decode on the GPU (device='cuda', decoder='auto')" if torch.cuda.is_available() else "")
            )
    elif fast:
        fixes.append(
            f"num_workers='auto' (measures the best count once per dataset and machine; this loader has "
            f"num_workers={loader.num_workers})"
        )
    else:
        fixes.append(f"more num_workers (this loader has {getattr(loader, 'num_workers', '?')})")
    if fast:
        pass  # packed and on fastload's fast path already: nothing to move to
    elif isinstance(loader, FastLoader) and isinstance(loader.dataset, PackedDataset):
        fixes.append("put this loader on the fast path (the fast-path finding below says what keeps it off)")
    elif isinstance(getattr(loader, "dataset", None), PackedDataset):
        fixes.append(
            "load the packed dataset with fastload.DataLoader instead of torch's (one native call per batch, "
            "prefetched)"
        )
    else:
        fixes.append("pack the data with fastload (fastload pack SRC DST) and load it with fastload.DataLoader")
    if not fast or not rates:
        fixes.append("lighter per-sample transforms")
    return "; ".join(fixes)


def _workers_finding(
    loader, where: str, budget_s: float, r: Report, rates_by: dict[str, dict[int, float]] | None = None
) -> Finding | None:
    from .._front.autotune import candidates, measure

    counts = candidates(os.cpu_count() or 1)
    if loader.num_workers not in counts:
        counts = sorted(set(counts) | {loader.num_workers})
    from .._front.loader import fill_parts

    rates = measure(*fill_parts(loader), counts, budget_s)
    if rates_by is not None:
        rates_by[where] = rates
    shown = ", ".join(f"{k}: {v:,.0f}" for k, v in sorted(rates.items()))
    r.notes.append(f"samples/s by num_workers for the loader at {where}: {shown}")
    best = max(rates, key=rates.get)
    mine = rates.get(loader.num_workers, 0.0)
    if rates[best] > 0 and mine < WORKERS_SHORTFALL * rates[best]:
        return Finding(
            "num_workers",
            f"num_workers={loader.num_workers} is far from the measured best ({best})",
            f"{mine:,.0f} samples/s with {loader.num_workers}, {rates[best]:,.0f} with {best} ({shown})",
            f"the loader iterated at {where}",
            f"num_workers={best}, or num_workers='auto' (measures once per dataset and machine)",
        )
    return None


def _gpu_findings(s: _Session, r: Report) -> None:
    codes = ("sync", "cudnn-shapes", "cudnn-benchmark", "autocast")
    if not s.cuda:
        r.skipped += [(c, "no CUDA device") for c in codes]
        return
    steps = max(s.steps - 1, 1)
    if s.sync_warnings:
        r.findings.append(
            Finding(
                "sync",
                "host-device synchronisations in the step",
                f"{s.sync_warnings} synchronising operations in {steps} steps ({s.sync_warnings / steps:.1f} per step)",
                "torch.cuda.set_sync_debug_mode('warn') shows each one's stack",
                "avoid .item(), .cpu(), printing or branching on GPU values each step; log every N steps",
            )
        )
    full = [sh for sh in s.shapes[:-1]] or s.shapes  # the last batch of an epoch may be short
    distinct = len(set(full))
    if torch.backends.cudnn.benchmark and distinct > 1:
        r.findings.append(
            Finding(
                "cudnn-shapes",
                "batch shapes change under cudnn.benchmark",
                f"{distinct} distinct input shapes in {len(full)} batches: each new shape re-runs cuDNN's autotuning",
                "torch.backends.cudnn.benchmark = True",
                "fixed shapes (Pad/Bucket, drop_last=True) or benchmark off",
            )
        )
    elif not torch.backends.cudnn.benchmark and distinct == 1 and len(full) > 1:
        r.findings.append(
            Finding(
                "cudnn-benchmark",
                "cudnn.benchmark is off with fixed input shapes",
                f"1 input shape {full[0]} in {len(full)} batches",
                "torch.backends.cudnn.benchmark (False)",
                "torch.backends.cudnn.benchmark = True: cuDNN picks the fastest kernels once for the shape",
            )
        )
    major, _ = torch.cuda.get_device_capability()
    if major >= 7 and s.fp32_forward and s.autocast_off_steps:
        r.findings.append(
            Finding(
                "autocast",
                "fp32 forward passes on a tensor-core GPU without autocast",
                f"{s.fp32_forward} module calls with fp32 weights, {s.autocast_off_steps} outside autocast "
                f"(compute capability {major}.x)",
                "the model's forward",
                "torch.autocast('cuda', dtype=torch.bfloat16) around forward and loss (or TF32: "
                "torch.backends.cuda.matmul.allow_tf32 = True)",
            )
        )


def run_script(path: str, argv: list[str], steps: int, measure_workers: bool = True) -> Report:
    """``fastload doctor script.py args...``: run the script as ``__main__`` under the doctor."""
    import runpy

    def main() -> None:
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as e:  # the script ended by itself, before the steps ran out: report what ran
            if e.code not in (0, None):
                raise

    saved, folder = sys.argv[:], os.path.dirname(os.path.abspath(path))
    sys.argv = [path, *argv]
    sys.path.insert(0, folder)
    try:
        return doctor(main, steps=steps, measure_workers=measure_workers)
    finally:
        sys.argv = saved
        sys.path.remove(folder)
