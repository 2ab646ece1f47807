"""The benchmark suite's peers: one module per data-loading library, run by ``bench/suite.py``.

Each peer module runs in its own virtual environment (``bench/.venvs/<venv>``, made by
``bench/setup_peers.sh``; fastload and nothing else runs in the project's ``.venv``) as a subprocess::

    PYTHONPATH=bench <venv>/bin/python -m peers check PEER        # versions, or a non-zero exit
    PYTHONPATH=bench <venv>/bin/python -m peers run SPEC.json     # one measurement, JSON on stdout

A module defines ``check() -> dict`` (library versions) and ``run(spec) -> dict`` (see ``_common.py``
for the spec and the measurements). This file only names them; it imports nothing heavy.
"""

from __future__ import annotations

#: peer name -> (module, venv under bench/.venvs/, or None for the project's .venv, label in tables)
PEERS: dict[str, tuple[str, str | None, str]] = {
    "fastload": ("fastload_peer", None, "fastload"),
    "torch-simd": ("torch_peer", "torch-simd", "torch DataLoader + pillow-simd"),
    "torch-pillow": ("torch_peer", "torch-pillow", "torch DataLoader + pillow"),
    "dali": ("dali_peer", "dali", "NVIDIA DALI (CPU)"),
    "ffcv": ("ffcv_peer", "ffcv", "FFCV"),
    "wds": ("wds_peer", "wds", "WebDataset"),
    "litdata": ("litdata_peer", "litdata", "LitData"),
}
