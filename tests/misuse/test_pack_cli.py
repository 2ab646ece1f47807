"""The misuse suite for the write side: the CLI verbs (pack, verify, inspect, merge, doctor, bench),
``fastload.pack``, ``fastload.merge`` and packing to a URL (a real S3 server, moto, on localhost).

Each case is a mistake a user makes; each asserts an error that names the argument, file, row or field
and what was expected, no traceback, and nothing deleted or changed on disk (``unchanged``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import fastload
from fastload import Field
from fastload.cli import main

from .conftest import cli_error, unchanged, user_error

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared fixtures and servers
from conftest import jpeg_bytes, make_image_folder  # noqa: E402
from remote_common import MotoServer  # noqa: E402

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A folder a user works in: photos/ (an ImageFolder), a packed dataset, a notes file, a folder of theirs."""
    monkeypatch.chdir(tmp_path)
    make_image_folder(tmp_path / "photos", classes=2, per_class=3)
    fastload.pack(tmp_path / "photos", tmp_path / "packed", workers=0, shard_size="8KB")
    (tmp_path / "notes.txt").write_text("my notes")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("years of work")
    return tmp_path


def run(*args: str):
    return CliRunner().invoke(main, list(args))


# -- fastload pack -------------------------------------------------------------------------------------------

PACK_CASES = [
    (["nope", "out"], ["'SRC'", "nope", "does not exist"]),
    (["notes.txt", "out"], ["notes.txt", "expected a folder, .npy, .npz, .csv or .jsonl"]),
    (["photos", "out", "--format", "zip"], ["--format", "zip", "shards", "lmdb"]),
    (["photos", "out", "--part", "x"], ["--part", "'x'", "I/N"]),
    (["photos", "out", "--part", "3/3"], ["--part", "0..N-1"]),
    (["photos", "out", "--shard-size", "big"], ["--shard-size", "big", "K/M/G/T"]),
    (["photos", "out", "--parts", "2"], ["--parts", "--ray"]),
    (["photos", "out", "--max-skipped", "2"], ["--max-skipped", "0<=x<=1"]),
    (["photos", "out", "--quality", "0"], ["--quality", "1<=x<=100"]),
    (["photos", "out", "--image-mode", "passthrough", "--max-side", "64"], ["max_side", "passthrough"]),
    (["photos", "notes.txt"], ["notes.txt", "is a file, not a folder"]),
    (["photos", "mine"], ["mine", "thesis.tex", "did not write"]),
    (["photos", "mine", "--overwrite"], ["mine", "thesis.tex", "did not write"]),
    (["photos", "packed"], ["packed", "already holds a packed dataset", "--overwrite"]),
    (["photos", "photos/out"], ["photos/out", "inside the source folder"]),
    (["photos", "out", "--format", "lmdb", "--part", "0/2"], ["parts", "format='shards'"]),
]


@pytest.mark.parametrize("args, words", PACK_CASES, ids=[" ".join(a) for a, _ in PACK_CASES])
def test_pack_arguments(work, args, words):
    with unchanged(work):
        cli_error(run("pack", *args, "-q", "--workers", "0"), *words)


def test_pack_bad_data_names_the_file_row_and_column(work):
    (work / "files").mkdir()
    for i in range(3):
        (work / "files" / f"{i}.jpg").write_bytes(jpeg_bytes(20, 20, seed=i))
    (work / "m.csv").write_text("path,label\n0.jpg,0\n1.jpg,\n2.jpg,1\n")
    (work / "m.jsonl").write_text('{"path": "0.jpg", "label": 0}\n{"path": "1.jpg", "label": null}\n')
    (work / "photos" / "class_0" / "img_001.jpg").write_bytes(b"not a picture")
    (work / "photos" / "empty_class").mkdir()
    with unchanged(work):
        cli_error(run("pack", "m.csv", "out", "--root", "files", "-q"), "m.csv", "line 3", "column 'label'", "blank")
        cli_error(run("pack", "m.jsonl", "out", "--root", "files", "-q"), "m.jsonl", "line 2", "column 'label'",
                  "missing")
        cli_error(run("pack", "photos", "out", "-q"), "empty_class", "hold no image")
    (work / "photos" / "empty_class").rmdir()
    with unchanged(work / "photos"):
        cli_error(run("pack", "photos", "out", "-q", "--workers", "0"), "img_001.jpg", "--skip-bad")
        # 1 of 6 skipped is past max_skipped=0.1: refused, and the pack is left resumable, not finished
        cli_error(run("pack", "photos", "out2", "-q", "--workers", "0", "--skip-bad"), "img_001.jpg",
                  "max_skipped", "--max-skipped")
    assert not (work / "out2" / "manifest.json").exists()


# -- verify, inspect, merge, doctor, bench -------------------------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["verify", "nope"], ["'DST'", "nope", "does not exist"]),
    (["verify", "mine"], ["mine", "not a fastload dataset"]),
    (["inspect", "mine"], ["mine", "not a fastload dataset"]),
    (["inspect", "photos"], ["photos", "not a fastload dataset"]),
    (["merge", "nope"], ["'DST'", "nope", "does not exist"]),
    (["merge", "notes.txt"], ["notes.txt", "not a folder"]),
    (["merge", "mine"], ["mine", "no parts/", "--part I/N"]),
    (["merge", "packed"], ["packed", "finished dataset", "no parts/", "nothing to merge"]),
    (["doctor", "nope.py"], ["'SCRIPT'", "nope.py", "does not exist"]),
    (["doctor", "--steps", "1", "notes.txt"], ["--steps", "x>=2"]),
    (["bench", "mine"], ["mine", "not a fastload dataset"]),
    (["bench", "packed", "--batch-size", "0"], ["--batch-size", "x>=1"]),
    (["bench", "packed", "--transforms", "fancy"], ["--transforms", "fancy", "train"]),
    (["bench", "packed", "--seconds", "-1"], ["--seconds", "x>0"]),
    (["bench", "packed", "--plot", "notes.txt"], ["--plot", "notes.txt", ".png"]),
])
def test_other_verbs_arguments(work, args, words):
    with unchanged(work):
        cli_error(run(*args), *words)


def test_bench_plot_without_matplotlib_fails_before_measuring(work, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_matplotlib(name, *a, **k):
        if name.split(".")[0] == "matplotlib":
            raise ImportError("No module named 'matplotlib'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with unchanged(work):
        out = cli_error(run("bench", "packed", "--plot", "speed.png", "--seconds", "0.05"), "matplotlib",
                        "pip install")
    assert "samples/s" not in out  # refused before the measuring, not after it


def test_verify_names_the_bad_shard_and_changes_nothing(work):
    m = json.loads((work / "packed" / "manifest.json").read_text())
    shard = work / "packed" / m["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with unchanged(work):
        res = run("verify", "-q", "packed")
        assert res.exit_code == 1 and "Traceback" not in res.output
        assert m["shards"][0]["file"] in res.output and "checksum" in res.output


def test_merge_of_unfinished_or_foreign_parts(work):
    fastload.pack(work / "photos", work / "split", part=(0, 2), block=3, workers=0)
    with unchanged(work):
        cli_error(run("merge", "split"), "split/parts", "found [0]", "missing [1]")
    (work / "split" / "parts" / "1").mkdir()
    with unchanged(work):
        cli_error(run("merge", "split"), "split/parts/1", "unfinished", "--part")
    (work / "split" / "parts" / "1").rmdir()
    (work / "split" / "parts" / "extra").mkdir()
    with unchanged(work):
        cli_error(run("merge", "split"), "extra", "not a part")


# -- fastload.pack and fastload.merge in Python --------------------------------------------------------------

class Shifty(torch.utils.data.Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, i):
        return np.zeros(3 if i < 10 else 4, np.float32), i


@pytest.mark.parametrize("call, exc, words", [
    (lambda w: fastload.pack(42, w / "out"), fastload.SourceError, ["int", "expected a folder"]),
    (lambda w: fastload.pack(w / "nope", w / "out"), fastload.SourceError, ["nope", "does not exist"]),
    (lambda w: fastload.pack(w / "photos", w / "out", format="zip"), ValueError, ["format='zip'", "'shards'"]),
    (lambda w: fastload.pack(w / "photos", w / "out", quality=0), ValueError, ["quality=0", "between 1 and 100"]),
    (lambda w: fastload.pack(w / "photos", w / "out", block=0), ValueError, ["block=0", "positive"]),
    (lambda w: fastload.pack(w / "photos", w / "out", workers=-1), ValueError, ["workers=-1", ">= 0"]),
    (lambda w: fastload.pack(w / "photos", w / "out", shard_size="-5MB"), ValueError, ["shard_size='-5MB'", "unit"]),
    (lambda w: fastload.pack(w / "photos", w / "out", max_skipped=5), ValueError, ["max_skipped=5", "between 0 and 1"]),
    (lambda w: fastload.pack(w / "photos", w / "out", engine="spark"), ValueError, ["engine='spark'", "'ray'"]),
    (lambda w: fastload.pack(w / "photos", w / "out", part="a"), ValueError, ["part='a'", "I/N"]),
    (lambda w: fastload.pack(w / "photos", w / "out", image_mode="png"), ValueError, ["image_mode='png'", "auto"]),
    (lambda w: fastload.pack(w / "photos", w / "out", format="lmdb", on_shard=print), ValueError,
     ["on_shard=", "format='shards'"]),
    (lambda w: fastload.pack(w / "photos", w / "out", schema={"image": Field.int("image")}), fastload.SourceError,
     ["schema", "ImageFolder"]),
    (lambda w: fastload.pack({"x": np.zeros(3), "y": np.zeros(4)}, w / "out"), fastload.SourceError,
     ["different lengths", "'x': 3", "'y': 4"]),
    (lambda w: fastload.pack({"x": np.zeros(3)}, w / "out", schema={"z": Field.int("z")}), fastload.SourceError,
     ["unknown arrays", "'z'"]),
    (lambda w: fastload.pack([], w / "out"), fastload.SourceError, ["list", "no samples"]),
    (lambda w: fastload.pack(w / "photos", w / "mine"), fastload.FastloadError, ["mine", "thesis.tex"]),
    (lambda w: fastload.pack(w / "photos", w / "mine", overwrite=True), fastload.FastloadError, ["thesis.tex"]),
    (lambda w: fastload.pack(w / "photos", w / "notes.txt" / "out"), fastload.FastloadError, ["notes.txt", "a file"]),
    (lambda w: fastload.merge(w / "nope"), fastload.FastloadError, ["nope", "no such folder"]),
    (lambda w: fastload.merge(w / "mine"), fastload.FastloadError, ["mine", "no parts/"]),
], ids=["int", "missing", "format", "quality", "block", "workers", "shard_size", "max_skipped", "engine", "part",
        "image_mode", "on_shard", "schema-folder", "lengths", "schema-unknown", "empty", "user-folder",
        "user-folder-overwrite", "under-a-file", "merge-missing", "merge-no-parts"])
def test_python_pack_and_merge(work, call, exc, words):
    with unchanged(work):
        with user_error(exc, *words):
            call(work)


def test_a_sample_that_breaks_the_inferred_schema_is_named(work):
    """Found mid-pack: the error names the sample; what was packed so far stays resumable, never finished."""
    with unchanged(work / "photos", work / "mine", work / "packed"):
        with user_error(fastload.SourceError, "Shifty[10]", "shape", "(3,)"):
            fastload.pack(Shifty(), work / "out", workers=0)
    assert not (work / "out" / "manifest.json").exists()


def test_a_schema_mismatch_hint_never_leads_to_an_empty_dataset(work):
    data = [(np.zeros(16, np.float64), i) for i in range(10)]
    schema = {"f0": Field.ndarray("f0", "float32", (None,))}
    with unchanged(work / "photos", work / "mine", work / "packed"):
        with user_error(fastload.SourceError, "float64", "float32", "schema") as info:
            fastload.pack(data, work / "out", schema=schema, workers=0)
    assert "pass skip_bad" not in str(info.value)
    with user_error(fastload.SourceError, "max_skipped"):
        fastload.pack(data, work / "out", schema=schema, workers=0, skip_bad=True)
    assert not (work / "out" / "manifest.json").exists()


# -- packing to a URL ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def moto():
    server = MotoServer()
    server.fs().mkdir("bkt")
    yield server
    server.stop()


def test_url_mistakes(work, moto):
    opts = moto.options()
    with unchanged(work):
        with user_error(fastload.RemoteError, "s3://no-such-bucket/ds", "bucket"):
            fastload.pack(work / "photos", "s3://no-such-bucket/ds", staging=work / "stage", storage_options=opts)
        with user_error(fastload.FastloadError, str(work / "mine"), "thesis.tex", "--staging"):
            fastload.pack(work / "photos", "s3://bkt/ds", staging=work / "mine", storage_options=opts)
        with user_error(fastload.FastloadError, str(work / "notes.txt"), "not a folder"):
            fastload.pack(work / "photos", "s3://bkt/ds", staging=work / "notes.txt", storage_options=opts)
        with user_error(ValueError, "format='lmdb'", "URL", "format='shards'"):
            fastload.pack(work / "photos", "s3://bkt/ds", format="lmdb", staging=work / "stage", storage_options=opts)
        with user_error(ValueError, "part='2/2'", "0..N-1"):
            fastload.pack(work / "photos", "s3://bkt/ds", part="2/2", staging=work / "stage", storage_options=opts)
        with user_error(ValueError, "quality=500"):
            fastload.pack(work / "photos", "s3://bkt/ds", quality=500, staging=work / "stage", storage_options=opts)
    assert not moto.fs().exists("bkt/ds")


@pytest.fixture
def s3_env(moto, monkeypatch):
    """The command line reaches moto through the environment. s3fs caches its filesystems by their
    arguments (none here), so the cache is cleared on both sides: no test gets another's endpoint."""
    import s3fs

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def test_url_pack_cli_with_staging_in_the_working_folder(work, s3_env):
    """`--staging .` in a folder of the user's: refused, nothing deleted (before: the folder was emptied)."""
    with unchanged(work):
        cli_error(run("pack", "photos", "s3://bkt/cli", "--staging", ".", "-q"), "staging folder", "notes.txt",
                  "--staging")
        cli_error(run("pack", "photos", "s3://no-such-bucket/cli", "-q", "--staging", "stage"),
                  "s3://no-such-bucket/cli", "bucket")
    assert os.listdir(work)  # still the user's


def test_url_merge_without_parts(moto):
    with user_error(fastload.FastloadError, "s3://bkt/none", "no parts/"):
        fastload.merge("s3://bkt/none", storage_options=moto.options())
