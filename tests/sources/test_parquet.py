"""fastload/sources/parquet.py: Parquet files (Hugging Face's layout among them) as a source -- built here with
pyarrow, packed and read back: image bytes stored untouched, ClassLabel names kept, columns as fields, files
found by folder and glob, and every bad input refused naming its file, row or column."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

import fastload
from fastload import SourceError
from fastload.sources import ParquetSource, as_source

from conftest import FORMATS, jpeg_bytes

MEDIA = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def png_bytes(h: int, w: int, seed: int) -> bytes:
    arr = np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def hf_table(n: int, seed: int = 0, names=("cat", "dog", "emu"), image=None) -> pa.Table:
    """A table as Hugging Face ``datasets`` writes one: an Image struct, a ClassLabel, and other columns."""
    features = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": list(names)},
                "caption": {"_type": "Value", "dtype": "string"}}
    schema = pa.schema([("image", MEDIA), ("label", pa.int64()), ("caption", pa.string()), ("score", pa.float32()),
                        ("flag", pa.bool_()), ("emb", pa.list_(pa.float32(), 3)), ("tokens", pa.list_(pa.int32())),
                        ("grid", pa.list_(pa.list_(pa.int16())))],
                       metadata={"huggingface": json.dumps({"info": {"features": features}})})
    image = image or (lambda i: jpeg_bytes(30 + i % 7, 40, seed=seed * 1000 + i))
    rows = range(n)
    return pa.table({
        "image": [{"bytes": image(i), "path": f"img_{i}.jpg"} for i in rows],
        "label": [(seed + i) % len(names) for i in rows],
        "caption": [f"caption {seed}/{i}" for i in rows],
        "score": [i / 4 for i in rows],
        "flag": [i % 2 == 0 for i in rows],
        "emb": [[i, i + 0.5, -i] for i in rows],
        "tokens": [list(range(i % 5)) for i in rows],
        "grid": [[[i, 1], [2, 3]] for i in rows],
    }, schema=schema)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("workers", [0, 2])
def test_hugging_face_parquet_packs_its_bytes_untouched_and_keeps_class_names(tmp_path, fmt, workers):
    table = hf_table(23)
    pq.write_table(table, tmp_path / "train.parquet", row_group_size=5)  # 5 row groups, the last short
    fastload.pack(tmp_path / "train.parquet", tmp_path / "ds", format=fmt, workers=workers)
    ds = fastload.open(tmp_path / "ds", as_dict=True)
    raw = fastload.open(tmp_path / "ds", as_dict=True, decode=False)
    assert len(ds) == 23 and ds.classes == ["cat", "dog", "emu"]
    assert [(f.name, f.kind) for f in ds.schema] == [("image", "image"), ("label", "int"), ("caption", "str"),
                                                     ("score", "float"), ("flag", "int"), ("emb", "ndarray"),
                                                     ("tokens", "ndarray"), ("grid", "ndarray")]
    assert ds.schema["emb"].shape == (3,) and ds.schema["tokens"].shape == (None,)
    rows = table.to_pylist()
    for i in (0, 4, 5, 17, 22):
        row, got = rows[i], ds[i]
        assert raw[i]["image"] == row["image"]["bytes"]  # the JPEG byte for byte
        assert got["label"] == row["label"] and got["caption"] == row["caption"] and got["score"] == row["score"]
        assert got["flag"] == int(row["flag"])
        assert torch.equal(got["emb"], torch.tensor(row["emb"], dtype=torch.float32))
        assert torch.equal(got["tokens"], torch.tensor(row["tokens"], dtype=torch.int32))
        assert torch.equal(got["grid"], torch.tensor(row["grid"], dtype=torch.int16))


def test_pixels_equal_the_source(tmp_path):
    """A PNG's pixels come back exactly (lossless: stored as its pixels); a JPEG's as the source's JPEG
    decoded by the same decoder (its bytes are stored untouched)."""
    pngs = {i: png_bytes(20 + i, 24, seed=i) for i in range(6)}
    pq.write_table(hf_table(6, image=pngs.__getitem__), tmp_path / "png.parquet", row_group_size=4)
    ds = fastload.open(fastload.pack(tmp_path / "png.parquet", tmp_path / "png", workers=0).dest, as_dict=True)
    for i, data in pngs.items():
        want = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        assert np.array_equal(ds[i]["image"].permute(1, 2, 0).numpy(), want)
    pq.write_table(hf_table(4), tmp_path / "jpg.parquet")
    fastload.pack(tmp_path / "jpg.parquet", tmp_path / "jpg", workers=0)
    image_folder = tmp_path / "folder" / "a"
    image_folder.mkdir(parents=True)
    for i, row in enumerate(hf_table(4).to_pylist()):
        (image_folder / f"{i}.jpg").write_bytes(row["image"]["bytes"])
    from_folder = fastload.open(fastload.pack(tmp_path / "folder", tmp_path / "f", workers=0).dest)
    from_parquet = fastload.open(tmp_path / "jpg")
    for i in range(4):
        assert torch.equal(from_parquet[i][0], from_folder[i][0])


def test_files_without_hugging_face_metadata_are_read_by_their_values(tmp_path):
    """A binary column of pictures is an image field; other bytes (an audio struct too) stay bytes, untouched."""
    pngs = [png_bytes(8, 8, seed=i) for i in range(3)]
    blobs = [bytes([i]) * 5 for i in range(3)]
    audio = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"picture": pngs, "blob": blobs, "wav": pa.array([{"bytes": b"RIFF" + b, "path": None}
                                                                         for b in blobs], audio),
                      "label name": ["a", "b", "c"], "n": pa.array([1, 2, 3], pa.uint8())})
    pq.write_table(table, tmp_path / "x.parquet")
    src = as_source(tmp_path / "x.parquet")
    assert [(f.name, f.kind) for f in src.schema] == [("picture", "image"), ("blob", "bytes"), ("wav", "bytes"),
                                                      ("_label_name", "str"), ("n", "int")]
    assert src.metadata.get("classes") is None
    fastload.pack(src, tmp_path / "ds", workers=0)
    ds = fastload.open(tmp_path / "ds", as_dict=True)
    assert ds[1]["blob"] == blobs[1] and ds[2]["wav"] == b"RIFF" + blobs[2] and ds[0]["_label_name"] == "a"
    hf = {"info": {"features": {"wav": {"_type": "Audio", "sampling_rate": 16000}, "picture": {"_type": "Value",
                                                                                               "dtype": "binary"}}}}
    pq.write_table(table.replace_schema_metadata({"huggingface": json.dumps(hf)}), tmp_path / "hf.parquet")
    assert as_source(tmp_path / "hf.parquet").schema["picture"].kind == "bytes"  # the feature says bytes


def test_a_folder_and_a_glob_of_files_are_one_source_in_name_order(tmp_path):
    data = tmp_path / "repo" / "data"
    data.mkdir(parents=True)
    for k in range(3):
        pq.write_table(hf_table(4 + k, seed=k), data / f"train-{k:05d}-of-00003.parquet", row_group_size=3)
    (tmp_path / "repo" / "README.md").write_text("a dataset card")
    src = as_source(tmp_path / "repo")  # the folder: found below it
    assert isinstance(src, ParquetSource) and len(src) == 4 + 5 + 6
    assert src.describe(4) == f"{data / 'train-00001-of-00003.parquet'} row 0"
    assert src.load(4)[2] == "caption 1/0" and src.load(14)[2] == "caption 2/5"
    glob = as_source(str(data / "train-0000[02]-*.parquet"))
    assert len(glob) == 4 + 6 and glob.load(4)[2] == "caption 2/0"
    fastload.pack(str(data / "*.parquet"), tmp_path / "ds", workers=0, shard_size="8KB")
    assert [fastload.open(tmp_path / "ds")[i][2] for i in (0, 4, 9, 14)] == \
        ["caption 0/0", "caption 1/0", "caption 2/0", "caption 2/5"]


def test_a_folder_of_several_splits_is_refused_naming_one(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(hf_table(3), data / "train-00000-of-00001.parquet")
    pq.write_table(hf_table(2), data / "test-00000-of-00001.parquet")
    with pytest.raises(SourceError, match=r"holds the splits test, train .* e.g. '.*data/test\*\.parquet'"):
        as_source(data)
    assert len(as_source(str(data / "train*.parquet"))) == 3
    nested = tmp_path / "nested"
    for split in ("train", "validation"):
        (nested / split).mkdir(parents=True)
        pq.write_table(hf_table(2), nested / split / "0000.parquet")
    with pytest.raises(SourceError, match=r"holds the splits train, validation .* e.g. '.*nested/train'"):
        as_source(nested)
    assert len(as_source(nested / "train")) == 2


def test_bad_files_and_columns_are_refused_naming_them(tmp_path):
    pq.write_table(hf_table(3), tmp_path / "a.parquet")
    other = hf_table(3).drop_columns(["score"])
    (tmp_path / "more").mkdir()
    pq.write_table(hf_table(3), tmp_path / "more" / "a.parquet")
    pq.write_table(other, tmp_path / "more" / "b.parquet")
    with pytest.raises(SourceError, match=r"Parquet file .*more/b.parquet has columns \[image: .*but .*a.parquet"):
        as_source(tmp_path / "more")
    (tmp_path / "classes").mkdir()
    pq.write_table(hf_table(3), tmp_path / "classes" / "a.parquet")
    pq.write_table(hf_table(3, names=("cat", "dog", "fox")), tmp_path / "classes" / "b.parquet")
    with pytest.raises(SourceError, match=r"b.parquet names its classes \['cat', 'dog', 'fox'\], but .*a.parquet "
                                          r"\['cat', 'dog', 'emu'\]"):
        as_source(tmp_path / "classes")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(SourceError, match=r"cannot read Parquet file .*junk.parquet"):
        as_source(tmp_path / "junk.parquet")
    pq.write_table(pa.table({"t": pa.array([1, 2], pa.timestamp("s"))}), tmp_path / "ts.parquet")
    with pytest.raises(SourceError, match=r"column 't' is of type timestamp\[ms\], which fastload has no field"):
        as_source(tmp_path / "ts.parquet")
    with pytest.raises(SourceError, match="does not exist"):
        as_source(tmp_path / "nope.parquet")
    with pytest.raises(SourceError, match="matches no file"):
        as_source(str(tmp_path / "nope-*.parquet"))
    with pytest.raises(SourceError, match="schema= and missing= are not supported for ParquetSource"):
        fastload.pack(tmp_path / "a.parquet", tmp_path / "out", schema={"label": fastload.Field.float("label")})


def _with_null(table: pa.Table, column: str, row: int) -> pa.Table:
    values = table.column(column).to_pylist()
    values[row] = None
    return table.set_column(table.schema.get_field_index(column), column,
                            pa.array(values, table.schema.field(column).type))


def test_a_null_image_fails_at_open_naming_its_file_and_row(tmp_path):
    pq.write_table(hf_table(9), tmp_path / "a.parquet")
    pq.write_table(_with_null(hf_table(9), "image", 7), tmp_path / "b.parquet", row_group_size=4)
    with pytest.raises(SourceError, match=r"b.parquet row 7: column 'image' is null \(no image bytes\)"):
        as_source(tmp_path)
    bytes_only = hf_table(3)
    values = bytes_only.column("image").to_pylist()
    values[1] = {"bytes": None, "path": "elsewhere.jpg"}  # a path the file does not embed
    bytes_only = bytes_only.set_column(0, "image", pa.array(values, MEDIA))
    pq.write_table(bytes_only, tmp_path / "c.parquet")
    with pytest.raises(SourceError, match=r"c.parquet row 1: column 'image' is null"):
        as_source(tmp_path / "c.parquet")


def test_nulls_without_statistics_fail_when_packed_naming_the_row(tmp_path):
    """Files written without statistics: the null is found when its row is read, and named; --skip-bad skips it."""
    table = _with_null(_with_null(hf_table(12), "label", 5), "tokens", 9)
    values = table.column("grid").to_pylist()
    values[2] = [[1, None], [2, 3]]  # a null inside a list: no array either
    table = table.set_column(table.schema.get_field_index("grid"), "grid",
                             pa.array(values, table.schema.field("grid").type))
    pq.write_table(table, tmp_path / "a.parquet", write_statistics=False, row_group_size=4)
    src = as_source(tmp_path / "a.parquet")
    with pytest.raises(SourceError, match=r"a.parquet row 2: ValueError: column 'grid' is null"):
        fastload.pack(src, tmp_path / "ds", workers=0)
    summary = fastload.pack(src, tmp_path / "ds2", workers=0, skip_bad=True, max_skipped=0.5)
    assert [(s["index"], s["source"].rsplit("/", 1)[1]) for s in summary.skipped] == \
        [(2, "a.parquet row 2"), (5, "a.parquet row 5"), (9, "a.parquet row 9")]
    pq.write_table(table, tmp_path / "b.parquet", row_group_size=4)  # with statistics: at open
    with pytest.raises(SourceError, match=r"b.parquet row 2: column 'grid' is null"):
        as_source(tmp_path / "b.parquet")


def test_a_ragged_nested_list_is_refused_naming_its_row(tmp_path):
    table = pa.table({"grid": pa.array([[[1, 2], [3, 4]], [[1, 2], [3]]], pa.list_(pa.list_(pa.int64())))})
    pq.write_table(table, tmp_path / "a.parquet")
    with pytest.raises(SourceError, match=r"a.parquet row 1: ValueError: column 'grid' holds nested lists of "
                                          r"different lengths"):
        fastload.pack(tmp_path / "a.parquet", tmp_path / "ds", workers=0)


def test_a_source_streams_one_row_group_at_a_time(tmp_path, monkeypatch):
    """Rows are read a row group at a time, in order, each row group once (never the whole file)."""
    pq.write_table(hf_table(20), tmp_path / "a.parquet", row_group_size=4)
    reads = []
    real = pq.ParquetFile.read_row_group

    def counted(self, i, *args, **kwargs):
        reads.append(i)
        return real(self, i, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counted)
    monkeypatch.setattr(pq.ParquetFile, "read", lambda *a, **k: pytest.fail("the whole file was read"))
    src = as_source(tmp_path / "a.parquet")
    reads.clear()
    fastload.pack(src, tmp_path / "ds", workers=0)
    assert reads == [0, 1, 2, 3, 4]


def test_a_null_struct_is_null_however_its_children_are_stored():
    """Arrow may store anything under a null struct (b'' here, from a slice of a built array): the struct's own
    validity decides, so such a row is refused as null, never packed as an empty image."""
    from fastload.sources.parquet import _Column, _columns_as_lists

    built = pa.array([{"bytes": b"a", "path": None}, None, {"bytes": b"c", "path": "x"}], MEDIA).slice(1)
    column = _Column("image", "media", fastload.Field.image("image"))
    assert _columns_as_lists(pa.table({"image": built}), [column]) == [[None, b"c"]]


def test_two_class_label_columns_give_no_guessed_classes(tmp_path):
    # CIFAR-100's files: fine_label and coarse_label, neither called label. ds.classes from whichever came first
    # would name the other column's labels wrongly: as for a datasets.Dataset, every ClassLabel's names are kept
    # under class_names, and classes only where one column is the label
    import json

    features = {"fine_label": {"_type": "ClassLabel", "names": ["apple", "bee", "cup"]},
                "coarse_label": {"_type": "ClassLabel", "names": ["food", "insect"]}}
    table = pa.table({"fine_label": [0, 1, 2], "coarse_label": [0, 1, 0]})
    table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    pq.write_table(table, tmp_path / "c.parquet")
    src = as_source(tmp_path / "c.parquet")
    assert "classes" not in src.metadata
    assert src.metadata["class_names"] == {"fine_label": ["apple", "bee", "cup"], "coarse_label": ["food", "insect"]}
    features["label"] = {"_type": "ClassLabel", "names": ["a", "b"]}
    table = table.append_column("label", pa.array([0, 1, 1])).replace_schema_metadata(
        {"huggingface": json.dumps({"info": {"features": features}})})
    pq.write_table(table, tmp_path / "d.parquet")
    assert as_source(tmp_path / "d.parquet").metadata["classes"] == ["a", "b"]
