"""bench/suite.py's planning: before the loader cases run, every packed copy they read is made.

The suite's own modules live in bench/ (a folder of scripts, not a package), so the test puts bench/ on the path for
its duration; nothing here starts a job (the runner's ``run`` only records what it was asked to run).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def suite(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import _suite_plan
    import _suite_run

    return SimpleNamespace(plan=_suite_plan, run=_suite_run)


@pytest.mark.parametrize("quick", [True, False], ids=["quick", "full"])
def test_every_packed_copy_a_loader_case_reads_is_prepared(suite, tmp_path, capsys, quick):
    """``--quick`` packs only photos and tiny in its pack case; its raw and varlen cases still read fastload's
    packed copies, which the prepare step used to leave unmade (the jobs then failed: 'does not exist')."""
    plan, run = suite.plan, suite.run
    needed = plan.packs_needed(list(plan.CASES), quick)
    assert {("fastload", "raw"), ("fastload", "varlen"), ("fastload", "tiny"), ("fastload", "photos")} <= needed
    asked = []

    class Recorder(run.Runner):
        def __init__(self):  # every peer installed, no data: only the jobs asked for are of interest
            args = SimpleNamespace(data=str(tmp_path), quick=quick, repeat=1, min_time=0.05, max_time=2.0, timeout=1,
                                   quiet_wait=0)
            super().__init__(args, sources={}, available={peer: {} for peer in plan.PACKS}, skipped={})

        def run(self, spec, timeout):
            asked.append((spec["peer"], spec["config"]["dataset"], spec["config"].get("mode", "")))
            return {"status": "failed (not run by this test)"}

    run.run_pack(Recorder(), plan.SIZES["quick" if quick else "full"], quick, prepare_only=True, needed=needed)
    assert sorted((peer, ds) for peer, ds, _ in asked) == sorted(needed)  # each once
    assert all(mode in ("", "passthrough") for _, _, mode in asked)  # the copies the loaders read, not the variants
    assert "prepare fastload raw" in capsys.readouterr().out
