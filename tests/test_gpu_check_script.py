"""`make gpu-check` (scripts/gpu_check.sh) and the benchmarks it runs, on the parts that run without a GPU.

No GPU session has run them, so what can go wrong there before any GPU work is checked here: the results
file of bench/gpu_bench.py is written without CUDA, DALI or torchvision and names what did not run; it is
written again after each section and when the step's time limit stops it (SIGTERM); every goal gets a
verdict or "not measured"; the CPU halves of its sections (inputs, the native decode call, DALI's own
pipelines in DALI's CPU-only mode) still match the APIs they call; photos are made offline; and gpu_check.sh:
each step under its own limit with its results written as it ends, step selection, every tests/cuda file in a
step, the preconditions (CUDA, pybind11, the nvidia namespace), DALI's parts against their manifest, the
per-decoder verdicts (GPU_CHECK_REQUIRE), the fresh-process runner of tests/cuda, and the whole --dry-run.
"""

from __future__ import annotations

import importlib.util
import json
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
    # set for that call only: monkeypatch has no undo for a variable that was absent, and a later test's fresh
    # venv (tests/test_wheel.py) copied os.environ and found no package index
    assert "PIP_NO_INDEX" not in os.environ


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

def sourced(body: str, tmp_path: Path, timeout: float = 45, **extra: str) -> subprocess.CompletedProcess:
    """Run ``body`` in bash with gpu_check.sh's functions sourced, its logs and results in tmp_path."""
    logs, results = tmp_path / "logs", tmp_path / "results"
    logs.mkdir(exist_ok=True)
    results.mkdir(exist_ok=True)
    script = f"""
        GPU_CHECK_SOURCED=1 source {SCRIPT}
        logs={logs}; results={results}; require=${{require-}}
        export root PY dry dali logs results require
        {textwrap.dedent(body)}
        """
    return subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHON=sys.executable, **extra))


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils' timeout")
def test_each_step_runs_under_its_own_limit_and_the_results_are_written_as_each_step_ends(tmp_path):
    r = sourced("""
        STEP_LIMITS[quick]=20; STEP_LIMITS[slow]=6; STEP_LIMITS[after]=20; STEP_LIMITS[late]=20
        budget=14
        step quick true
        cp "$results/summary.txt" "$logs/../after-quick.txt"; tar -tf "$results/logs.tar" > "$logs/../tar-after-quick.txt"
        step slow sleep 30
        step after true
        sleep 4
        step late true
        echo "failed=$failed"
        """, tmp_path)
    summary = (tmp_path / "results" / "summary.txt").read_text().splitlines()
    steps = [ln for ln in summary if ln.split(":")[0] in ("quick", "slow", "after", "late")]
    assert re.fullmatch(r"quick: passed, [0-2]s of 1[2-4]s", steps[0]), steps  # the budget left: under its own 20 s
    assert re.fullmatch(r"slow: STOPPED at its 6s limit \(exit 124\), [67]s of 6s", steps[1]), steps
    assert re.fullmatch(r"after: passed, [0-2]s of [5-8]s", steps[2]), steps  # what the budget had left
    assert steps[3] == "late: NOT RUN (the 14s budget is spent)", steps
    assert "failed=1" in r.stdout
    # the summary and the logs' tar were there as soon as the first step ended, with its log
    assert "quick: passed" in (tmp_path / "after-quick.txt").read_text()
    assert "./quick.txt" in (tmp_path / "tar-after-quick.txt").read_text().split()


def test_gpu_check_steps_selects_steps_but_preflight_and_setup_always_run(tmp_path):
    r = sourced("""
        step preflight echo pre; step setup echo set; step lag echo lag; step sync echo sync; step bench echo bench
        """, tmp_path, GPU_CHECK_STEPS="sync")
    ran = [ln.split(":")[0] for ln in (tmp_path / "results" / "summary.txt").read_text().splitlines()[1:]]
    assert ran == ["preflight", "setup", "sync"], r.stdout + r.stderr


def test_every_cuda_test_file_is_in_exactly_one_step_new_files_included(tmp_path):
    """The other steps take named files; 'cuda' takes every other tests/cuda/test_*.py, so a new file (the D1 lag
    test, say) runs without anyone editing the script; a new *lag* file joins the lag step."""
    r = sourced("echo LAG $(lag_files); echo SYNC $(sync_files); echo REST $(rest_files)", tmp_path)
    got = {ln.split()[0]: ln.split()[1:] for ln in r.stdout.splitlines() if ln.split()}
    every = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests" / "cuda").glob("test_*.py"))
    listed = got["LAG"] + got["SYNC"] + got["REST"]
    assert sorted(listed) == every and len(set(listed)) == len(listed), got
    assert "tests/cuda/test_gpu_lag.py" in got["LAG"] and "tests/cuda/test_gpu_sync.py" in got["SYNC"]
    fake = tmp_path / "root"
    (fake / "tests" / "cuda").mkdir(parents=True)
    for name in ("test_gpu_lag.py", "test_gpu_decode_lag.py", "test_gpu_sync.py", "test_gpu_decoder_streams.py",
                 "test_new_thing.py"):
        (fake / "tests" / "cuda" / name).write_text("")
    r = sourced(f"root={fake}; echo LAG $(lag_files); echo REST $(rest_files)", tmp_path)
    got = {ln.split()[0]: ln.split()[1:] for ln in r.stdout.splitlines() if ln.split()}
    assert got["LAG"] == ["tests/cuda/test_gpu_decode_lag.py", "tests/cuda/test_gpu_lag.py"]
    assert got["REST"] == ["tests/cuda/test_new_thing.py"]


def test_preflight_fails_in_seconds_with_every_reason(tmp_path):
    """No CUDA here: the one call would be wasted, so preflight says so at once (with the other reasons) and the
    script runs no other step."""
    results, bare = tmp_path / "results", tmp_path / "bare"  # a checkout without .gpu/ (this one may have it)
    (bare / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, bare / "scripts")
    t = time.monotonic()
    r = subprocess.run([str(bare / "scripts" / "gpu_check.sh"), str(results)], cwd=bare, capture_output=True,
                       text=True, timeout=55, env=dict(os.environ, PYTHON=sys.executable, GPU_CHECK_REQUIRE="dali",
                                                       GPU_CHECK_DALI_PARTS=str(tmp_path / "parts")))
    assert time.monotonic() - t < 40  # seconds, on a busy CI machine too
    assert r.returncode == 1, r.stdout + r.stderr
    summary = (results / "summary.txt").read_text()
    assert "preflight: FAILED" in summary and "preflight failed: nothing else run" in summary
    assert "no CUDA device for torch" in summary and "no .gpu/dali.manifest" in summary
    assert "setup:" not in summary and "lag:" not in summary
    assert sorted(p.name for p in results.iterdir()) == ["logs.tar", "summary.txt"]


def test_a_carried_nvidia_package_hidden_by_a_regular_one_is_found_up_front(tmp_path):
    """K4: where the machine's `nvidia` is a regular package that does not extend its path, /tmp/site/nvidia/dali
    is never imported; the probe says so before anything is unpacked."""
    r = sourced("nvidia_probe && echo PROBE-OK", tmp_path)
    assert "PROBE-OK" in r.stdout, r.stdout + r.stderr  # here: no nvidia, or one that extends its path
    regular = tmp_path / "machine"
    (regular / "nvidia").mkdir(parents=True)
    (regular / "nvidia" / "__init__.py").write_text("")  # a regular package, no pkgutil.extend_path
    r = sourced("nvidia_probe && echo PROBE-OK", tmp_path, PYTHONPATH=str(regular))
    assert "PROBE-OK" not in r.stdout
    assert "a carried nvidia/ package is not importable here" in r.stdout and str(regular / "nvidia") in r.stdout


def test_pybind11_must_be_2_12_or_a_carried_wheel(tmp_path):
    old = tmp_path / "old"
    (old / "pybind11").mkdir(parents=True)
    (old / "pybind11" / "__init__.py").write_text("__version__ = '2.11.1'\n")
    fake = tmp_path / "root"
    (fake / ".gpu" / "whl").mkdir(parents=True)
    r = sourced(f"root={fake}; pybind11_ok && echo OK", tmp_path, PYTHONPATH=str(old))
    assert "OK" not in r.stdout.split() and "the machine has '2.11.1', .gpu/whl 'none'" in r.stdout, r.stdout + r.stderr
    (fake / ".gpu" / "whl" / "pybind11-3.1.0-py3-none-any.whl").write_text("")  # setup installs it first
    r = sourced(f"root={fake}; pybind11_ok && echo OK", tmp_path, PYTHONPATH=str(old))
    assert "OK" in r.stdout.split(), r.stdout + r.stderr


def make_parts(tmp_path: Path, n_parts: int = 3) -> tuple[Path, Path]:
    """A small tar.xz split in parts as gpu_prepare.sh makes DALI's, its manifest, and the folder the parts are
    brought to (flat, as the lease-2 calls copy them)."""
    import hashlib
    import io
    import lzma
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = os.urandom(3000)
        info = tarfile.TarInfo("nvidia/dali/__init__.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    blob = lzma.compress(buf.getvalue())
    root = tmp_path / "root"
    (root / ".gpu").mkdir(parents=True)
    parts = tmp_path / "parts"
    parts.mkdir()
    step = len(blob) // n_parts + 1
    lines = ["# test parts"]
    for k in range(n_parts):
        chunk = blob[k * step:(k + 1) * step]
        (parts / f"part{k:02d}").write_bytes(chunk)
        lines.append(f"{hashlib.sha256(chunk).hexdigest()}  part{k:02d}")
    (root / ".gpu" / "dali.manifest").write_text("\n".join(lines) + "\n")
    return root, parts


def test_dali_parts_are_checked_against_the_manifest_before_unpacking(tmp_path):
    root, parts = make_parts(tmp_path)
    site = tmp_path / "site"

    def run():
        return sourced(f"root={root}; dali_parts_check && dali_unpack && echo UNPACKED", tmp_path,
                       GPU_CHECK_DALI_PARTS=str(parts), GPU_CHECK_SITE=str(site))

    r = run()
    assert "DALI parts: 3 of 3 present" in r.stdout and "UNPACKED" in r.stdout, r.stdout + r.stderr
    assert (site / "nvidia" / "dali" / "__init__.py").stat().st_size == 3000
    (parts / "part01").rename(tmp_path / "away")
    r = run()
    assert "1 of 3 DALI parts missing" in r.stdout and "part01" in r.stdout and "UNPACKED" not in r.stdout
    (tmp_path / "away").rename(parts / "part01")
    data = bytearray((parts / "part02").read_bytes())
    data[0] ^= 1
    (parts / "part02").write_bytes(bytes(data))
    r = run()
    assert "DALI part part02 is corrupt" in r.stdout and "UNPACKED" not in r.stdout, r.stdout


def test_a_required_decoder_that_did_not_run_fails_the_check_and_the_summary_says_why(tmp_path):
    """D6: DALI missing on the machine turns its tests into skips; named in GPU_CHECK_REQUIRE that fails the check,
    and the summary has one verdict per decoder."""
    logs = tmp_path / "logs"
    logs.mkdir()
    recs = [{"nodeid": "t::a[native]", "decoder": "native", "outcome": "passed"},
            {"nodeid": "t::a[nvjpeg]", "decoder": "nvjpeg", "outcome": "passed"},
            {"nodeid": "t::a[dali]", "decoder": "dali", "outcome": "skipped",
             "reason": "decoder='dali' needs its GPU decoder"}]
    (logs / "lag.verdicts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    body = 'verdicts_check && echo CHECK-OK; render; cat "$results/summary.txt"'
    r = sourced(body, tmp_path, require="native,nvjpeg")
    assert "CHECK-OK" in r.stdout, r.stdout + r.stderr
    assert "decoder nvjpeg: passed: 1 ran (1 passed, 0 failed), 0 skipped" in r.stdout
    assert ("decoder dali: not run: 0 ran (0 passed, 0 failed), 1 skipped (1x decoder='dali' needs its GPU decoder)"
            in r.stdout)
    r = sourced(body, tmp_path, require="dali,nvjpeg")
    assert "CHECK-OK" not in r.stdout
    assert "decoder dali: not run" in r.stdout and "REQUIRED (GPU_CHECK_REQUIRE): it must run in full" in r.stdout
    assert "a decoder of GPU_CHECK_REQUIRE=dali,nvjpeg did not run in full" in r.stdout


def test_the_verdicts_plugin_records_each_test_by_decoder_and_keeps_only_the_asked_decoders(tmp_path):
    (tmp_path / "test_fake.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.parametrize("decoder", ["native", "nvjpeg",
                                             pytest.param("dali", marks=pytest.mark.skipif(True, reason="no DALI"))])
        def test_decode(decoder):
            assert decoder != "nvjpeg", "nvjpeg wrong pixels"

        def test_plain():
            pass
        """))
    out = tmp_path / "v.jsonl"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "gpu_verdicts",
           f"--gpu-verdicts={out}", str(tmp_path / "test_fake.py")]
    e = dict(os.environ, PYTHONPATH=str(ROOT / "tests" / "cuda"))
    subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=50, env=e)
    recs = {r["nodeid"].split("::")[1]: r for r in map(json.loads, out.read_text().splitlines())}
    assert recs["test_decode[native]"]["outcome"] == "passed" and recs["test_plain"]["decoder"] == "native"
    assert recs["test_decode[nvjpeg]"]["outcome"] == "failed"
    assert "nvjpeg wrong pixels" in recs["test_decode[nvjpeg]"]["reason"]
    dali = recs["test_decode[dali]"]
    assert (dali["decoder"], dali["outcome"], dali["when"], dali["reason"]) == ("dali", "skipped", "setup", "no DALI")
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "cuda" / "gpu_verdicts.py"), str(out)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "decoder nvjpeg: FAILED: 1 ran (0 passed, 1 failed)" in r.stdout, r.stdout
    out.unlink()
    subprocess.run(cmd + ["--gpu-decoders=dali,auto"], cwd=tmp_path, capture_output=True, text=True, timeout=50, env=e)
    assert [json.loads(ln)["decoder"] for ln in out.read_text().splitlines()] == ["dali"]


FRESH_TEST = '''
import pytest
from gpu_common import FreshProcess

FRESH = FreshProcess("""
import os
def run(path, case):
    if case == "raises":
        raise ValueError("wrong pixels in " + path)
    if case == "dies":
        os._exit(3)
    return f"ok {os.getpid()}"
""", timeout=40)

@pytest.mark.parametrize("case", ["a", "b", "raises", "skipped", "dies", "after"])
def test_case(request, case):
    if case == "skipped":
        pytest.skip("not this one")
    print("RESULT", case, FRESH.result(request, path="/data"))
'''


def test_fresh_process_cases_run_in_one_process_and_fail_alone(tmp_path):
    """tests/cuda's fresh-process checks: one Python for every case of a test (CUDA starts once), a case that
    raises fails alone, and a process that dies fails the case it was in and names it to the ones after."""
    (tmp_path / "test_fresh.py").write_text(FRESH_TEST)
    e = dict(os.environ, PYTHONPATH=f"{ROOT / 'tests' / 'cuda'}{os.pathsep}{ROOT}")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                        str(tmp_path / "test_fresh.py")], cwd=tmp_path, capture_output=True, text=True, timeout=55,
                       env=e)
    pids = {ln.split()[3] for ln in r.stdout.splitlines() if ln.startswith("RESULT")}
    assert len(pids) == 1 and re.search(r"RESULT a ok \d+", r.stdout) and "RESULT b ok" in r.stdout, r.stdout
    assert "ValueError: wrong pixels in /data" in r.stdout
    assert "the process ended while this case ran (exit status 3" in r.stdout
    assert "not run: the process ended while case 'dies' ran" in r.stdout
    assert "3 failed, 2 passed, 1 skipped" in r.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_dry_run_sets_up_and_collects_every_step_and_checks_the_device_limits(tmp_path):
    """Item 4: here, without CUDA, every step's setup and collection runs; the results are at most 6 files of at
    most 16 MiB; the step limits sum under the 420 s budget; what travels fits 64 MiB."""
    import tarfile

    results = tmp_path / "results"
    r = subprocess.run([str(SCRIPT), "--dry-run", str(results)], cwd=ROOT, capture_output=True, text=True,
                       timeout=590, env=dict(os.environ, PYTHON=sys.executable))
    summary = (results / "summary.txt").read_text()
    assert r.returncode == 0, summary + r.stdout[-3000:] + r.stderr[-2000:]
    for name in ("preflight", "setup", "lag", "sync", "cuda", "bench"):
        assert re.search(rf"^{name}: passed, \d+s of \d+s$", summary, re.M), (name, summary)
    assert re.search(r"^results: 3 files \(at most 6\): gpu_bench.md logs.tar summary.txt $", summary, re.M), summary
    m = re.search(r"^time budget: .* sum (\d+)s \(budget 420s", summary, re.M)
    assert m and int(m.group(1)) <= 420, summary
    assert "LIMIT" not in summary
    with tarfile.open(results / "logs.tar") as tar:
        logs = {Path(n).name: tar.extractfile(n).read().decode() for n in tar.getnames() if n.endswith(".txt")}
    assert {"preflight.txt", "setup.txt", "lag.txt", "sync.txt", "cuda.txt", "bench.txt"} <= set(logs)
    for name in ("lag.txt", "sync.txt", "cuda.txt"):
        last = logs[name].strip().splitlines()[-1]
        assert re.search(r"\d+ tests? collected", last) and "error" not in last, (name, logs[name][-500:])
    assert "No CUDA device here" in (results / "gpu_bench.md").read_text()


def test_the_dry_run_fails_when_the_results_would_not_all_come_back(tmp_path):
    """The limits check counts what the run leaves in the results folder: a seventh file, or one over 16 MiB,
    fails it."""
    r = sourced("limits_check; echo rc=$?", tmp_path)
    assert "rc=0" in r.stdout, r.stdout  # an empty results folder is within the limits
    results = tmp_path / "results"
    for name in ("summary.txt", "logs.tar", "a", "b", "c", "d"):
        (results / name).write_text("x")
    (results / "big.bin").write_bytes(b"\0" * (16 * 1048576 + 1))
    r = sourced("limits_check; echo rc=$?", tmp_path)
    assert "LIMIT: 7 result files, more than 6" in r.stdout and "LIMIT: big.bin is 16777217 bytes" in r.stdout
    assert "rc=1" in r.stdout


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


def test_gpu_bench_sections_and_decoders_select_what_runs(tmp_path):
    out = tmp_path / "gpu.md"
    code = """
        import runpy, sys
        sys.argv = ["gpu_bench.py", *sys.argv[2:], "--out", sys.argv[1]]
        runpy.run_path("bench/gpu_bench.py", run_name="__main__")
        """
    r = run_py(code, str(out), "--quick", "--sections", "loaders,decode", "--decoders", "dali,auto")
    assert r.returncode == 0, r.stderr
    assert "Not run (no CUDA device): loaders, decode" in out.read_text()
    r = run_py(code, str(out), "--sections", "loaders,nonsense")
    assert r.returncode == 2 and "unknown sections or decoders ['nonsense']" in r.stderr
