"""A short run of every fuzz target (targets.py) as part of the test suite; ``make fuzz`` runs a million.

The random engine runs in this process (so a sanitizer build checks it too); atheris, when installed,
runs the multiplexed ``all`` target in a subprocess. Any finding fails the test, with the input saved
under build/fuzz/findings/ and its traceback in the message.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import targets
from run import OUT, run_random

HERE = Path(__file__).resolve().parent

# inputs per target: about 1.5 s each on one core
RUNS = {"shard": 300, "manifest": 600, "lmdb": 120, "jpeg": 1500, "mask": 1500}


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    s = targets.Seeds(tmp_path_factory.mktemp("fuzz"))
    yield s
    s.close()


def _findings_since(before: set) -> str:
    d = OUT / "findings"
    new = sorted(set(d.glob("*.txt")) - before) if d.exists() else []
    return "\n\n".join(f"{p.with_suffix('')}:\n{p.read_text()[-3000:]}" for p in new[:3])


@pytest.mark.parametrize("name", list(RUNS))
def test_short_random_run(seeds, name):
    d = OUT / "findings"
    before = set(d.glob("*.txt")) if d.exists() else set()
    r = run_random(name, RUNS[name], seed=1234, quiet=True, seeds_obj=seeds)
    assert r["inputs"] == RUNS[name]
    assert r["findings"] == 0, _findings_since(before)
    assert r["outcomes"] > 5  # the inputs reach more than one check


def test_short_atheris_run(tmp_path):
    pytest.importorskip("atheris")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    s = targets.Seeds(tmp_path)
    try:
        for k, data in enumerate(targets.AllTarget(s).seeds()):
            (corpus / f"seed-{k:04d}").write_bytes(data)
    finally:
        s.close()
    env = dict(os.environ, FASTLOAD_FUZZ_DIR=str(tmp_path))
    import fastload  # the same copy in the child (the sanitizer build's, under scripts/sanitize.sh)

    env["PYTHONPATH"] = os.pathsep.join([str(Path(fastload.__file__).resolve().parents[1])] +
                                        [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    proc = subprocess.run(
        [sys.executable, str(HERE / "fuzz_atheris.py"), "all", str(corpus), "-runs=300", "-seed=1",
         "-timeout=60", f"-artifact_prefix={tmp_path}/", "-print_final_stats=1"],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    done = re.findall(r"Done (\d+) runs", out)
    assert done and int(done[-1]) >= 300, out[-3000:]
