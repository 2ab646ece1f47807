"""pack/_ray.py: the parts of a pack as Ray tasks on a local Ray cluster, merged byte for byte."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import fastload
from fastload import FastloadError
from fastload.cli import main

from .conftest import KW, identical, photo_folder


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ray_packs_parts_and_merges_byte_for_byte(tmp_path, ray_cluster):
    src = photo_folder(tmp_path / "photos")
    fastload.pack(src, tmp_path / "single", **KW)
    summary = fastload.pack(src, tmp_path / "ray", engine="ray", parts=3, **KW)
    assert identical(tmp_path / "single", tmp_path / "ray")
    assert summary.samples == fastload.open(tmp_path / "single").manifest.num_samples
    res = CliRunner().invoke(main, ["verify", str(tmp_path / "ray")])
    assert res.exit_code == 0 and "OK" in res.output, res.output
    # --overwrite replaces the dataset's own files only (it used to shutil.rmtree the whole destination)
    (tmp_path / "ray" / "notes.txt").write_text("mine")
    with pytest.raises(FastloadError, match="notes.txt"):
        fastload.pack(src, tmp_path / "ray", engine="ray", parts=3, overwrite=True, **KW)
    assert (tmp_path / "ray" / "notes.txt").read_text() == "mine"
    # the command line, on the running cluster, with the cluster's CPU count as the number of parts
    res = CliRunner().invoke(main, ["pack", str(src), str(tmp_path / "cli"), "--ray", "--shard-size", "12KB",
                                    "--block", "5", "--skip-bad", "-q"])
    assert res.exit_code == 0, res.output
    assert identical(tmp_path / "single", tmp_path / "cli")
