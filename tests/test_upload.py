"""Packing to object storage (formats/upload.py) and merging parts there, against moto's S3 server."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

import fastload
from fastload import RemoteError
from fastload.cli import main
from fastload.formats import upload as upload_mod

from conftest import make_image_folder
from remote_common import KEY, SECRET, MotoServer

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def moto():
    server = MotoServer()
    fs = server.fs()
    for b in ("upl", "again", "parts", "clib"):
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
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    fastload.pack(photos, tmp_path / "local", **KW)
    res = CliRunner().invoke(main, ["pack", str(photos), "s3://clib/ds", "--shard-size", "12KB", "--block", "6",
                                    "--workers", "1", "-q", "--staging", str(tmp_path / "stage")])
    assert res.exit_code == 0, res.output
    assert "s3://clib/ds" in res.output
    assert remote_files(moto.fs(), "clib/ds") == local_files(tmp_path / "local")
