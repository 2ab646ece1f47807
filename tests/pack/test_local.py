"""fastload.pack: both formats, resume, skip-bad, overwrite (each source adapter: test_sources.py; image modes
and value encoding: test_encode.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload import Field, FormatError, SourceError
from fastload.formats import shards as shards_format

from conftest import FORMATS, dir_bytes, make_image_folder, pil_rgb


@pytest.mark.parametrize("fmt", FORMATS)
def test_image_folder_round_trip_passthrough(image_folder, tmp_path, fmt):
    dst = tmp_path / "out"
    summary = fastload.pack(image_folder, dst, format=fmt, image_mode="passthrough", workers=2, shard_size="8K")
    assert summary.samples == 12 and not summary.skipped
    ds = fastload.open(dst)
    assert len(ds) == 12 and ds.classes == ["class_0", "class_1", "class_2"]
    assert ds.schema.names == ("image", "label")
    files = sorted(image_folder.rglob("*.jpg"))
    raw = fastload.open(dst, decode=False)
    for i, path in enumerate(files):  # torchvision order: class, then file name
        img, label = ds[i]
        assert label == int(path.parent.name.split("_")[1])
        assert raw[i][0] == path.read_bytes()  # passthrough is byte for byte
        ref = pil_rgb(path.read_bytes())
        assert img.shape == (3,) + ref.shape[:2] and img.dtype == torch.uint8
        assert np.abs(img.permute(1, 2, 0).numpy().astype(int) - ref).mean() < 1.0


def test_schema_mismatch_names_sample(tmp_path):
    class Shifty(torch.utils.data.Dataset):
        def __len__(self):
            return 20

        def __getitem__(self, i):
            return (np.zeros(3 if i < 10 else 4, dtype=np.float32), i)

    with pytest.raises(SourceError, match=r"Shifty\[10\].*shape"):
        fastload.pack(Shifty(), tmp_path / "a", workers=0)
    fastload.pack(Shifty(), tmp_path / "b", workers=0, schema={"f0": Field.ndarray("f0", np.float32, (None,))})
    assert fastload.open(tmp_path / "b")[15][0].shape == (4,)


def test_bad_source_file_stops_or_is_skipped(image_folder, tmp_path):
    bad = image_folder / "class_1" / "img_002.jpg"
    bad.write_bytes(bad.read_bytes()[:200])  # truncated JPEG
    (image_folder / "class_2" / "zz.png").write_bytes(b"not a png at all")
    with pytest.raises(SourceError, match="img_002.jpg"):
        fastload.pack(image_folder, tmp_path / "a", workers=2)
    summary = fastload.pack(image_folder, tmp_path / "b", workers=2, skip_bad=True, max_skipped=0.2)  # 2 of 13
    assert summary.samples == 11 and len(summary.skipped) == 2
    assert "img_002.jpg" in str(summary) and "zz.png" in str(summary)
    m = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert sorted(Path(s["source"]).name for s in m["skipped"]) == ["img_002.jpg", "zz.png"]
    assert len(fastload.open(tmp_path / "b")) == 11


def test_skip_bad_never_packs_an_empty_or_mostly_empty_dataset(image_folder, tmp_path):
    files = sorted(image_folder.rglob("*.jpg"))
    for f in files[:3]:  # 3 of 12 = 25%: past the default max_skipped=0.1
        f.write_bytes(b"not a picture")
    with pytest.raises(SourceError, match=r"max_skipped=0.1 .*of the 12 samples.*--max-skipped"):
        fastload.pack(image_folder, tmp_path / "a", workers=0, skip_bad=True)
    assert not (tmp_path / "a" / "manifest.json").exists()  # nothing is marked finished
    summary = fastload.pack(image_folder, tmp_path / "a", workers=0, skip_bad=True, max_skipped=0.3)  # resumes
    assert summary.samples == 9 and len(summary.skipped) == 3
    for f in files:
        f.write_bytes(b"not a picture")
    with pytest.raises(SourceError, match=r"every one of the 12 samples.*empty"):
        fastload.pack(image_folder, tmp_path / "b", workers=0, skip_bad=True, max_skipped=1.0)
    assert not (tmp_path / "b" / "manifest.json").exists()
    with pytest.raises(ValueError, match="max_skipped=2"):
        fastload.pack(image_folder, tmp_path / "c", workers=0, skip_bad=True, max_skipped=2)
    assert not (tmp_path / "c").exists()


def test_a_schema_error_never_hints_skip_bad(tmp_path):
    """The README's schema override on float64 data: every sample fails alike, so skipping them all is no
    fix; the error says to make data and schema agree, and skip_bad=True fails instead of packing nothing."""
    data = [(np.zeros(128, np.float64), i) for i in range(20)]
    schema = {"f0": Field.ndarray("f0", "float32", (None, 128))}
    with pytest.raises(SourceError) as info:
        fastload.pack(data, tmp_path / "a", workers=0, schema=schema)
    assert "skip_bad" not in str(info.value).replace("skip_bad would skip", "") and "schema" in str(info.value)
    with pytest.raises(SourceError, match="max_skipped"):
        fastload.pack(data, tmp_path / "b", workers=0, schema=schema, skip_bad=True)
    assert not (tmp_path / "b" / "manifest.json").exists()


@pytest.mark.parametrize("fmt", FORMATS)
def test_resume_after_crash_gives_identical_content(tmp_path, monkeypatch, fmt):
    from fastload.formats import lmdb as lmdb_format

    folder = make_image_folder(tmp_path / "src", classes=2, per_class=30)
    kw = dict(format=fmt, workers=2, shard_size="12K", image_mode="jpeg", quality=80)
    monkeypatch.setattr(lmdb_format, "DEFAULT_ROWS_PER_CHUNK", 8)
    fastload.pack(folder, tmp_path / "ref", **kw)

    # crash (as an exception escaping the writer) when the fourth shard / chunk is being written
    target = (shards_format, "write_shard") if fmt == "shards" else (lmdb_format.LmdbWriter, "write_chunk")
    real = getattr(*target)
    calls = {"n": 0}

    def crashing(*a, **k):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt("simulated kill")
        return real(*a, **k)

    if fmt == "shards":
        monkeypatch.setattr("fastload.formats.shards.write_shard", crashing)
    else:
        monkeypatch.setattr(lmdb_format.LmdbWriter, "write_chunk", crashing)
    with pytest.raises(KeyboardInterrupt):
        fastload.pack(folder, tmp_path / "out", **kw)
    with pytest.raises(FormatError, match="unfinished pack"):
        fastload.open(tmp_path / "out")
    if fmt == "shards":
        monkeypatch.setattr("fastload.formats.shards.write_shard", real)
    else:
        monkeypatch.setattr(lmdb_format.LmdbWriter, "write_chunk", real)
    summary = fastload.pack(folder, tmp_path / "out", **kw)
    assert summary.resumed_from > 0
    if fmt == "shards":
        assert dir_bytes(tmp_path / "out") == dir_bytes(tmp_path / "ref")
    ref, out = fastload.open(tmp_path / "ref", decode=False), fastload.open(tmp_path / "out", decode=False)
    assert len(ref) == len(out) == 60
    assert all(ref[i] == out[i] for i in range(60))


def test_sigkill_during_pack_then_resume(tmp_path):
    folder = make_image_folder(tmp_path / "src", classes=2, per_class=60)
    args = [sys.executable, "-m", "fastload.cli", "pack", str(folder), str(tmp_path / "out"), "--shard-size", "4K",
            "--image-mode", "jpeg", "--workers", "1", "-q"]
    subprocess.run(args[:5] + [str(tmp_path / "ref")] + args[6:], check=True)
    proc = subprocess.Popen(args)
    deadline = time.time() + 60
    while not list((tmp_path / "out").glob("shard-0000[3-9].fls")) and time.time() < deadline:
        if proc.poll() is not None:
            pytest.skip("pack finished before it could be killed")
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if (tmp_path / "out" / "manifest.json").exists():
        pytest.skip("pack finished before it could be killed")
    with pytest.raises(FormatError):
        fastload.open(tmp_path / "out")
    subprocess.run(args, check=True)
    assert dir_bytes(tmp_path / "out") == dir_bytes(tmp_path / "ref")


def test_ctrl_c_during_pack_prints_a_resume_command_that_resumes(tmp_path):
    """A real SIGINT with worker processes running (issue 17 row 12): exit 130, the exact command to resume
    (not click's bare 'Aborted!'), and that command finishes the pack byte for byte."""
    import shlex

    folder = make_image_folder(tmp_path / "src", classes=2, per_class=60)
    args = [sys.executable, "-m", "fastload.cli", "pack", str(folder), str(tmp_path / "out"), "--shard-size", "4K",
            "--image-mode", "jpeg", "--workers", "2", "-q"]
    subprocess.run(args[:5] + [str(tmp_path / "ref")] + args[6:], check=True)
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not list((tmp_path / "out").glob("shard-0000[3-9].fls")) and time.time() < deadline:
        if proc.poll() is not None:
            pytest.skip("pack finished before it could be interrupted")
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    if (tmp_path / "out" / "manifest.json").exists():
        pytest.skip("pack finished before it could be interrupted")
    assert proc.returncode == 130 and "Aborted!" not in err and "Traceback" not in err, err
    hint = shlex.split(err.strip().splitlines()[-1])
    assert hint[:2] == ["fastload", "pack"]
    subprocess.run([sys.executable, "-m", "fastload.cli"] + hint[1:], check=True)
    assert dir_bytes(tmp_path / "out") == dir_bytes(tmp_path / "ref")


def test_array_pack_is_columnar_and_checks_overrides(tmp_path):
    x = np.arange(5000 * 6, dtype=np.uint8).reshape(5000, 6)
    y = np.arange(5000, dtype=np.int32)
    s = fastload.pack({"x": x, "y": y}, tmp_path / "a", shard_size="8K")
    assert s.shards > 1
    ds = fastload.open(tmp_path / "a")
    assert all(np.array_equal(ds[i][0].numpy(), x[i]) and ds[i][1] == i for i in (0, 1234, 4999))
    with pytest.raises(SourceError, match="without loss"):
        fastload.pack({"x": x.astype(np.float64)}, tmp_path / "b", schema={"x": Field.ndarray("x", np.float32, (6,))})
    with pytest.raises(SourceError, match="rows of shape"):
        fastload.pack({"x": x}, tmp_path / "c", schema={"x": Field.ndarray("x", np.uint8, (3, 2))})


