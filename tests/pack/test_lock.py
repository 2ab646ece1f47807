"""fastload/pack/_lock.py: one writer per destination folder (issue 27 row 6). The cross-process cases (a pack
in another process, killed with SIGKILL) are in tests/misuse/test_pack_safety.py; here the lock itself."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload.pack._lock import LOCK_NAME, remove_if_free, writer_lock
from fastload.pack._sinks import remove_pack


def test_one_holder_per_folder_in_a_process_too(tmp_path):
    dest = tmp_path / "new" / "ds"
    with writer_lock(dest, "s3://bkt/ds"):
        assert (dest / LOCK_NAME).read_text().split()[0] == str(os.getpid())
        caught = []

        def other():
            try:
                with writer_lock(dest, "s3://bkt/ds"):
                    pass
            except fastload.FastloadError as e:
                caught.append(str(e))

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert len(caught) == 1 and f"another fastload pack (pid {os.getpid()}, this process)" in caught[0]
        assert "is writing s3://bkt/ds" in caught[0]
        with pytest.raises(fastload.FastloadError, match=f"another fastload pack \\(pid {os.getpid()}"):
            fastload.pack(np.arange(4), dest, workers=0)
        assert os.listdir(dest) == [LOCK_NAME]  # the refused pack wrote nothing
    assert not (dest / LOCK_NAME).exists()  # released and removed
    fastload.pack(np.arange(4), dest, workers=0)  # and free again
    assert sorted(os.listdir(dest)) == ["manifest.json", "shard-00000.fls"]


def test_a_dead_holder_s_lock_file_is_taken_over_and_cleaned_up(tmp_path):
    dest = tmp_path / "ds"
    code = ("import sys, os, signal; from pathlib import Path; from fastload.pack._lock import writer_lock\n"
            "with writer_lock(Path(sys.argv[1])):\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    env = dict(os.environ, PYTHONPATH=str(Path(fastload.__file__).parents[1]))
    proc = subprocess.run([sys.executable, "-c", code, str(dest)], env=env)
    assert proc.returncode == -9 and (dest / LOCK_NAME).exists()
    remove_if_free(dest / LOCK_NAME)  # nobody holds it: removed
    assert not (dest / LOCK_NAME).exists()
    with writer_lock(dest):
        remove_if_free(dest / LOCK_NAME)  # held: left alone
        remove_pack(dest)                 # nor does a clean-up of pack files touch it
        assert (dest / LOCK_NAME).exists()


def test_a_forked_child_does_not_keep_a_killed_holder_s_lock(tmp_path):
    # a pack's worker processes are forked while it holds the lock; killed with SIGKILL, the pack leaves them
    # orphaned (blocked on their task queue): they must not hold its flock, or every later pack is refused
    # naming the dead pack's pid
    dest = tmp_path / "ds"
    code = ("import sys, os, signal, time; from pathlib import Path; from fastload.pack._lock import writer_lock\n"
            "with writer_lock(Path(sys.argv[1])):\n"
            "    child = os.fork()\n"
            "    if child == 0:\n"
            "        os.close(1), os.close(2)  # the test reads the holder's output to its end\n"
            "        time.sleep(120)\n"
            "        os._exit(0)\n"
            "    print(child, flush=True)\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    env = dict(os.environ, PYTHONPATH=str(Path(fastload.__file__).parents[1]))
    proc = subprocess.run([sys.executable, "-c", code, str(dest)], env=env, capture_output=True, text=True)
    child = int(proc.stdout.split()[0])
    try:
        assert proc.returncode == -9 and os.path.exists(f"/proc/{child}")  # the holder is dead, its child alive
        with writer_lock(dest):
            pass
        fastload.pack(np.arange(4), dest, workers=0)
    finally:
        os.kill(child, 9)
