"""Packing in parts (pack/_parts.py): `pack --part I/N` + `merge` give the single-machine pack byte for byte;
the parts as Ray tasks: test_ray.py."""

from __future__ import annotations

import os

import numpy as np
import pytest
from click.testing import CliRunner

import fastload
from fastload import FastloadError
from fastload.pack._parts import part_span
from fastload.cli import main

from conftest import make_image_folder

from .conftest import KW, identical, photo_folder


def test_part_spans_cover_the_source_in_whole_blocks():
    for n, unit, parts in [(0, 4, 3), (10, 4, 3), (101, 7, 5), (5, 10, 4), (64, 8, 8)]:
        spans = [part_span(n, unit, i, parts) for i in range(parts)]
        assert spans[0][0] == 0 and spans[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        assert all(lo % unit == 0 for lo, hi in spans if lo < n)


@pytest.mark.parametrize("parts", [1, 3, 4])
def test_parts_merge_into_the_single_machine_pack(tmp_path, parts):
    src = photo_folder(tmp_path / "photos")
    single = fastload.pack(src, tmp_path / "single", **KW)
    assert single.skipped and single.shards > 3  # the case is not trivial: blocks, skips, several shards
    for i in reversed(range(parts)):  # any order
        fastload.pack(src, tmp_path / "multi", part=(i, parts), **KW)
    merged = fastload.merge(tmp_path / "multi")
    assert identical(tmp_path / "single", tmp_path / "multi")
    assert merged.num_samples == single.samples and not (tmp_path / "multi" / "parts").exists()


def test_array_sources_split_on_shard_rows(tmp_path):
    arrays = {"x": np.arange(3000 * 3, dtype=np.float32).reshape(3000, 3), "y": np.arange(3000)}
    fastload.pack(arrays, tmp_path / "single", shard_size="4KB")
    for i in range(5):
        fastload.pack(arrays, tmp_path / "multi", shard_size="4KB", part=f"{i}/5")
    fastload.merge(tmp_path / "multi")
    assert identical(tmp_path / "single", tmp_path / "multi")
    assert len(os.listdir(tmp_path / "single")) > 5


def test_block_boundaries_are_part_of_the_single_machine_pack(tmp_path):
    # without blocks, where a shard ends depends on every sample before it, and no part could know it
    src = make_image_folder(tmp_path / "photos", classes=2, per_class=6)
    fastload.pack(src, tmp_path / "ds", shard_size="1GB", block=4, workers=1)
    ds = fastload.open(tmp_path / "ds")
    assert [e.file for e in ds.manifest.shards] == ["shard-00000.fls", "shard-00004.fls", "shard-00008.fls"]
    assert [e.num_samples for e in ds.manifest.shards] == [4, 4, 4]


def test_merge_refuses_missing_unfinished_and_foreign_parts(tmp_path):
    src = photo_folder(tmp_path / "photos")
    fastload.pack(src, tmp_path / "m", part=(0, 3), **KW)
    fastload.pack(src, tmp_path / "m", part=(2, 3), **KW)
    with pytest.raises(FastloadError, match=r"split into 3 parts; found \[0, 2\], missing \[1\]"):
        fastload.merge(tmp_path / "m")
    (tmp_path / "m" / "parts" / "1").mkdir()
    with pytest.raises(FastloadError, match="part .*1 is unfinished"):
        fastload.merge(tmp_path / "m")
    (tmp_path / "m" / "parts" / "1").rmdir()
    fastload.pack(src, tmp_path / "m", part=(1, 3), **(KW | {"quality": 50, "image_mode": "jpeg"}))
    with pytest.raises(FastloadError, match="different source or settings"):
        fastload.merge(tmp_path / "m")
    with pytest.raises(ValueError, match="I must be in 0..N-1"):
        fastload.pack(src, tmp_path / "x", part="3/3")
    with pytest.raises(ValueError, match="needs format='shards'"):
        fastload.pack(src, tmp_path / "x", part="0/3", format="lmdb")


def test_merge_finishes_after_an_interruption(tmp_path):
    src = photo_folder(tmp_path / "photos")
    fastload.pack(src, tmp_path / "single", **KW)
    for i in range(2):
        fastload.pack(src, tmp_path / "m", part=(i, 2), **KW)
    first = next(p for p in sorted((tmp_path / "m" / "parts" / "0").iterdir()) if p.suffix == ".fls")
    os.replace(first, tmp_path / "m" / first.name)  # a merge killed after moving one shard
    fastload.merge(tmp_path / "m")
    assert identical(tmp_path / "single", tmp_path / "m")


def test_merge_removes_only_the_parts_own_files(tmp_path):
    """Issue 17 row 1 (audit): merge used shutil.rmtree on DST/parts, taking anything a user kept there."""
    src = photo_folder(tmp_path / "photos")
    fastload.pack(src, tmp_path / "single", **KW)
    for i in range(2):
        fastload.pack(src, tmp_path / "m", part=(i, 2), **KW)
    (tmp_path / "m" / "parts" / "1" / "log.txt").write_text("the cluster job's log")
    fastload.merge(tmp_path / "m")
    assert (tmp_path / "m" / "parts" / "1" / "log.txt").read_text() == "the cluster job's log"
    assert sorted(os.listdir(tmp_path / "m" / "parts")) == ["1"]  # part 0, emptied, is gone
    assert os.listdir(tmp_path / "m" / "parts" / "1") == ["log.txt"]
    (tmp_path / "m" / "parts" / "1" / "log.txt").unlink()
    (tmp_path / "m" / "parts" / "1").rmdir()
    (tmp_path / "m" / "parts").rmdir()
    assert identical(tmp_path / "single", tmp_path / "m")


def test_cli_part_merge_verify(tmp_path):
    src = photo_folder(tmp_path / "photos")
    runner = CliRunner()
    common = ["--shard-size", "12KB", "--block", "5", "--skip-bad", "--workers", "1", "-q"]
    for i in range(2):
        res = runner.invoke(main, ["pack", str(src), str(tmp_path / "m"), "--part", f"{i}/2"] + common)
        assert res.exit_code == 0, res.output
        assert "fastload merge" in res.output
    res = runner.invoke(main, ["merge", str(tmp_path / "m")])
    assert res.exit_code == 0 and "merged" in res.output, res.output
    res = runner.invoke(main, ["verify", str(tmp_path / "m")])
    assert res.exit_code == 0 and "OK" in res.output, res.output
    res = runner.invoke(main, ["pack", str(src), str(tmp_path / "single")] + common)
    assert res.exit_code == 0, res.output
    assert identical(tmp_path / "single", tmp_path / "m")
    res = runner.invoke(main, ["pack", str(src), str(tmp_path / "z"), "--part", "2"] + common)
    assert res.exit_code == 2 and "I/N" in res.output


def test_merge_never_replaces_another_dataset(tmp_path):
    src = photo_folder(tmp_path / "photos")
    other = make_image_folder(tmp_path / "other", classes=2, per_class=3, seed=5)
    fastload.pack(other, tmp_path / "m", **KW)  # a finished dataset at DST
    for i in range(2):
        fastload.pack(src, tmp_path / "m", part=(i, 2), **KW)
    from misuse.conftest import unchanged

    with unchanged(tmp_path / "m"):
        with pytest.raises(FastloadError, match="already holds a packed dataset other than these parts"):
            fastload.merge(tmp_path / "m")
    (tmp_path / "m" / "manifest.json").unlink()  # now an unfinished pack of the other folder sits at DST
    (tmp_path / "m" / "pack_state.json").write_text("{}")
    with unchanged(tmp_path / "m"):
        with pytest.raises(FastloadError, match="holds an unfinished pack"):
            fastload.merge(tmp_path / "m")


@pytest.mark.parametrize("edit, message", [
    (lambda doc: doc["shards"][0].update(num_samples=doc["shards"][0]["num_samples"] + 1),
     r"part '.*parts/1': shards hold \d+ samples, num_samples says"),
    (lambda doc: doc.update(layout="lmdb"), r"parts/0: layout 'lmdb' is not one packed in parts"),
])
def test_merge_checks_the_parts_manifests_as_their_format_does(tmp_path, edit, message):
    """A part's manifest gets its format's own checks (the shards' sample count), and parts of a layout that
    is not packed in parts are refused; nothing is moved."""
    import json

    src = photo_folder(tmp_path / "photos")
    for i in range(2):
        fastload.pack(src, tmp_path / "m", part=(i, 2), **KW)
    victim = tmp_path / "m" / "parts" / ("1" if "shards hold" in message else "0") / "manifest.json"
    for part in ("0", "1"):
        if (tmp_path / "m" / "parts" / part / "manifest.json") == victim or "layout" in message:
            path = tmp_path / "m" / "parts" / part / "manifest.json"
            doc = json.loads(path.read_text())
            edit(doc)
            path.write_text(json.dumps(doc))
    before = sorted(p.relative_to(tmp_path / "m") for p in (tmp_path / "m").rglob("*"))
    with pytest.raises(FastloadError, match=message):
        fastload.merge(tmp_path / "m")
    assert sorted(p.relative_to(tmp_path / "m") for p in (tmp_path / "m").rglob("*")) == before
