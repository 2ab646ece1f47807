"""bench/recipes_bench.py's smallest mode (``--quick``) runs end to end with torchvision's and timm's own objects,
and its report says what it measured: every group's rows, samples/s and ratios, agreement figures that agree where
the recipe is deterministic, and every label counted.

torchvision and timm from the package index need a CUDA torch for their C ops, so they live in the test-only venv
that ``bash scripts/timm_test_venv.sh`` builds at bench/.venvs/timm. The script runs under this interpreter when it
imports them, else under that venv's python when it exists; else the test is skipped (CI's fresh clone).
"""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV_PYTHON = ROOT / "bench" / ".venvs" / "timm" / "bin" / "python"

GROUPS = ["tv classic", "tv v2 recipe", "timm train", "timm eval", "Parquet (tv classic)",
          "WebDataset tar (tv classic)"]


def python_with_timm() -> str:
    if importlib.util.find_spec("timm") and importlib.util.find_spec("torchvision"):
        return sys.executable
    if VENV_PYTHON.exists():
        return str(VENV_PYTHON)
    pytest.skip("torchvision/timm are not importable here and bench/.venvs/timm is missing "
                "(bash scripts/timm_test_venv.sh)")


@pytest.mark.slow
def test_quick_mode_measures_every_recipe_and_source_with_the_real_objects(tmp_path):
    python = python_with_timm()
    out, table = tmp_path / "recipes.md", tmp_path / "recipes.csv"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([python, str(ROOT / "bench" / "recipes_bench.py"), "--quick", "--data", str(tmp_path / "d"),
                           "--out", str(out), "--csv", str(table)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = out.read_text()
    assert f"fastload from {ROOT / 'fastload'}" in report  # this checkout's fastload was measured
    rows = defaultdict(list)
    with open(table) as fh:
        for r in csv.DictReader(fh):
            rows[(r["group"], r["loader"])].append(r)
    groups = {g for g, _ in rows}
    assert set(GROUPS) <= groups
    has_timm = importlib.util.find_spec("fastload.timm") is not None
    assert ("timm loader" in groups) == has_timm
    assert ("no fastload.timm in this fastload" in report) == (not has_timm)
    for g in GROUPS[:4]:
        assert {loader for group, loader in rows if group == g} == {
            "torch DataLoader + ImageFolder", "fastload.open + fastload.DataLoader",
            "fastload.DataLoader(ImageFolder) (one import)"}
    for (g, loader), rs in rows.items():
        first = rs[0]
        assert all(float(r["samples_per_s"]) > 0 for r in rs)
        assert first["dtype"] == "float32", (g, loader)  # every recipe ends in Normalize
        labels = [int(x) for x in first["labels"].split()]
        # 96 images, batch 16, drop_last: every label of the warm-up round and the timed one counted
        assert sum(labels) == 2 * 96, (g, loader, labels)
        assert float(first["label_tv"]) == 0.0, (g, loader)  # an epoch yields each sample once
        if g == "timm eval":  # deterministic: the same pixels in every loader, in any order
            assert float(first["dmean"]) < 0.01 and float(first["dstd"]) < 0.01, (loader, first)
    assert "timm eval (deterministic), fastload.open(...)[i] vs ImageFolder[i]: first 8 samples" in report


def test_the_label_histogram_counts_every_class_of_the_folder():
    """bench/photos.py's photos have 12 classes, the synthetic data 8: a label past the 8 was dropped from the
    histograms (the label TV compared two thirds of them); now every class counts and a label past the folder's
    classes is an error."""
    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from recipes_bench import Stats
    finally:
        sys.path.remove(str(ROOT / "bench"))
    st = Stats(12)
    st.batch(torch.zeros(4, 3, 16, 16), np.array([0, 8, 11, 11]))
    assert st.labels.tolist() == [1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 2]
    with pytest.raises(ValueError, match="label 12, but the folder has 12 classes"):
        Stats(12).batch(torch.zeros(1, 3, 16, 16), np.array([12]))
