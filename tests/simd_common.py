"""Runs a probe script under several FASTLOAD_SIMD levels, each in its own process (the level is read once, when the
native module loads), and gives what each printed: the tests that hold a kernel's SIMD and portable versions to the
same bytes compare the digests their probes print."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import fastload


def simd_digest(probe: str, level: str | None, cwd: str | None = None) -> str:
    """What ``probe`` prints (stripped) when run with FASTLOAD_SIMD=``level`` (unset: the widest the CPU has), with
    ``cwd`` (the probe's test folder, to import its helpers from), tests/ and this process's fastload first on the
    path. Fails the test, with the probe's stderr, where the probe does not exit 0."""
    env = {k: v for k, v in os.environ.items() if k != "FASTLOAD_SIMD"}
    tests = os.path.dirname(os.path.abspath(__file__))
    package = os.path.dirname(os.path.dirname(os.path.abspath(fastload.__file__)))
    paths = ([cwd] if cwd else []) + [tests, package]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    if level:
        env["FASTLOAD_SIMD"] = level
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=cwd or tests, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, f"FASTLOAD_SIMD={level}: exit {out.returncode}\n{out.stderr[-2000:]}"
    return out.stdout.strip()


def assert_simd_levels_agree(probe: str, levels=("scalar",), cwd: str | None = None) -> None:
    """The probe prints one sha256 hex digest, the same under the widest kernels and under each of ``levels``."""
    widest = simd_digest(probe, None, cwd)
    assert len(widest) == len(hashlib.sha256().hexdigest()), f"the probe printed {widest!r}, not a sha256 digest"
    for level in levels:
        assert simd_digest(probe, level, cwd) == widest, f"FASTLOAD_SIMD={level} writes other bytes than the widest"
