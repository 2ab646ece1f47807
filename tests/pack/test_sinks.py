"""pack/_sinks.py: what a pack finds at its destination (finished, resumable, scratch, foreign files) and
the files it may remove."""

from __future__ import annotations

import pytest

import fastload
from fastload import FastloadError
from fastload.formats import shards as shards_format

from conftest import FORMATS


def test_existing_destination_is_protected(image_folder, tmp_path):
    dst = tmp_path / "out"
    fastload.pack(image_folder, dst, workers=0)
    with pytest.raises(FastloadError, match="already holds a packed dataset"):
        fastload.pack(image_folder, dst, workers=0)
    fastload.pack(image_folder, dst, workers=0, overwrite=True)
    other = tmp_path / "mine"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    with pytest.raises(FastloadError, match="precious.txt"):
        fastload.pack(image_folder, other, workers=0, overwrite=True)
    assert (other / "precious.txt").read_text() == "keep me"


def test_overwrite_removes_only_files_a_pack_writes(image_folder, tmp_path):
    dst = tmp_path / "out"
    fastload.pack(image_folder, dst, workers=0)
    (dst / "notes.tmp").mkdir()  # a folder, even one named like a temporary file, is the user's
    (dst / "notes.tmp" / "draft.txt").write_text("mine")
    with pytest.raises(FastloadError, match="notes.tmp"):
        fastload.pack(image_folder, dst, workers=0, overwrite=True)
    assert (dst / "notes.tmp" / "draft.txt").read_text() == "mine"
    (dst / "notes.tmp" / "draft.txt").unlink()
    (dst / "notes.tmp").rmdir()
    (dst / "draft.tmp").write_text("mine")  # so is a file that only ends in .tmp
    with pytest.raises(FastloadError, match="draft.tmp"):
        fastload.pack(image_folder, dst, workers=0, overwrite=True)
    assert (dst / "draft.tmp").read_text() == "mine"


def test_resume_refuses_different_parameters(image_folder, tmp_path, monkeypatch):
    kw = dict(workers=0, shard_size="2K")
    real = shards_format.write_shard
    n = {"k": 0}

    def crash_second(*a, **k):
        n["k"] += 1
        if n["k"] == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr("fastload.formats.shards.write_shard", crash_second)
    with pytest.raises(KeyboardInterrupt):
        fastload.pack(image_folder, tmp_path / "out", **kw)
    monkeypatch.undo()
    with pytest.raises(FastloadError, match="different parameters"):
        fastload.pack(image_folder, tmp_path / "out", quality=50, **kw)
    assert fastload.pack(image_folder, tmp_path / "out", **kw).samples == 12


def test_a_foreign_lmdb_database_is_never_overwritten(image_folder, tmp_path):
    """Found by the issue 17 audit: data.mdb and lock.mdb counted as a pack's own files, so --overwrite
    (which the refusal itself suggested) deleted any LMDB database in the destination."""
    import lmdb

    from misuse.conftest import unchanged

    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"user-key", b"user-value")
    env.close()
    for fmt in FORMATS:
        for overwrite in (False, True):
            with unchanged(tmp_path / "db"):
                with pytest.raises(FastloadError, match="LMDB database fastload did not write"):
                    fastload.pack(image_folder, tmp_path / "db", workers=0, format=fmt, overwrite=overwrite)
    fastload.pack(image_folder, tmp_path / "mine", workers=0, format="lmdb")  # a fastload LMDB is replaced
    fastload.pack(image_folder, tmp_path / "mine", workers=0, format="lmdb", overwrite=True)
