"""fastload/_front/folder_cache.py: ``fastload.open`` on an unpacked ImageFolder packs it once into a cache keyed by the
folder's content (saying where, with a progress bar), reopens the pack while the folder is unchanged, packs a
changed folder again and removes the old pack once nothing reads it; ``cache_dir=`` and ``$FASTLOAD_CACHE_DIR``
choose the place; processes opening the folder at once pack it once; any other path with no dataset says
the ``fastload pack`` command."""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import fastload
import fastload._front.folder_cache as folder_cache

from conftest import jpeg_bytes, make_image_folder
from misuse.conftest import unchanged, user_error

PACKING = "packing image folder"


def entries(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "folders").iterdir() if p.is_dir())


def same_samples(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(a[i][0], b[i][0]) and a[i][1] == b[i][1] for i in range(len(a)))


def test_an_image_folder_is_packed_once_and_reopened(tmp_path, caplog, capsys, monkeypatch):
    folder = make_image_folder(tmp_path / "photos")
    fastload.pack(folder, tmp_path / "direct", workers=0)
    with caplog.at_level(logging.WARNING, logger="fastload"):
        ds = fastload.open(folder, cache_dir=tmp_path / "cache")
    [entry] = entries(tmp_path / "cache")
    assert Path(ds.path) == tmp_path / "cache" / "folders" / entry and entry.startswith("photos-")
    said = [r.getMessage() for r in caplog.records if PACKING in r.getMessage()]
    assert len(said) == 1 and str(ds.path) in said[0] and str(folder) in said[0]
    assert "12/12" in capsys.readouterr().err  # tqdm's progress bar
    direct = fastload.open(tmp_path / "direct")
    assert same_samples(ds, direct) and ds.classes == direct.classes == ["class_0", "class_1", "class_2"]
    monkeypatch.setattr(fastload, "pack", lambda *a, **k: pytest.fail("packed an unchanged folder again"))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fastload"):
        again = fastload.open(folder, cache_dir=tmp_path / "cache", as_dict=True)
    assert again.path == ds.path and again[3]["label"] == direct[3][1] and not caplog.records


def test_the_environment_variable_chooses_the_place(tmp_path, monkeypatch):
    folder = make_image_folder(tmp_path / "photos", classes=2, per_class=2)
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "env"))
    ds = fastload.open(folder)
    assert Path(ds.path).parent == tmp_path / "env" / "folders"
    monkeypatch.delenv("FASTLOAD_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert Path(fastload.open(folder).path).parent == tmp_path / "xdg" / "fastload" / "folders"


def test_a_changed_folder_is_packed_again_and_the_old_pack_goes_once_unread(tmp_path):
    folder = make_image_folder(tmp_path / "photos", classes=2, per_class=3)
    cache = tmp_path / "cache"
    first = fastload.open(folder, cache_dir=cache)
    (folder / "class_1" / "img_new.jpg").write_bytes(jpeg_bytes(50, 60, seed=9))
    second = fastload.open(folder, cache_dir=cache)
    assert len(first) == 6 and len(second) == 7 and first.path != second.path
    assert len(entries(cache)) == 2  # `first` still reads the old pack: it stays
    assert first[5][1] == 1  # and is still readable
    os.utime(folder / "class_0" / "img_000.jpg", ns=(1, 1))  # a touched file is a change too
    del first
    third = fastload.open(folder, cache_dir=cache)
    assert third.path not in (second.path,) and len(entries(cache)) == 2  # the unread first pack is gone
    assert Path(second.path).name in entries(cache) and Path(third.path).name in entries(cache)


def test_an_interrupted_open_leaves_nothing_locked(tmp_path, monkeypatch):
    folder = make_image_folder(tmp_path / "photos", classes=2, per_class=2)
    real = folder_cache._pack

    def interrupted(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(folder_cache, "_pack", interrupted)
    with pytest.raises(KeyboardInterrupt) as info:  # kept, as a notebook keeps sys.last_traceback
        fastload.open(folder, cache_dir=tmp_path / "cache")
    [lock] = (tmp_path / "cache" / "folders").glob("*.lock")
    with open(lock) as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: another process would not wait for ever
    monkeypatch.setattr(folder_cache, "_pack", real)
    assert len(fastload.open(folder, cache_dir=tmp_path / "cache")) == 4 and info.value is not None


OPEN_IN_A_PROCESS = """
import sys, time, pathlib, fastload, fastload._front.folder_cache as fc
real = fc._pack
def slow(*a):  # holds the pack's lock a while, so that the others certainly meet it
    time.sleep(1.5)
    real(*a)
fc._pack = slow
go = pathlib.Path(sys.argv[3])
while not go.exists():
    time.sleep(0.01)
ds = fastload.open(sys.argv[1], cache_dir=sys.argv[2])
print(ds.path, len(ds), sum(ds[i][1] for i in range(len(ds))))
"""


def test_processes_opening_at_once_pack_once_and_never_read_half_a_pack(tmp_path):
    folder = make_image_folder(tmp_path / "photos", classes=3, per_class=20)
    env = dict(os.environ, PYTHONPATH=str(Path(fastload.__file__).parent.parent))
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_IN_A_PROCESS, str(folder), str(tmp_path / "cache"), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(3)]
    time.sleep(3)  # imports done: all three open at once
    go.touch()
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [e for _, e in outs]
    assert len({o for o, _ in outs}) == 1 and outs[0][0].split()[1:] == ["60", "60"]  # labels 0..2, 20 each
    assert sum(e.count(PACKING) for _, e in outs) == 1


def test_a_path_with_no_dataset_says_how_to_pack_it(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "a.jpg").write_bytes(jpeg_bytes(20, 20))
    table = tmp_path / "labels.csv"
    table.write_text("path,label\na.jpg,1\n")
    with unchanged(tmp_path):
        with user_error(fastload.FormatError, str(flat), "not an ImageFolder", "no class subdirectories",
                        f"fastload pack files.csv {tmp_path / 'flat_packed'} --root {flat}"):
            fastload.open(flat, cache_dir=tmp_path / "cache")
        with user_error(fastload.FormatError, f"fastload pack {table} {tmp_path / 'labels_packed'}",
                        f"fastload.open('{tmp_path / 'labels_packed'}')"):
            fastload.open(table)
        with user_error(fastload.FormatError, f"'{tmp_path / 'nothing'}' does not exist"):
            fastload.open(tmp_path / "nothing")


def test_a_bad_image_names_the_file_and_the_command_with_skip_bad(tmp_path):
    folder = make_image_folder(tmp_path / "photos", classes=2, per_class=2)
    (folder / "class_0" / "broken.jpg").write_bytes(b"not a jpeg")
    with user_error(fastload.SourceError, "broken.jpg", f"fastload pack {folder} {folder}_packed --skip-bad"):
        fastload.open(folder, cache_dir=tmp_path / "cache")


def test_a_folder_dataset_closes_its_lease_when_it_is_collected(tmp_path):
    # the lease is an open lock file: left to the file object's own collection, it was never closed while any
    # reference to it lived, and warned "unclosed file" (ResourceWarning) when collected
    import gc

    root = make_image_folder(tmp_path / "photos", classes=2, per_class=2)
    ds = fastload.open(root, cache_dir=tmp_path / "c")
    lease = ds._lease
    assert lease is not None and not lease.closed
    del ds
    gc.collect()
    assert lease.closed
