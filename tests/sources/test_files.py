"""fastload/sources/_files.py and the ways Parquet and WebDataset sources are named: ``fastload.open``'s
pack-once cache, the ``fastload pack`` command, and URLs (moto's S3 server on localhost)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

import fastload
from fastload.cli import main

from misuse.conftest import user_error
from remote_common import MotoServer
from sources.test_parquet import hf_table
from sources.test_webdataset import shards


def test_open_packs_parquet_and_shards_once_into_the_cache(tmp_path, caplog, monkeypatch):
    pq.write_table(hf_table(7), tmp_path / "train.parquet", row_group_size=3)
    shards(tmp_path / "wds", n=2, per=3)
    cache = tmp_path / "cache"
    with caplog.at_level(logging.WARNING, logger="fastload"):
        ds = fastload.open(tmp_path / "train.parquet", cache_dir=cache, as_dict=True)
        wds = fastload.open(str(tmp_path / "wds" / "train-{000..001}.tar"), cache_dir=cache)
        folder = fastload.open(tmp_path / "wds", cache_dir=cache)
    said = [r.getMessage() for r in caplog.records if "packing" in r.getMessage()]
    assert len(said) == 3 and "packing parquet" in said[0] and "(7 samples)" in said[0]
    assert Path(ds.path).parent == cache / "folders" and ds.classes == ["cat", "dog", "emu"]
    assert ds[5]["caption"] == "caption 0/5" and len(wds) == len(folder) == 6 and wds.path != folder.path
    monkeypatch.setattr(fastload, "pack", lambda *a, **k: pytest.fail("packed an unchanged source again"))
    assert fastload.open(tmp_path / "train.parquet", cache_dir=cache).path == ds.path
    assert fastload.open(tmp_path / "wds", cache_dir=cache).path == folder.path
    monkeypatch.undo()
    pq.write_table(hf_table(8), tmp_path / "train.parquet")  # changed: packed again
    again = fastload.open(tmp_path / "train.parquet", cache_dir=cache)
    assert again.path != ds.path and len(again) == 8


def test_open_of_a_bad_parquet_file_names_it(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"nope")
    with user_error(fastload.FastloadError, "bad.parquet", "cannot read Parquet file"):
        fastload.open(tmp_path / "bad.parquet", cache_dir=tmp_path / "cache")


def test_the_command_packs_a_parquet_file_and_a_brace_pattern(tmp_path):
    pq.write_table(hf_table(5), tmp_path / "train.parquet")
    shards(tmp_path / "wds", n=3, per=2)
    runner = CliRunner()
    r = runner.invoke(main, ["pack", str(tmp_path / "train.parquet"), str(tmp_path / "a"), "-q", "--workers", "0"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["pack", str(tmp_path / "wds" / "train-{001..002}.tar"), str(tmp_path / "b"), "-q"])
    assert r.exit_code == 0, r.output
    assert len(fastload.open(tmp_path / "a")) == 5 and len(fastload.open(tmp_path / "b")) == 4
    r = runner.invoke(main, ["inspect", str(tmp_path / "a")])
    assert "classes   cat, dog, emu" in r.output
    r = runner.invoke(main, ["pack", str(tmp_path / "nope.parquet"), str(tmp_path / "c")])
    assert r.exit_code != 0 and "'SRC'" in r.output and "does not exist" in r.output


def same(a: tuple, b: tuple) -> bool:
    def eq(x, y) -> bool:
        if isinstance(x, (torch.Tensor, np.ndarray)):
            return x.shape == y.shape and bool((x == y).all())
        return x == y

    return len(a) == len(b) and all(eq(x, y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def moto():
    server = MotoServer()
    server.fs().mkdir("data")
    yield server
    server.stop()


@pytest.mark.timeout(240)
def test_sources_at_a_url_pack_as_their_local_copies(tmp_path, moto):
    fs = moto.fs()
    (tmp_path / "pq").mkdir()
    for k in range(2):
        pq.write_table(hf_table(4, seed=k), tmp_path / "pq" / f"train-{k:05d}-of-00002.parquet", row_group_size=3)
        fs.put_file(str(tmp_path / "pq" / f"train-{k:05d}-of-00002.parquet"),
                    f"data/hf/train-{k:05d}-of-00002.parquet")
    for f in shards(tmp_path / "wds", n=3, per=2):
        fs.put_file(str(f), f"data/wds/{f.name}")
    opts = moto.options()
    cases = [("s3://data/hf/train-00001-of-00002.parquet", tmp_path / "pq" / "train-00001-of-00002.parquet"),
             ("s3://data/hf", tmp_path / "pq"), ("s3://data/hf/*.parquet", tmp_path / "pq"),
             ("s3://data/wds/train-{000..002}.tar", tmp_path / "wds"), ("s3://data/wds", tmp_path / "wds"),
             ("s3://data/wds/train-00[01].tar", str(tmp_path / "wds" / "train-00[01].tar"))]
    for k, (url, local) in enumerate(cases):
        with pytest.warns(UserWarning, match=r"is read by one pack process, not one per core: each pack worker"):
            fastload.pack(url, tmp_path / f"r{k}", storage_options=opts, workers=2)
        fastload.pack(local, tmp_path / f"l{k}", workers=0)
        remote, here = (fastload.open(tmp_path / f"{w}{k}", decode=False) for w in "rl")
        assert len(remote) == len(here) > 0 and all(same(remote[i], here[i]) for i in range(len(here))), url
        assert remote.classes == here.classes
    with user_error(fastload.SourceError, "s3://data/nothing", "a URL source names Parquet files"):
        fastload.pack("s3://data/nothing", tmp_path / "x", storage_options=opts)
    with user_error(fastload.SourceError, "s3://data/hf/nope-*.parquet", "matches no file"):
        fastload.pack("s3://data/hf/nope-*.parquet", tmp_path / "x", storage_options=opts)


def test_sources_pickle_without_their_open_files(tmp_path):
    """A pack worker started by spawn (or a Ray task) gets the source pickled: open files and cached row groups
    stay behind, and the copy opens its own."""
    import pickle

    from fastload.sources import as_source

    pq.write_table(hf_table(7), tmp_path / "train.parquet", row_group_size=3)
    shards(tmp_path / "wds", n=2, per=3)
    for src in (as_source(tmp_path / "train.parquet"), as_source(tmp_path / "wds")):
        first = src.load(4)
        state = src.__getstate__()
        assert all(v is None for k, v in state.items() if k in ("_file", "_cached")) and state["files"]._fs is None
        copy = pickle.loads(pickle.dumps(src))
        assert same(tuple(copy.load(4)), tuple(first)) and copy.describe(4) == src.describe(4)


def test_a_symlink_loop_in_a_source_folder_reads_each_file_once(tmp_path):
    # os.walk(followlinks=True) follows a loop (d/up -> ..) until the path grows too long: every file was read
    # about 40 times over, silently; as in an ImageFolder, each real folder is read once and the link is named
    import os
    import warnings

    from fastload.sources import as_source

    shards(tmp_path / "wds" / "d", n=2, per=2)
    os.symlink("..", tmp_path / "wds" / "d" / "up")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        src = as_source(tmp_path / "wds")
    said = [str(w.message) for w in caught if "reached already" in str(w.message)]
    assert len(src) == 4 and len(src.files.paths) == 2
    assert len(said) == 1 and "a symlink loop" in said[0] and str(tmp_path / "wds" / "d" / "up") in said[0], said
    (tmp_path / "pq" / "d").mkdir(parents=True)
    pq.write_table(hf_table(3), tmp_path / "pq" / "d" / "a.parquet")
    os.symlink("..", tmp_path / "pq" / "d" / "up")
    with pytest.warns(UserWarning, match="a symlink loop"):
        assert len(as_source(tmp_path / "pq")) == 3


def test_a_file_a_pattern_reaches_twice_is_read_once(tmp_path):
    # a recursive glob follows a symlink loop too (~40 copies of each file), and a brace pattern may name one file
    # twice: each file is read once, said in one warning naming the second path
    import os

    from fastload.sources import as_source

    shards(tmp_path / "wds" / "d", n=2, per=2)
    os.symlink("..", tmp_path / "wds" / "d" / "up")
    with pytest.warns(UserWarning, match=r"a symlink loop: .*d/up -> \.\. leads to"):
        src = as_source(f"{tmp_path}/wds/**/*.tar")
    assert len(src) == 4 and len(src.files.paths) == 2
    with pytest.warns(UserWarning, match=r"reaches .* more than once"):
        assert len(as_source(f"{tmp_path}/wds/d/train-{{000,001,000}}.tar")) == 4


@pytest.mark.timeout(60)
def test_a_recursive_glob_over_two_symlink_loops_ends(tmp_path):
    # glob.glob(recursive=True) follows every link to a folder: with two loops (d/up -> .., e/up -> ..) the paths
    # double at every level down to the kernel's 40 links, so the open never ended; each real folder is walked
    # once, the rest of the pattern matched with glob's rules, and the loops named
    import os

    from fastload.sources import as_source

    shards(tmp_path / "wds" / "d", n=2, per=2)
    (tmp_path / "wds" / "e").mkdir()
    os.symlink("..", tmp_path / "wds" / "d" / "up")
    os.symlink("..", tmp_path / "wds" / "e" / "up")
    with pytest.warns(UserWarning, match=r"a symlink loop: .* \(and 1 more such link"):
        src = as_source(f"{tmp_path}/wds/**/*.tar")
    assert len(src) == 4 and [os.path.basename(p) for p in src.files.paths] == ["train-000.tar", "train-001.tar"]
    with pytest.warns(UserWarning, match="a symlink loop"):
        assert len(as_source(f"{tmp_path}/wds/*/**/train-00[01].tar")) == 4
