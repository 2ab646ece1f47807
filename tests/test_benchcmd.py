"""``fastload bench`` (_benchcmd): presets, the measured report, the --plot install hint."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

import fastload
from fastload._tools import benchcmd as _benchcmd
from fastload import transforms as T
from fastload.cli import main
from fastload._schema import Field, Schema


@pytest.fixture
def runner():
    return CliRunner()


def test_bench_command(runner, image_folder, tmp_path):
    dst = tmp_path / "out"
    fastload.pack(image_folder, dst, workers=0)
    res = runner.invoke(main, ["bench", str(dst), "--batch-size", "4", "--size", "32", "--max-workers", "1",
                               "--seconds", "0.1"])
    assert res.exit_code == 0, res.output
    assert "<- fastest" in res.output and "num_workers='auto' picks this" in res.output and "decode, full size" in res.output and "copy to GPU" in res.output
    res = runner.invoke(main, ["bench", str(dst), "--transforms", "none", "--seconds", "0.1"])
    assert res.exit_code == 2 and "fast path" in res.output


SCHEMA = Schema([Field.image("photo"), Field.int("label"), Field.image("mask")])


def test_the_train_preset_crops_and_flips_every_image_field():
    got = _benchcmd.preset_transforms("train", SCHEMA, 96)
    assert list(got) == ["photo", "mask"]
    assert [type(t) for t in got["photo"]] == [T.RandomResizedCrop, T.RandomHorizontalFlip]
    assert got["photo"][0].size == (96, 96)


def test_the_val_preset_resizes_by_256_over_224_then_center_crops():
    resize, crop = _benchcmd.preset_transforms("val", SCHEMA, 224)["photo"]
    assert isinstance(resize, T.Resize) and resize.size == 256
    assert isinstance(crop, T.CenterCrop) and crop.size == (224, 224)
    assert _benchcmd.preset_transforms("val", SCHEMA, 112)["mask"][0].size == 128


def test_the_none_preset_and_an_unknown_one():
    assert _benchcmd.preset_transforms("none", SCHEMA, 224) == {}
    with pytest.raises(ValueError, match="'trian' should be one of train, val, none"):
        _benchcmd.preset_transforms("trian", SCHEMA, 224)


RESULT = {"dataset": "/data/pets", "samples": 1234, "batch_size": 32, "preset": "train",
          "rates": {0: 500.0, 2: 1800.0, 1: 1000.0}, "fastest": 2, "auto": 2,
          "split_ms": {"read bytes": 0.01, "decode, full size": 1.5}}


def test_report_lists_rates_by_thread_count_against_one_thread_and_marks_the_fastest():
    lines = _benchcmd.report(RESULT).splitlines()
    assert lines[0] == "dataset   /data/pets (1,234 samples), batch 32, transforms preset 'train'"
    rows = lines[lines.index("threads  samples/s  vs 1 thread") + 1:][:3]
    assert [r.split()[:3] for r in rows] == [["0", "500", "0.50x"], ["1", "1,000", "1.00x"], ["2", "1,800", "1.80x"]]
    assert [r.endswith("<- fastest, num_workers='auto' picks this") for r in rows] == [False, False, True]
    assert "  decode, full size" in "\n".join(lines) and lines[-1] == "copy to GPU: no CUDA device here"


def test_report_without_a_one_thread_rate_compares_with_the_best():
    r = {**RESULT, "rates": {0: 500.0, 4: 2000.0}, "fastest": 4, "auto": 4}
    del r["split_ms"]
    text = _benchcmd.report({**r, "h2d_ms_per_batch": 0.5, "h2d_gb_s": 12.3})
    assert "0.25x" in text and "1.00x   <- fastest" in text and "per sample" not in text
    assert text.endswith("copy to GPU: 0.500 ms per batch (12.3 GB/s, pinned)")


def test_plot_without_matplotlib_gives_the_install_hint_before_measuring(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(ImportError, match="--plot needs matplotlib: pip install matplotlib"):
        _benchcmd.plot_ready()
    with pytest.raises(ImportError, match="pip install matplotlib"):
        _benchcmd.plot(RESULT, str(tmp_path / "p.png"))
