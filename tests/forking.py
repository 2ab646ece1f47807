"""Running test code in a forked child: for reads that used to crash and for packs killed mid-way."""

from __future__ import annotations

import os
import signal
import time
import traceback


def in_child(fn, *, kill_after: float | None = None) -> int:
    """Run ``fn()`` in a forked child; return its wait status as an exit code (-9: SIGKILL).
    ``kill_after``: the parent SIGKILLs it after that many seconds if it is still running."""
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        code = 0
        try:
            fn()
        except BaseException:
            traceback.print_exc()
            code = 3
        finally:
            os._exit(code)
    if kill_after is not None:
        time.sleep(kill_after)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
