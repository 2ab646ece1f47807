"""Packing to object storage (pack/_upload.py) and merging parts there, against moto's S3 server."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

import fastload
from fastload import RemoteError
from fastload.cli import main
from fastload.pack import _upload as upload_mod

from conftest import make_image_folder
from misuse.conftest import unchanged, user_error
from remote_common import KEY, SECRET, MotoServer

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def moto():
    server = MotoServer()
    fs = server.fs()
    for b in ("upl", "again", "parts", "clib", "stg"):
        fs.mkdir(b)
    yield server
    server.stop()


@pytest.fixture
def photos(tmp_path):
    return make_image_folder(tmp_path / "photos", classes=3, per_class=8)


KW = dict(shard_size="12KB", block=6, workers=1)


def remote_files(fs, prefix: str) -> dict[str, bytes]:
    fs.invalidate_cache()  # s3fs caches listings
    return {p.rsplit("/", 1)[-1]: fs.cat_file(p) for p in fs.find(prefix)}


def local_files(path) -> dict[str, bytes]:
    return {n: (path / n).read_bytes() for n in os.listdir(path)}


def test_pack_to_s3_uploads_the_local_pack_manifest_last(moto, photos, tmp_path, monkeypatch):
    fastload.pack(photos, tmp_path / "local", **KW)
    order = []
    put = upload_mod.Uploader._put
    monkeypatch.setattr(upload_mod.Uploader, "_put", lambda self, path: (put(self, path), order.append(path.name)))
    real_finish = upload_mod.Uploader.finish

    def finish(self, names, folder):
        real_finish(self, names, folder)
        order.append("manifest.json")
        # at the moment the manifest goes up, every shard is there
        assert set(names) <= set(remote_files(self.fs, "upl/ds"))

    monkeypatch.setattr(upload_mod.Uploader, "finish", finish)
    summary = fastload.pack(photos, "s3://upl/ds", staging=tmp_path / "stage",
                            storage_options=moto.options(), **KW)
    fs = moto.fs()
    assert remote_files(fs, "upl/ds") == local_files(tmp_path / "local")
    assert order[-1] == "manifest.json" and len(order) == summary.shards + 1
    assert not (tmp_path / "stage").exists()  # staging is removed once the manifest is up
    ds = fastload.open("s3://upl/ds", cache_dir=tmp_path / "cache", storage_options=moto.options())
    assert [ds[i][1] for i in range(len(ds))] == [fastload.open(tmp_path / "local")[i][1] for i in range(len(ds))]
    with pytest.raises(fastload.FastloadError, match="already holds a packed dataset"):
        fastload.pack(photos, "s3://upl/ds", staging=tmp_path / "stage", storage_options=moto.options(), **KW)


def test_an_interrupted_upload_is_never_a_dataset_and_resumes(moto, photos, tmp_path, monkeypatch):
    fastload.pack(photos, tmp_path / "local", **KW)
    put = upload_mod.Uploader._put
    calls = []

    def failing(self, path):
        calls.append(path.name)
        if len(calls) == 3:
            raise RemoteError("connection lost (simulated)")
        put(self, path)

    monkeypatch.setattr(upload_mod.Uploader, "_put", failing)
    with pytest.raises(RemoteError, match="simulated"):
        fastload.pack(photos, "s3://again/ds", staging=tmp_path / "stage", storage_options=moto.options(), **KW)
    fs = moto.fs()
    assert "manifest.json" not in remote_files(fs, "again/ds")
    with pytest.raises(RemoteError, match="manifest"):  # readers see no dataset, not half of one
        fastload.open("s3://again/ds", cache_dir=tmp_path / "cache", storage_options=moto.options())
    record = json.loads((tmp_path / "stage" / "uploaded.json").read_text())
    assert len(record) >= 1
    uploaders = []
    monkeypatch.setattr(upload_mod.Uploader, "_put", lambda self, p: (uploaders.append(self), put(self, p)))
    fastload.pack(photos, "s3://again/ds", staging=tmp_path / "stage", storage_options=moto.options(), **KW)
    assert remote_files(fs, "again/ds") == local_files(tmp_path / "local")
    shards = len(local_files(tmp_path / "local")) - 1
    assert uploaders[0].uploaded == shards - len(record)  # what was up already is not sent again
    assert not (tmp_path / "stage").exists()


def test_parts_to_s3_merge_server_side(moto, photos, tmp_path):
    fastload.pack(photos, tmp_path / "local", **KW)
    for i in range(3):
        fastload.pack(photos, "s3://parts/ds", part=(i, 3), staging=tmp_path / f"stage{i}",
                      storage_options=moto.options(), **KW)
    fs = moto.fs()
    assert "manifest.json" not in [p.rsplit("/", 1)[-1] for p in fs.ls("parts/ds", detail=False)]
    fastload.merge("s3://parts/ds", storage_options=moto.options())
    assert remote_files(fs, "parts/ds") == local_files(tmp_path / "local")


def test_cli_pack_to_s3(moto, photos, tmp_path, monkeypatch):
    import s3fs

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    # s3fs caches filesystems by their arguments (none here): one built from another test's environment
    # (another endpoint) would be reused, and this test's must not outlive it
    monkeypatch.setattr(s3fs.S3FileSystem, "_cache", {})
    fastload.pack(photos, tmp_path / "local", **KW)
    res = CliRunner().invoke(main, ["pack", str(photos), "s3://clib/ds", "--shard-size", "12KB", "--block", "6",
                                    "--workers", "1", "-q", "--staging", str(tmp_path / "stage")])
    assert res.exit_code == 0, res.output
    assert "s3://clib/ds" in res.output
    assert remote_files(moto.fs(), "clib/ds") == local_files(tmp_path / "local")


# -- the staging folder is fastload's own; resume is keyed by content; the URL is checked first ---------------

def test_a_staging_folder_holding_user_files_is_refused_and_kept(moto, photos, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    (mine / "data").mkdir()
    (mine / "data" / "x.csv").write_text("1,2\n")
    with unchanged(mine):
        with user_error(fastload.FastloadError, str(mine), "thesis.tex", "--staging"):
            fastload.pack(photos, "s3://stg/a", staging=mine, storage_options=moto.options(), **KW)
    assert not moto.fs().exists("stg/a/manifest.json")


def test_staging_removes_only_what_the_pack_wrote(moto, photos, tmp_path):
    empty = tmp_path / "empty"  # given empty: emptied again, but kept (fastload did not create it)
    empty.mkdir()
    fastload.pack(photos, "s3://stg/b", staging=empty, storage_options=moto.options(), **KW)
    assert empty.is_dir() and os.listdir(empty) == []
    new = tmp_path / "new" / "stage"  # created by fastload: removed
    fastload.pack(photos, "s3://stg/c", staging=new, storage_options=moto.options(), **KW)
    assert not new.exists()
    ds = fastload.open("s3://stg/c", cache_dir=tmp_path / "cache", storage_options=moto.options())
    assert len(ds) == 24


def test_a_file_added_to_a_staging_folder_survives(moto, photos, tmp_path, monkeypatch):
    stage = tmp_path / "stage"
    real_finish = upload_mod.Uploader.finish

    def finish(self, names, folder):  # the user drops a file into the staging folder mid-pack
        (stage / "notes.txt").write_text("mine")
        (stage / "pack" / "keep.me").write_text("mine too")
        real_finish(self, names, folder)

    monkeypatch.setattr(upload_mod.Uploader, "finish", finish)
    fastload.pack(photos, "s3://stg/d", staging=stage, storage_options=moto.options(), **KW)
    assert (stage / "notes.txt").read_text() == "mine" and (stage / "pack" / "keep.me").read_text() == "mine too"
    assert sorted(os.listdir(stage / "pack")) == ["keep.me"]  # the staged shards and manifest are gone


def test_a_staging_folder_of_another_url_is_refused(moto, photos, tmp_path, monkeypatch):
    stage = tmp_path / "stage"
    monkeypatch.setattr(upload_mod.Uploader, "finish", lambda self, names, folder: (_ for _ in ()).throw(
        RemoteError("connection lost (simulated)")))
    with pytest.raises(RemoteError):
        fastload.pack(photos, "s3://stg/e", staging=stage, storage_options=moto.options(), **KW)
    monkeypatch.undo()
    with unchanged(stage):
        with user_error(fastload.FastloadError, str(stage), "s3://stg/e", "s3://stg/f"):
            fastload.pack(photos, "s3://stg/f", staging=stage, storage_options=moto.options(), **KW)


def test_url_resume_is_keyed_by_the_source(moto, photos, tmp_path, monkeypatch):
    """Issue 17 row 2: a staged pack of source A whose upload failed is never uploaded for source B."""
    other = make_image_folder(tmp_path / "other", classes=2, per_class=5, seed=7)
    fastload.pack(photos, tmp_path / "local", **KW)
    stage = tmp_path / "stage"
    monkeypatch.setattr(upload_mod.Uploader, "finish", lambda self, names, folder: (_ for _ in ()).throw(
        RemoteError("connection lost (simulated)")))
    with pytest.raises(RemoteError, match="simulated"):  # A is packed and staged, its manifest never went up
        fastload.pack(photos, "s3://stg/g", staging=stage, storage_options=moto.options(), **KW)
    monkeypatch.undo()
    with unchanged(stage):
        with user_error(fastload.FastloadError, str(stage), "different source", "--overwrite"):
            fastload.pack(other, "s3://stg/g", staging=stage, storage_options=moto.options(), **KW)
    assert "manifest.json" not in remote_files(moto.fs(), "stg/g")
    # with --overwrite the staged pack of A is discarded and B is packed
    fastload.pack(other, "s3://stg/g", staging=stage, overwrite=True, storage_options=moto.options(), **KW)
    ds = fastload.open("s3://stg/g", cache_dir=tmp_path / "cache", storage_options=moto.options())
    assert len(ds) == 10 and ds.classes == ["class_0", "class_1"]
    # the same source resumes: A staged, upload failed, then A again finishes the upload
    monkeypatch.setattr(upload_mod.Uploader, "finish", lambda self, names, folder: (_ for _ in ()).throw(
        RemoteError("connection lost (simulated)")))
    with pytest.raises(RemoteError):
        fastload.pack(photos, "s3://stg/h", staging=stage, storage_options=moto.options(), **KW)
    monkeypatch.undo()
    summary = fastload.pack(photos, "s3://stg/h", staging=stage, storage_options=moto.options(), **KW)
    assert summary.resumed_from == 24 and "pack pack" not in str(summary)
    assert remote_files(moto.fs(), "stg/h") == local_files(tmp_path / "local")
    assert not stage.exists()


def test_a_missing_bucket_fails_before_anything_is_packed(moto, photos, tmp_path, monkeypatch):
    from fastload.pack import _local as _pack

    encoded = []
    real = _pack._encoded
    monkeypatch.setattr(_pack, "_encoded", lambda *a, **k: (encoded.append(1), real(*a, **k))[1])
    with unchanged(tmp_path):
        with user_error(RemoteError, "s3://no-such-bucket/ds", "bucket"):
            fastload.pack(photos, "s3://no-such-bucket/ds", staging=tmp_path / "stage",
                          storage_options=moto.options(), **KW)
    assert not encoded and not (tmp_path / "stage").exists()


def test_the_progress_bar_names_the_url(moto, photos, tmp_path, capsys):
    fastload.pack(photos, "s3://stg/lbl", staging=tmp_path / "stage", storage_options=moto.options(),
                  progress=True, **KW)
    err = capsys.readouterr().err
    assert "pack s3://stg/lbl" in err and "pack pack" not in err


def test_the_default_staging_folder_is_created_marked_and_removed(moto, photos, tmp_path, monkeypatch):
    monkeypatch.delenv("FASTLOAD_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    stage = upload_mod.default_staging("s3://stg/dflt")
    assert tmp_path / "xdg" in stage.parents
    calls = []
    real_finish = upload_mod.Uploader.finish

    def finish(self, names, folder):
        calls.append(json.loads((stage / upload_mod.MARK).read_text()))
        real_finish(self, names, folder)

    monkeypatch.setattr(upload_mod.Uploader, "finish", finish)
    fastload.pack(photos, "s3://stg/dflt", storage_options=moto.options(), **KW)
    assert calls == [{"url": "s3://stg/dflt", "created": True}] and not stage.exists()
