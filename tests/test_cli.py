"""The `fastload` command line: pack, inspect, verify, --help everywhere."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

import fastload
from fastload.cli import main


@pytest.fixture
def runner():
    return CliRunner()


@pytest.mark.parametrize("cmd", [[], ["pack"], ["inspect"], ["verify"], ["bench"]])
def test_help(runner, cmd):
    res = runner.invoke(main, cmd + ["--help"])
    assert res.exit_code == 0 and "Usage" in res.output


@pytest.mark.parametrize("fmt", ["shards", "lmdb"])
def test_pack_inspect_verify(runner, image_folder, tmp_path, fmt):
    dst = tmp_path / "out"
    res = runner.invoke(main, ["pack", str(image_folder), str(dst), "--format", fmt, "--workers", "2",
                               "--shard-size", "4K", "-q"])
    assert res.exit_code == 0, res.output
    assert "packed 12 samples" in res.output and "samples/s" in res.output
    res = runner.invoke(main, ["inspect", str(dst)])
    assert res.exit_code == 0, res.output
    assert "samples   12" in res.output and "image" in res.output and "class_0" in res.output
    storage = {"shards": r"shards    \d+, [\d.]+ MB in all\n(  shard-\S+ +\d+ samples +[\d.]+ MB  xxh3 [0-9a-f]{16}\n)+",
               "lmdb": r"lmdb      [\d.]+ MB, \d+ rows per chunk\n"}[fmt]
    assert re.search(storage, res.output), res.output
    res = runner.invoke(main, ["verify", str(dst)])
    shards = len(fastload.open(dst).manifest.shards) if fmt == "shards" else 0
    checked = f"{shards} shard(s) verified" if fmt == "shards" else "every LMDB chunk verified"
    assert res.exit_code == 0 and "OK (12 samples, " in res.output and checked in res.output, res.output
    # packing again without --overwrite refuses, with it succeeds
    res = runner.invoke(main, ["pack", str(image_folder), str(dst), "--format", fmt, "-q"])
    assert res.exit_code == 2 and "--overwrite" in res.output
    res = runner.invoke(main, ["pack", str(image_folder), str(dst), "--format", fmt, "-q", "--overwrite"])
    assert res.exit_code == 0


def test_verify_names_every_bad_shard(runner, image_folder, tmp_path):
    dst = tmp_path / "out"
    fastload.pack(image_folder, dst, shard_size="4K", workers=0)
    m = json.loads((dst / "manifest.json").read_text())
    assert len(m["shards"]) >= 3
    bad = [m["shards"][0]["file"], m["shards"][2]["file"]]
    for name in bad:
        data = bytearray((dst / name).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (dst / name).write_bytes(bytes(data))
    res = runner.invoke(main, ["verify", str(dst)])
    assert res.exit_code == 1
    for name in bad:
        assert name in res.output
    assert m["shards"][1]["file"] not in res.output


def test_skip_bad_and_errors(runner, image_folder, tmp_path):
    (image_folder / "class_0" / "broken.jpg").write_bytes(b"\xff\xd8\xff garbage")
    res = runner.invoke(main, ["pack", str(image_folder), str(tmp_path / "a"), "-q", "--workers", "0"])
    assert res.exit_code == 2 and "broken.jpg" in res.output and "--skip-bad" in res.output
    res = runner.invoke(main, ["pack", str(image_folder), str(tmp_path / "b"), "-q", "--skip-bad"])
    assert res.exit_code == 0 and "skipped 1" in res.output and "broken.jpg" in res.output
    res = runner.invoke(main, ["inspect", str(tmp_path / "nothing_here")])
    assert res.exit_code == 2
    (tmp_path / "empty").mkdir()
    res = runner.invoke(main, ["inspect", str(tmp_path / "empty")])
    assert res.exit_code == 2 and "not a fastload dataset" in res.output


def test_manifest_csv_via_cli(runner, tmp_path):
    from conftest import jpeg_bytes

    (tmp_path / "imgs").mkdir()
    lines = ["file,label"]
    for i in range(4):
        (tmp_path / "imgs" / f"{i}.jpg").write_bytes(jpeg_bytes(30, 30, seed=i))
        lines.append(f"{i}.jpg,{i}")
    (tmp_path / "m.csv").write_text("\n".join(lines) + "\n")
    res = runner.invoke(main, ["pack", str(tmp_path / "m.csv"), str(tmp_path / "out"), "--root",
                               str(tmp_path / "imgs"), "--path-column", "file", "-q"])
    assert res.exit_code == 0, res.output
    assert [s[1] for s in fastload.open(tmp_path / "out")] == [0, 1, 2, 3]


# -- issue 17 row 12: what the command line says -------------------------------------------------------------

def test_ctrl_c_during_pack_prints_the_command_that_resumes_it(runner, image_folder, tmp_path, monkeypatch):
    import shlex

    from fastload.pack import _local as _pack

    real = _pack._encoded

    def interrupted(*a, **k):
        for n, item in enumerate(real(*a, **k)):
            if n == 7:
                raise KeyboardInterrupt
            yield item

    monkeypatch.setattr(_pack, "_encoded", interrupted)
    dst = tmp_path / "my out"
    args = ["pack", str(image_folder), str(dst), "--shard-size", "4KB", "--block", "3", "--workers", "0", "-q",
            "--overwrite"]
    res = runner.invoke(main, args)
    assert res.exit_code == 130 and "Aborted!" not in res.output and "Traceback" not in res.output
    hint = res.output.strip().splitlines()[-1].strip()
    assert hint.startswith("fastload pack ") and "--overwrite" not in hint  # --overwrite would start over
    monkeypatch.undo()
    res = runner.invoke(main, shlex.split(hint)[1:])
    assert res.exit_code == 0, res.output
    assert "resumed after 6 samples" in res.output
    assert len(fastload.open(dst)) == 12


def test_an_empty_part_reports_no_shards(runner, image_folder, tmp_path):
    # 12 samples in one block of 12: part 0 of 2 gets no block at all
    res = runner.invoke(main, ["pack", str(image_folder), str(tmp_path / "out"), "--block", "12", "--part", "0/2",
                               "-q", "--workers", "0"])
    assert res.exit_code == 0, res.output
    assert "packed 0 samples" in res.output and "(0 shard(s)" in res.output


def test_verify_and_merge_show_progress(runner, image_folder, tmp_path):
    for i in range(2):
        res = runner.invoke(main, ["pack", str(image_folder), str(tmp_path / "out"), "--block", "4", "--part",
                                   f"{i}/2", "-q", "--workers", "0", "--shard-size", "4KB"])
        assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["merge", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert re.search(r"merge .*out: 100%.*shard", res.output)
    res = runner.invoke(main, ["verify", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert re.search(r"verify .*out: 100%.*12/12", res.output)
    res = runner.invoke(main, ["verify", "-q", str(tmp_path / "out")])
    assert "100%" not in res.output and "OK" in res.output


def test_missing_values_on_the_command_line(runner, tmp_path):
    from conftest import jpeg_bytes

    from fastload.cli import _command_line

    (tmp_path / "imgs").mkdir()
    for i in range(3):
        (tmp_path / "imgs" / f"{i}.jpg").write_bytes(jpeg_bytes(20, 20, seed=i))
    (tmp_path / "m.csv").write_text("path,label\n0.jpg,0\n1.jpg,\n2.jpg,2\n")
    base = ["pack", str(tmp_path / "m.csv"), str(tmp_path / "out"), "--root", str(tmp_path / "imgs"), "-q"]
    res = runner.invoke(main, base)
    assert res.exit_code == 2 and "line 3, column 'label' is blank" in res.output and "--missing label=" in res.output
    res = runner.invoke(main, base + ["--missing", "label"])
    assert res.exit_code == 2 and "'--missing'" in res.output and "COLUMN=VALUE" in res.output
    res = runner.invoke(main, base + ["--missing", "label=-1"])
    assert res.exit_code == 0, res.output
    assert [s[1] for s in fastload.open(tmp_path / "out", decode=False)] == [0, -1, 2]
    ctx = main.make_context("fastload", base + ["--missing", "label=-1", "--overwrite"])
    sub = ctx.command.get_command(ctx, "pack").make_context("pack", base[1:] + ["--missing", "label=-1"], parent=ctx)
    assert "--missing label=-1" in _command_line(sub)  # the resume hint repeats it


def test_the_resume_hint_repeats_storage_options_as_they_parse(tmp_path):
    import shlex

    from fastload.cli import _command_line, _storage_options

    given = ["anon=true", "endpoint_url=http://h:9000", "block=3", 'tag="7"']
    args = ["pack", str(tmp_path), "s3://bkt/ds", "-q"] + [w for g in given for w in ("--storage-option", g)]
    ctx = main.make_context("fastload", args)
    sub = ctx.command.get_command(ctx, "pack").make_context("pack", args[1:], parent=ctx)
    line = _command_line(sub)
    words = shlex.split(line)
    again = [words[i + 1].split("=", 1) for i, w in enumerate(words) if w == "--storage-option"]
    assert _storage_options(tuple(f"{k}={v}" for k, v in again)) == sub.params["storage_options"] == {
        "anon": True, "endpoint_url": "http://h:9000", "block": 3, "tag": "7"}
