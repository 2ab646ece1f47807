"""A short run of bench/soak.py (``make soak`` runs 50 epochs): the process tree's PSS (this process and the
generic path's workers) does not grow after the first epoch, and the check does fail on a leak put in on purpose.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import soak  # noqa: E402

pytestmark = pytest.mark.timeout(120)
EPOCHS = 5


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("soak")
    soak.build(root, 128, formats=("shards",))
    return root


@pytest.mark.parametrize("path", ["fast-shards", "generic-persistent"])
def test_short_soak_tree_pss_is_flat(data, path):
    """Five epochs; at every epoch end after the first the tree's PSS is within soak.PSS_TOLERANCE of epoch 1's,
    and descriptors, threads, children do not move (the persistent workers' memory is in every sample)."""
    rows: list = []
    problems = soak.soak(path, data, EPOCHS, 2, 32, rows)
    assert problems == []
    assert [r["children"] for r in rows] == [0 if path.startswith("fast") else 2] * EPOCHS


def test_short_soak_fails_on_a_leak(data):
    """Keeping every batch (128 crops of 64 x 64 x 3 bytes, ~1.5 MiB an epoch, in slots the ring must add since
    the caller holds them) is a leak the PSS check names; this process's RSS spread alone stays under its 5%."""
    kept: list = []
    problems = soak.soak("fast-shards", data, EPOCHS, 2, 32, [], keep=kept)
    assert len(kept) == EPOCHS * 4
    assert any("PSS grew" in p for p in problems), problems
