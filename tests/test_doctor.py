"""fastload.doctor (fastload/_tools/doctor.py): every finding provoked by a loop that has the problem, and silent on
a clean loop; GPU findings skip cleanly without CUDA."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import fastload
from fastload import transforms as T

from conftest import packed_image_folder

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parent.parent
GPU_CODES = {"sync", "cudnn-shapes", "cudnn-benchmark", "autocast"}


@pytest.fixture(scope="module")
def arrays(tmp_path_factory):
    root = tmp_path_factory.mktemp("doctor")
    rng = np.random.default_rng(0)
    fastload.pack({"x": rng.random((256, 8), dtype=np.float32), "y": rng.integers(0, 4, 256)}, root / "ds")
    return root / "ds"


def training(loader, *, zero_grad=lambda opt: opt.zero_grad(), wrap=lambda m: m, step_s=0.01):
    """A small training loop; the keyword arguments put one mistake into it."""
    def loop():
        torch.manual_seed(0)
        model = wrap(nn.Linear(8, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(1000):
            for x, y in loader:
                zero_grad(opt)
                F.cross_entropy(model(x), y).backward()
                opt.step()
                time.sleep(step_s)  # the rest of a real step
    return loop


def clean(arrays):
    return fastload.DataLoader(fastload.open(arrays), batch_size=16, shuffle=True, num_workers=1, seed=0)


def test_a_clean_loop_has_no_findings(arrays):
    report = fastload.doctor(training(clean(arrays)), steps=12, measure_workers=False)
    assert report.steps == 12 and report.findings == [], str(report)
    assert "no findings" in str(report)
    if not torch.cuda.is_available():
        assert {c for c, _ in report.skipped} == GPU_CODES and all(why == "no CUDA device" for _, why in report.skipped)


class SlowSamples(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.ones(8), i % 4


def test_input_bound_names_the_loop_and_the_share(arrays):
    loader = torch.utils.data.DataLoader(SlowSamples(), batch_size=4)
    report = fastload.doctor(training(loader, step_s=0.0), steps=6, measure_workers=False)
    f = {f.code: f for f in report.findings}["input-bound"]
    assert "waiting for the next batch" in f.measured and __file__ in f.where
    assert report.wait_s > 0.15  # 5 counted batches of 4 x 10 ms


def test_a_refused_fast_path_is_a_finding(arrays):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastload.FastPathWarning)
        loader = fastload.DataLoader(fastload.open(arrays), batch_size=16,
                                     collate_fn=lambda b: torch.utils.data.default_collate(b))
    report = fastload.doctor(training(loader), steps=4, measure_workers=False)
    f = {f.code: f for f in report.findings}["fast-path"]
    assert "custom collate_fn" in f.measured


def test_anomaly_detection_left_on_names_the_line(arrays):
    def loop():
        torch.autograd.set_detect_anomaly(True)  # the line the finding must name
        try:
            training(clean(arrays), step_s=0.0)()
        finally:
            torch.autograd.set_detect_anomaly(False)

    report = fastload.doctor(loop, steps=6, measure_workers=False)
    f = {f.code: f for f in report.findings}["anomaly"]
    line = loop.__code__.co_firstlineno + 1
    assert f.where == f"{__file__}:{line}" and "on during 5 of 5 steps" in f.measured
    assert not torch.is_anomaly_enabled()


def test_a_running_profiler_is_a_finding(arrays):
    def loop():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            training(clean(arrays), step_s=0.0)()

    report = fastload.doctor(loop, steps=5, measure_workers=False)
    f = {f.code: f for f in report.findings}["profiler"]
    assert __file__ in f.where and "on during 4 of 4 steps" in f.measured


def test_zero_grad_without_set_to_none_names_the_line(arrays):
    report = fastload.doctor(training(clean(arrays), zero_grad=lambda opt: opt.zero_grad(set_to_none=False)),
                             steps=6, measure_workers=False)
    f = {f.code: f for f in report.findings}["zero-grad"]
    assert __file__ in f.where and "ms per call" in f.measured and "set_to_none=True" in f.fix


def test_data_parallel_is_a_finding(arrays):
    report = fastload.doctor(training(clean(arrays), wrap=nn.DataParallel), steps=5, measure_workers=False)
    f = {f.code: f for f in report.findings}["data-parallel"]
    assert "Linear wrapped in nn.DataParallel" in f.where and "DistributedDataParallel" in f.fix


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return packed_image_folder(tmp_path_factory.mktemp("doctor_images"), classes=2, per_class=12)


def image_loader(images, workers):
    ds = fastload.open(images, transforms={"image": [T.RandomResizedCrop(32)]})
    return fastload.DataLoader(ds, batch_size=4, shuffle=True, num_workers=workers, seed=0)


def test_num_workers_far_from_the_measured_best(images, monkeypatch):
    from fastload._front import autotune as _autotune

    # the rule, on fixed rates (this 2-core machine is shared: real rates are too noisy to assert a winner)
    monkeypatch.setattr(_autotune, "measure", lambda b, o, counts, budget: {0: 100.0, 1: 190.0, 2: 400.0})
    report = fastload.doctor(image_loader(images, 0), model=nn.Conv2d(3, 4, 3), steps=3)
    f = {f.code: f for f in report.findings}["num_workers"]
    assert "num_workers=0 is far from the measured best (2)" in f.title and "100 samples/s with 0" in f.measured
    quiet = fastload.doctor(image_loader(images, 2), model=nn.Conv2d(3, 4, 3), steps=3)
    assert "num_workers" not in quiet.codes()


def test_num_workers_is_really_measured(images):
    report = fastload.doctor(image_loader(images, 1), model=nn.Conv2d(3, 4, 3), steps=3, budget_s=0.3)
    note = next(n for n in report.notes if n.startswith("samples/s by num_workers"))
    rates = dict(part.split(": ") for part in note.split("py:")[-1].split(": ", 1)[1].split(", "))
    assert {"0", "1"} <= set(rates) and all(float(v.replace(",", "")) > 0 for v in rates.values())


def test_steps_is_checked():
    with pytest.raises(ValueError, match="steps=1 should be an int >= 2"):
        fastload.doctor(lambda: None, steps=1)


def test_a_loop_that_ends_early_reports_what_ran(arrays):
    loader = fastload.DataLoader(fastload.open(arrays), batch_size=128)  # 2 batches, then the loop ends

    def loop():
        for _ in loader:
            pass

    report = fastload.doctor(loop, steps=10, measure_workers=False)
    assert report.steps == 2


CLI_SCRIPT = """
import sys, time, torch, fastload
from torch import nn
ds = fastload.open(sys.argv[1])
loader = fastload.DataLoader(ds, batch_size=16, num_workers=1, seed=0)
model = nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(100):
    for x, y in loader:
        opt.zero_grad(set_to_none=False)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        time.sleep(0.005)
"""


def test_the_command_runs_a_script_and_names_its_line(arrays, tmp_path):
    script = tmp_path / "train_me.py"
    script.write_text(textwrap.dedent(CLI_SCRIPT))
    cmd = [sys.executable, "-c", "from fastload.cli import main; main()", "doctor", "--steps", "8",
           "--no-measure-workers", str(script), str(arrays)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "fastload doctor: 8 steps measured" in out.stdout
    assert "[zero-grad]" in out.stdout and f"{script}:10" in out.stdout
    assert "[input-bound]" not in out.stdout


# -- GPU findings: provoked on a CUDA machine, skipped cleanly elsewhere --------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def gpu_loop(*, item=False, benchmark=False, shapes=None, autocast=False):
    def loop():
        torch.backends.cudnn.benchmark = benchmark
        model = nn.Conv2d(3, 8, 3).cuda()
        sizes = shapes or [32]
        for k in range(1000):
            s = sizes[k % len(sizes)]
            for x in torch.utils.data.DataLoader(torch.zeros(64, 3, s, s), batch_size=8):
                x = x.cuda(non_blocking=True)
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                    out = model(x).float().mean()
                out.backward()
                if item:
                    out.item()
    return loop


@pytest.mark.cuda
@cuda
def test_gpu_syncs_per_step_are_counted():
    assert "sync" in fastload.doctor(gpu_loop(item=True), steps=6, measure_workers=False).codes()
    assert "sync" not in fastload.doctor(gpu_loop(), steps=6, measure_workers=False).codes()


@pytest.mark.cuda
@cuda
def test_cudnn_benchmark_findings():
    assert "cudnn-benchmark" in fastload.doctor(gpu_loop(), steps=6, measure_workers=False).codes()
    changing = fastload.doctor(gpu_loop(benchmark=True, shapes=[32, 40]), steps=20, measure_workers=False).codes()
    assert "cudnn-shapes" in changing
    steady = fastload.doctor(gpu_loop(benchmark=True), steps=6, measure_workers=False).codes()
    assert "cudnn-shapes" not in steady and "cudnn-benchmark" not in steady


@pytest.mark.cuda
@cuda
def test_fp32_without_autocast_on_tensor_cores():
    if torch.cuda.get_device_capability()[0] < 7:
        pytest.skip("no tensor cores")
    assert "autocast" in fastload.doctor(gpu_loop(benchmark=True), steps=6, measure_workers=False).codes()
    assert "autocast" not in fastload.doctor(gpu_loop(benchmark=True, autocast=True), steps=6,
                                             measure_workers=False).codes()


def test_a_script_without_a_loader_says_it_saw_none(tmp_path):
    """Issue 17 row 12: 'no findings' for a script with no DataLoader read as a clean bill of health."""
    from click.testing import CliRunner

    from fastload.cli import main

    script = tmp_path / "no_loader.py"
    script.write_text("import torch\nprint(torch.zeros(2).sum())\n")
    res = CliRunner().invoke(main, ["doctor", "--steps", "3", str(script)])
    assert res.exit_code == 0, res.output
    assert "saw no DataLoader" in res.output and "no findings" not in res.output
    assert fastload.doctor(lambda: None, steps=2).loaders == 0


def test_a_loader_swapped_into_torch_is_watched_once(arrays, monkeypatch):
    """Code that swapped torch.utils.data.DataLoader for fastload's (a sitecustomize, issue 18): the doctor
    patched that one class twice, so each batch was counted twice and a 12-step report covered 6 steps."""
    monkeypatch.setattr(torch.utils.data, "DataLoader", fastload.DataLoader)
    got = []

    def loop():
        for _ in range(100):
            for x, _y in clean(arrays):
                got.append(len(x))

    report = fastload.doctor(loop, steps=12, measure_workers=False)
    assert report.steps == 12 and len(got) >= 12, (report.steps, len(got))
