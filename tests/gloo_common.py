"""What the tests under real torch.distributed share (test_distributed.py, test_elastic_dist.py): ``run_ranks``
starts the ranks of a gloo group on localhost as spawned processes, runs a test's function in each and returns
what each rank's function returned; a hung or failed rank fails the test instead of hanging it."""

from __future__ import annotations

import faulthandler
import multiprocessing
import queue
import socket
import sys
from collections.abc import Callable
from typing import Any

import pytest

# seconds a rank may take (about 10 on a quiet machine, 60-90 at load 6; pytest's limit is 300), then it prints
# its stack and exits
RANK_LIMIT = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(body: Callable[..., Any], rank: int, world: int, port: int, limit: float, args: tuple, out) -> None:
    import torch.distributed as dist

    # A stuck rank prints every thread's stack to stderr (pytest shows it) and exits, so a hang fails here,
    # well inside pytest's timeout, instead of leaving processes for the interpreter's exit to wait on.
    faulthandler.dump_traceback_later(limit, exit=True, file=sys.stderr)
    # The workers fork, as they do under torchrun (whose ranks are fresh interpreters). A spawned rank would
    # spawn its workers too: two fresh interpreters importing torch per epoch, 30 per rank in test_distributed,
    # which under load took minutes (each rank seen "waiting in _get" while its workers still imported torch).
    multiprocessing.set_start_method("fork", force=True)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        out.put((rank, body(rank, *args)))
    finally:
        dist.destroy_process_group()


def run_ranks(body: Callable[..., Any], world: int, *args, limit: float = RANK_LIMIT) -> dict[int, Any]:
    """``{rank: body(rank, *args)}`` over ``world`` spawned processes joined in a gloo group. ``body`` must be a
    module-level function (the spawned ranks import it) and return something picklable."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(body, r, world, port, limit, args, out)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        got: dict[int, Any] = {}
        while len(got) < len(procs):
            try:
                got.update([out.get(timeout=1)])
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    codes = {r: p.exitcode for r, p in enumerate(procs)}
                    pytest.fail(f"a rank failed (exit codes {codes}); its stack or error is in the captured stderr")
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    finally:  # never leave a rank behind: the interpreter would wait for it at exit
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    return got
