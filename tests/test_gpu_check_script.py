"""`make gpu-check` (scripts/gpu_check.sh) and the benchmarks it runs, on the parts that run without a GPU.

No GPU session has run them, so what can go wrong there before any GPU work is checked here: the results
file of bench/gpu_bench.py is written without CUDA, DALI or torchvision and names what did not run; it is
written again after each section and when the step's time limit stops it (SIGTERM); every goal gets a
verdict or "not measured"; the CPU halves of its sections (inputs, the native decode call, DALI's own
pipelines in DALI's CPU-only mode) still match the APIs they call; photos are made offline; and
gpu_check.sh's step budgeting and its check that fastload imports at all.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
GOAL_WORDS = ("1.2x DALI's own pipeline", "within 3% of synthetic data")


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{BENCH}", PYTHONUNBUFFERED="1")
    e.update(extra)
    return e


def run_py(code: str, *args: str, timeout: float = 50, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT, env=env(**extra),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def gpu_bench():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("gpu_bench", BENCH / "gpu_bench.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["gpu_bench"] = mod
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path.remove(str(BENCH))
        sys.modules.pop("gpu_bench", None)


@pytest.fixture(scope="module")
def tiny_photos(tmp_path_factory, gpu_bench):
    """2 classes of 4 synthetic JPEGs and their pack."""
    import fastload

    root = tmp_path_factory.mktemp("gpu_bench_photos")
    photos = root / "photos"
    gpu_bench.synthetic_photos(photos, classes=2, per_class=4)
    fastload.pack(photos, root / "packed", workers=0)
    return photos, root / "packed"


# -- gpu_bench.py's results file -----------------------------------------------------------------------

def test_gpu_bench_without_cuda_dali_torchvision_writes_what_did_not_run(tmp_path):
    out = tmp_path / "gpu.md"
    # None in sys.modules: importing them fails as for a package that is not installed
    r = run_py("""
        import runpy, sys
        sys.modules["torchvision"] = sys.modules["nvidia.dali"] = None
        sys.argv = ["gpu_bench.py", "--out", sys.argv[1]]
        runpy.run_path("bench/gpu_bench.py", run_name="__main__")
        """, str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "torchvision unusable (ModuleNotFoundError" in text and "DALI unusable (ModuleNotFoundError" in text
    assert "No CUDA device here" in text
    assert "Not run (no CUDA device): H2D bandwidth, correctness, loaders, overlap, decode" in text
    goals = text.split("## Goals", 1)[1]
    for words in GOAL_WORDS:
        line = next(ln for ln in goals.splitlines() if words in ln)
        assert line.endswith("not measured: no CUDA device"), line
    assert " met (" not in text and "NOT met" not in text


DRIVER = """
    import sys, time
    from pathlib import Path
    import gpu_bench as gb

    out, mark = Path(sys.argv[1]), Path(sys.argv[2])
    report = gb.Report(out, ["# test"], gb.GOALS)

    def measured():
        report.lines.append("measured ran")
        return {"loaders": "met (9.99x, fake)"}

    def broken():
        raise ModuleNotFoundError("No module named 'nvidia'")

    def wrong():
        raise AssertionError("2 batches differ")

    def slow():
        text = out.read_text()  # the file as a SIGKILL here would leave it: this section is named
        assert "Not run (the run ended before they finished): slow, last" in text, text
        mark.write_text("started")
        time.sleep(40)

    sections = [("measured", measured), ("broken", broken), ("wrong", wrong)]
    if sys.argv[3] == "slow":
        sections.append(("slow", slow))
    sections.append(("last", lambda: report.lines.append("last ran")))
    try:
        failed = gb.run_sections(report, sections)
    except gb.Stopped as e:
        sys.exit(f"stopped: {e}")
    print("FAILED:", failed)
"""


def test_sections_that_crash_or_fail_are_named_and_the_rest_still_run(tmp_path):
    out = tmp_path / "r.md"
    r = run_py(DRIVER, str(out), str(tmp_path / "mark"), "plain")
    assert r.returncode == 0, r.stderr
    assert "FAILED: ['wrong: 2 batches differ']" in r.stdout
    text = out.read_text()
    assert "measured ran" in text and "last ran" in text
    assert "broken could not run: ModuleNotFoundError: No module named 'nvidia'" in text
    assert "**wrong FAILED**: 2 batches differ" in text
    assert "Not run" not in text
    goals = text.split("## Goals", 1)[1]
    assert "1.2x DALI's own pipeline on the same photos: met (9.99x, fake)" in goals
    assert "within 3% of synthetic data: not measured: its section did not finish" in goals


def test_a_run_stopped_by_sigterm_keeps_what_ran_and_names_what_did_not(tmp_path):
    out, mark = tmp_path / "r.md", tmp_path / "mark"
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(DRIVER), str(out), str(mark), "slow"], cwd=ROOT,
                         env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not mark.exists():
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)  # what `timeout` sends at the step's limit
        _, err = p.communicate(timeout=15)
    finally:
        p.kill()
    assert p.returncode == 1 and "stopped: stopped by signal 15" in err, err
    text = out.read_text()
    assert "measured ran" in text and "**slow** did not finish: stopped by signal 15" in text
    assert "Not run (the run ended before they finished): last" in text and "last ran" not in text
    assert "1.2x DALI's own pipeline on the same photos: met (9.99x, fake)" in text
    assert "within 3% of synthetic data: not measured: its section did not finish" in text


def test_a_sigterm_while_the_file_is_written_leaves_a_finished_section_finished(gpu_bench, tmp_path, monkeypatch):
    """The stop lands in the save that follows a finished section: it is delivered once that save is done, so
    the file does not name the finished section as not run."""
    import _gpu_report  # the results-file harness gpu_bench uses (bench/ is on the path: the gpu_bench fixture)

    real, calls = _gpu_report.write, []

    def write(lines, out, echo=True):
        calls.append(1)
        if len(calls) == 2:  # the save after section "one" ended
            os.kill(os.getpid(), signal.SIGTERM)
        real(lines, out, echo=False)

    monkeypatch.setattr(_gpu_report, "write", write)
    out = tmp_path / "r.md"
    report = gpu_bench.Report(out, ["# test", ""], gpu_bench.GOALS)
    with pytest.raises(gpu_bench.Stopped):
        gpu_bench.run_sections(report, [("one", lambda: None), ("two", lambda: None)])
    text = out.read_text()
    assert "Not run (the run ended before they finished): two" in text, text


# -- the CPU halves of its sections -------------------------------------------------------------------

def test_decode_inputs_and_the_native_decode_call_match_the_native_core(gpu_bench, tiny_photos):
    _, packed = tiny_photos
    blobs, metas, plan = gpu_bench.decode_inputs(packed, 4)
    assert len(blobs) == 8 and metas.shape == (8, 3) and len(plan.crops) == 8
    gpu_bench.native_decode_run(blobs, metas, plan, 4, 1)()  # raises on a failed sample or a wrong call
    with pytest.raises(ValueError, match="fewer than one batch of 16"):
        gpu_bench.decode_inputs(packed, 16)


def test_dali_own_pipelines_build_and_run_in_dali_cpu_mode(gpu_bench, tiny_photos):
    """The same graphs the GPU run builds (only the decoder's device and the labels' copy differ)."""
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    sys.path.insert(0, str(BENCH))
    try:
        import augment_gpu_bench
    finally:
        sys.path.remove(str(BENCH))
    photos, _ = tiny_photos
    for make in (gpu_bench.dali_native, augment_gpu_bench.dali_trivial):
        one_epoch = make(photos, 4, 1, gpu=False)
        for _ in range(2):  # the second epoch first takes the batches DALI prefetched, off the clock
            n, seconds = one_epoch()
            assert n == 8 and seconds > 0


def test_photos_are_made_offline_when_the_photo_wheels_are_not_here(gpu_bench, tmp_path, monkeypatch):
    import photos  # bench/photos.py, as gpu_bench imports it

    monkeypatch.setattr(photos, "DEFAULT_CACHE", tmp_path / "no-wheels")
    for name in ("PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no pip.conf: only what gpu_bench itself sets
    monkeypatch.setenv("PIP_RETRIES", "0")
    lines: list[str] = []
    t = time.perf_counter()
    folder = gpu_bench.photo_folder(tmp_path / "data", 2, lines)
    assert time.perf_counter() - t < 30  # pip is told there is no index: it fails at once, no network tries
    assert folder.name == "synthetic_2" and len(list(folder.rglob("*.jpg"))) == 20
    assert "bench/photos.py could not build real photos" in lines[0] and "using synthetic JPEGs" in lines[0]


def test_cpu_cores_are_the_affinity_mask_capped_by_the_cgroup_quota(gpu_bench, tmp_path, monkeypatch):
    """A container shows the host's cores to os.cpu_count(); the workers must follow what it may use."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    cpu_max = tmp_path / "cpu.max"
    monkeypatch.setattr(gpu_bench, "CGROUP_CPU_MAX", cpu_max)
    assert gpu_bench.cpu_cores() == 64  # no cgroup file
    cpu_max.write_text("max 100000\n")
    assert gpu_bench.cpu_cores() == 64
    cpu_max.write_text("1600000 100000\n")  # 16 cores' worth of time
    assert gpu_bench.cpu_cores() == 16
    cpu_max.write_text("50000 100000\n")
    assert gpu_bench.cpu_cores() == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    cpu_max.write_text("1600000 100000\n")
    assert gpu_bench.cpu_cores() == 2


# -- scripts/gpu_check.sh --------------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils' timeout")
def test_step_budgeting_stops_a_step_at_its_limit_and_skips_what_no_longer_fits(tmp_path):
    r = subprocess.run(["bash", "-c", f"""
        GPU_CHECK_SOURCED=1 GPU_CHECK_SECONDS=14 source {SCRIPT}
        results={tmp_path}
        step quick 0 true
        step reserved 5 true
        step slow 0 sleep 30
        step after 0 true
        echo "failed=$failed"
        """], cwd=ROOT, capture_output=True, text=True, timeout=45)
    summary = (tmp_path / "summary.txt").read_text().splitlines()
    assert summary[0].startswith("quick: exit 0, ")
    assert summary[1] == "reserved: not run (the 14s budget is spent)"  # 14 - 5 leaves under 10 s
    assert re.fullmatch(r"slow: stopped at its 1[1-4]s limit \(exit 124\), 1[1-4]s", summary[2]), summary[2]
    assert summary[3] == "after: not run (the 14s budget is spent)"
    assert "failed=1" in r.stdout
    assert not (tmp_path / "reserved.txt").exists() and not (tmp_path / "after.txt").exists()


@pytest.mark.skipif((ROOT / ".gpu" / "setup.sh").exists(), reason="the script would install .gpu/'s wheels")
def test_gpu_check_says_once_that_fastload_does_not_import_and_runs_no_step(tmp_path):
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "xxhash.py").write_text("raise ImportError(\"No module named 'xxhash' (hidden by the test)\")\n")
    results = tmp_path / "results"
    r = subprocess.run([str(SCRIPT), str(results)], cwd=ROOT, capture_output=True, text=True, timeout=55,
                       env=dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(shadow), GPU_CHECK_SECONDS="60"))
    assert r.returncode == 1, r.stdout + r.stderr
    summary = (results / "summary.txt").read_text()
    assert "fastload does not import here: ImportError: No module named 'xxhash' (hidden by the test)" in summary
    assert "carry what is missing in .gpu/whl" in summary and "no step run" in summary
    assert sorted(p.name for p in results.iterdir()) == ["env.txt", "setup.txt", "summary.txt"]
    assert "fastload unusable: ImportError" in (results / "env.txt").read_text()


def test_gpu_check_test_steps_collect_with_a_broken_dali_and_torchvision(tmp_path):
    """On a GPU machine a DALI without its CUDA libraries, or a torchvision built for another torch, raises
    RuntimeError at import, not ImportError: the test steps must skip their tests, not stop at collection."""
    shadow = tmp_path / "shadow"
    (shadow / "torchvision").mkdir(parents=True)
    (shadow / "nvidia" / "dali").mkdir(parents=True)
    (shadow / "torchvision" / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    (shadow / "nvidia" / "__init__.py").write_text("")
    (shadow / "nvidia" / "dali" / "__init__.py").write_text('raise RuntimeError("libcudart.so.13: cannot open")\n')
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                        "tests/decoders", "tests/cuda", "tests/test_gpu_decoders_sim.py"], cwd=ROOT,
                       capture_output=True, text=True, timeout=55, env=dict(os.environ, PYTHONPATH=f"{shadow}{os.pathsep}{ROOT}"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "error" not in r.stdout.splitlines()[-1]


def test_the_sim_step_runs_every_simulator_test_module():
    """A simulator test module left out of gpu-check's sim step is silently not run on the GPU machine (it
    happened when the ring's multi-stream tests moved to their own file)."""
    r = subprocess.run(["bash", "-c", f"GPU_CHECK_SOURCED=1 source {SCRIPT}; sim_tests"], cwd=ROOT,
                       capture_output=True, text=True, timeout=30)
    listed = set(r.stdout.split())
    importing = set()
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("tests/cuda/") or rel == "tests/test_accelerate.py":  # GPU-only / needs accelerate
            continue
        text = path.read_text()
        if re.search(r"^from (sim_streams|test_ring|test_gpu_decoders_sim) import", text, re.M):
            importing.add(rel)
    assert importing and importing <= listed, f"simulator tests gpu-check leaves out: {sorted(importing - listed)}"
    assert all((ROOT / p).is_file() for p in listed)
