"""The misuse suite, issue 27 rows 3 to 6: what packing does with the user's pixels and folders, and the CLI on URLs.

- a Hugging Face ``datasets.Dataset`` of JPEG files is packed byte for byte, its ClassLabel names kept; where
  re-encoding cannot be avoided (a transform made the pixels, numpy arrays) one warning says so, with the quality;
- ``fastload verify``/``inspect``/``bench`` take a URL as ``fastload.open`` does (a real S3 server, moto, on
  localhost), with open's errors, and verify checks every shard in storage;
- a symlink loop in an image folder packs each file once and says where the loop is;
- a second pack into a folder another pack is writing is refused naming the first (its pid), whatever it is told
  (``--overwrite`` included), and a killed pack's lock does not stop the next one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import fastload
from fastload.cli import main

from .conftest import cli_error, unchanged, user_error

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared fixtures and servers
from conftest import jpeg_bytes, make_image_folder  # noqa: E402
from remote_common import MotoServer, upload  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def reencode_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "re-encoded as JPEG" in str(w.message)]


# -- row 3: a Hugging Face dataset's JPEGs are stored as they are; its class names are kept ---------------------

@pytest.fixture
def jpeg_files(tmp_path):
    """Six JPEG files larger than 65,536 pixels (pixels of that size used to be re-encoded as JPEG)."""
    paths = []
    for i in range(6):
        p = tmp_path / "files" / f"{i}.jpg"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(jpeg_bytes(300, 260, seed=i, quality=75))
        paths.append(p)
    return paths


def hf_dataset(paths, embedded: bool):
    """A real ``datasets.Dataset`` with an Image and a ClassLabel column: by path, or with the bytes embedded."""
    from datasets import ClassLabel, Dataset, Features, Image

    features = Features({"image": Image(), "label": ClassLabel(names=["cat", "dog"])})
    images = [{"bytes": p.read_bytes(), "path": None} for p in paths] if embedded else [str(p) for p in paths]
    return Dataset.from_dict({"image": images, "label": [i % 2 for i in range(len(paths))]}, features=features)


@pytest.mark.parametrize("embedded", [False, True], ids=["by-path", "embedded-bytes"])
def test_a_hugging_face_dataset_is_packed_byte_for_byte_with_its_class_names(tmp_path, jpeg_files, embedded):
    ds = hf_dataset(jpeg_files, embedded)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = fastload.pack(ds, tmp_path / "out", workers=0)
    assert not reencode_warnings(caught) and summary.reencoded == 0
    packed = fastload.open(tmp_path / "out", decode=False)
    assert [bytes(packed[i][0]) for i in range(len(packed))] == [p.read_bytes() for p in jpeg_files]
    assert [packed[i][1] for i in range(len(packed))] == [0, 1, 0, 1, 0, 1]
    assert packed.classes == ["cat", "dog"]


def test_pixels_that_must_be_re_encoded_are_said_once_with_the_quality(tmp_path, jpeg_files):
    """A transform that makes new pixels (or numpy arrays): re-encoding cannot be avoided, and is said once."""
    from PIL import Image

    def brighter(batch):
        batch["image"] = [Image.eval(img.convert("RGB"), lambda v: min(255, v + 10)) for img in batch["image"]]
        return batch

    ds = hf_dataset(jpeg_files, embedded=False).with_transform(brighter)
    with pytest.warns(UserWarning) as caught:
        summary = fastload.pack(ds, tmp_path / "hf", workers=0, quality=85)
    said = reencode_warnings(caught)
    assert len(said) == 1 and "Dataset[0]" in said[0] and "quality=85" in said[0] and "image_mode='raw'" in said[0]
    assert summary.reencoded == 6 and "re-encoded" in str(summary)

    arrays = {"image": np.random.default_rng(0).integers(0, 256, (4, 300, 260, 3), dtype=np.uint8),
              "label": np.arange(4)}
    with pytest.warns(UserWarning) as caught:  # arrays declared images: stored as pictures, not as raw arrays
        fastload.pack(arrays, tmp_path / "np", workers=0, schema={"image": fastload.Field.image("image")})
    said = reencode_warnings(caught)
    assert len(said) == 1 and "quality=90" in said[0] and "ndarray of pixels" in said[0]


# -- row 4: verify, inspect and bench take a URL -----------------------------------------------------------------

@pytest.fixture(scope="module")
def moto():
    server = MotoServer()
    server.fs().mkdir("bkt")
    yield server
    server.stop()


@pytest.fixture
def s3_photos(tmp_path, moto, monkeypatch):
    """A packed image folder uploaded to s3://bkt/<name>; the command line reaches moto through the environment."""
    import s3fs

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "cache"))
    s3fs.S3FileSystem.clear_instance_cache()
    make_image_folder(tmp_path / "photos", classes=2, per_class=3)
    fastload.pack(tmp_path / "photos", tmp_path / "packed", workers=0, shard_size="2KB")
    name = f"photos-{tmp_path.name}"
    upload(moto.fs(), tmp_path / "packed", f"bkt/{name}")
    yield f"s3://bkt/{name}", tmp_path / "packed"
    s3fs.S3FileSystem.clear_instance_cache()


def test_verify_inspect_and_bench_take_a_url(s3_photos):
    url, local = s3_photos
    m = json.loads((local / "manifest.json").read_text())
    res = run("verify", url)
    assert res.exit_code == 0, res.output
    assert f"{url}: OK (6 samples, {len(m['shards'])} shard(s) verified)" in res.output
    assert f"verify {url}" in res.output and "6/6" in res.output  # the progress bar
    res = run("inspect", url)
    assert res.exit_code == 0, res.output
    assert "samples   6" in res.output and "class_0, class_1" in res.output and m["shards"][0]["file"] in res.output
    res = run("bench", url, "--seconds", "0.05", "--max-workers", "1", "--size", "32")
    assert res.exit_code == 0, res.output
    assert "samples/s" in res.output


def test_verify_of_a_url_checks_what_is_in_storage(s3_photos, moto):
    url, local = s3_photos
    m = json.loads((local / "manifest.json").read_text())
    first, second = m["shards"][0]["file"], m["shards"][1]["file"]
    fs, key = moto.fs(), url.removeprefix("s3://")
    data = bytearray((local / first).read_bytes())
    data[-10] ^= 0xFF
    fs.pipe_file(f"{key}/{first}", bytes(data))
    fs.rm_file(f"{key}/{second}")
    res = run("verify", "-q", url)
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert f"BAD {first}: checksum" in res.output and f"BAD {second}: missing in storage" in res.output
    assert "2 problem(s) found" in res.output


def test_storage_options_on_the_command_line(s3_photos, moto, monkeypatch):
    """What fastload.open's storage_options= does, for a server the environment does not name."""
    url, _ = s3_photos
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    given = ["--storage-option", f"endpoint_url={moto.endpoint}", "--storage-option", "key=testing",
             "--storage-option", "secret=testing"]
    for verb, extra in (("verify", ["-q"]), ("inspect", []), ("bench", ["--seconds", "0.05", "--max-workers", "0"])):
        res = run(verb, url, *given, *extra)
        assert res.exit_code == 0, res.output
    cli_error(run("verify", url, "--storage-option", "anon"), "--storage-option", "'anon'", "KEY=VALUE")
    cli_error(run("inspect", ".", *given), "--storage-option", "local path")



def test_pack_and_merge_take_storage_options_on_the_command_line(s3_photos, moto, monkeypatch, tmp_path):
    """A URL source or destination that only --storage-option reaches (no endpoint in the environment)."""
    import tarfile

    url, _ = s3_photos
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    given = ["--storage-option", f"endpoint_url={moto.endpoint}", "--storage-option", "key=testing",
             "--storage-option", "secret=testing"]
    photos = tmp_path / "photos"
    dst = f"{url}-cli"
    for i in (0, 1):  # to a URL, in parts, then merged there
        res = run("pack", str(photos), dst, "-q", "--part", f"{i}/2", "--block", "2", "--staging",
                  str(tmp_path / f"stage{i}"), *given)
        assert res.exit_code == 0, res.output
    res = run("merge", dst, "-q", *given)
    assert res.exit_code == 0 and "merged" in res.output, res.output
    packed = fastload.open(dst, cache_dir=tmp_path / "c", storage_options=moto.options())
    assert len(packed) == 6 and packed.classes == ["class_0", "class_1"]
    with tarfile.open(tmp_path / "s.tar", "w") as tf:  # from a URL source
        for k in range(3):
            tf.add(photos / "class_0" / sorted(os.listdir(photos / "class_0"))[k], f"{k:04d}.jpg")
    moto.fs().put_file(str(tmp_path / "s.tar"), f"{url.removeprefix('s3://')}-src/s.tar")
    with pytest.warns(UserWarning, match="read by one pack process"):
        res = run("pack", f"{url}-src/s.tar", str(tmp_path / "from-url"), "-q", "--workers", "0", *given)
    assert res.exit_code == 0, res.output
    assert len(fastload.open(tmp_path / "from-url")) == 3
    cli_error(run("pack", str(photos), str(tmp_path / "local"), *given), "--storage-option", "local path")


def test_url_mistakes_get_open_s_errors(s3_photos):
    url, _ = s3_photos
    for verb in ("verify", "inspect", "bench"):
        cli_error(run(verb, "s3://bkt/no-such-dataset"), "s3://bkt/no-such-dataset/manifest.json",
                  "is the bucket and path right?")
        cli_error(run(verb, "s3://no-such-bucket/ds"), "s3://no-such-bucket/ds")
        cli_error(run(verb, "nope"), "'DST'", "nope", "does not exist")  # a local path still must exist


# -- row 5: a symlink loop in an image folder --------------------------------------------------------------------

def test_a_symlink_loop_packs_each_file_once_and_names_the_loop(tmp_path):
    root = make_image_folder(tmp_path / "photos", classes=2, per_class=3)
    os.symlink("..", root / "class_0" / "up")
    with unchanged(root):
        with pytest.warns(UserWarning, match="symlink loop") as caught:
            summary = fastload.pack(root, tmp_path / "out", workers=0)
    said = [str(w.message) for w in caught if "symlink loop" in str(w.message)]
    assert len(said) == 1 and str(root / "class_0" / "up") in said[0] and "-> .." in said[0]
    assert summary.samples == 6
    ds = fastload.open(tmp_path / "out")
    assert [ds[i][1] for i in range(6)] == [0, 0, 0, 1, 1, 1] and ds.classes == ["class_0", "class_1"]


# -- row 6: one writer per folder ---------------------------------------------------------------------------------

HOLDER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import fastload

    class Waiting:
        '''40 samples; from sample 20 on, each waits for the release file (the pack holds its folder meanwhile).'''
        def __len__(self):
            return 40

        def __getitem__(self, i):
            while i >= 20 and not os.path.exists(sys.argv[2]):
                time.sleep(0.02)
            return np.full(4, i, np.float32), i

    fastload.pack(Waiting(), sys.argv[1], workers=0, block=4, shard_size="1KB")
""")


@pytest.fixture
def holder(tmp_path):
    """A pack in another process, stopped half-way into tmp_path/ds (shards written, no manifest) until released."""
    dst, release = tmp_path / "ds", tmp_path / "release"
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    env = dict(os.environ, PYTHONPATH=str(Path(fastload.__file__).parents[1]))
    proc = subprocess.Popen([sys.executable, str(script), str(dst), str(release)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (dst / "shard-00016.fls").exists():  # the shard of samples 16-19: it waits at sample 20 now
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the holder pack did not start"
        time.sleep(0.05)
    time.sleep(0.2)
    yield proc, dst, release
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_a_second_pack_into_a_folder_being_written_is_refused_naming_the_first(tmp_path, holder, monkeypatch):
    proc, dst, release = holder
    photos = make_image_folder(tmp_path / "photos", classes=2, per_class=3)
    with unchanged(dst):
        for overwrite in (False, True):
            with user_error(fastload.FastloadError, f"another fastload pack (pid {proc.pid}) is writing {dst}"):
                fastload.pack(photos, dst, workers=0, overwrite=overwrite)
        monkeypatch.chdir(tmp_path)
        cli_error(run("pack", "photos", "ds", "-q", "--overwrite"), f"another fastload pack (pid {proc.pid})",
                  "is writing ds")
    release.touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    ds = fastload.open(dst)
    assert len(ds) == 40 and [int(ds[i][1]) for i in (0, 39)] == [0, 39]
    assert not (dst / ".fastload-pack.lock").exists()  # a finished pack leaves no lock behind


def test_a_killed_pack_does_not_lock_its_folder(tmp_path, holder):
    proc, dst, _ = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (dst / ".fastload-pack.lock").exists()  # left behind, but no longer held: the kernel released it
    photos = make_image_folder(tmp_path / "photos", classes=2, per_class=3)
    with user_error(fastload.FastloadError, "unfinished pack with different parameters", "--overwrite"):
        fastload.pack(photos, dst, workers=0)  # the usual answer for another's unfinished pack, not a lock error
    summary = fastload.pack(photos, dst, workers=0, overwrite=True)
    assert summary.samples == 6 and len(fastload.open(dst)) == 6
    assert sorted(os.listdir(dst)) == ["manifest.json", "shard-00000.fls"]
