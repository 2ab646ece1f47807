"""fastload/sources/manifest.py: CSV and JSONL manifests as a source -- packed and read back in both formats,
columns typed, rows named, blank cells filled where declared, bad manifests and cells refused naming where."""

from __future__ import annotations

import json

import numpy as np
import pytest

import fastload
from fastload import SourceError
from fastload.sources import ManifestSource

from conftest import FORMATS, jpeg_bytes


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_manifest_sources(tmp_path, fmt, kind):
    root = tmp_path / "files"
    root.mkdir()
    rows = []
    for i in range(6):
        (root / f"{i}.jpg").write_bytes(jpeg_bytes(40 + i, 50, seed=i))
        rows.append({"path": f"{i}.jpg", "label": i % 3, "weight": i / 2, "caption": f"photo {i} é"})
    if kind == "csv":
        text = "path,label,weight,caption\n" + "".join(
            f"{r['path']},{r['label']},{r['weight']},{r['caption']}\n" for r in rows)
        man = tmp_path / "m.csv"
    else:
        text = "".join(json.dumps(r) + "\n" for r in rows)
        man = tmp_path / "m.jsonl"
    man.write_text(text, encoding="utf-8")
    fastload.pack(man, tmp_path / "out", format=fmt, root=root, workers=2)
    ds = fastload.open(tmp_path / "out", as_dict=True)
    assert [f.kind for f in ds.schema] == ["image", "int", "float", "str"]
    s = ds[4]
    assert s["image"].shape == (3, 44, 50) and s["label"] == 1 and s["weight"] == 2.0 and s["caption"] == "photo 4 é"


def test_manifest_columns_are_typed_and_rows_named(tmp_path):
    (tmp_path / "m.csv").write_text("file,n,x,note,weird col\n"
                                    "a.bin,1,2,hello,3\n"
                                    "sub/b.bin,-4,2.5,7,x\n", encoding="utf-8")
    src = ManifestSource(tmp_path / "m.csv", root=tmp_path / "data", path_column="file")
    assert [(f.name, f.kind) for f in src.schema] == [("data", "bytes"), ("n", "int"), ("x", "float"),
                                                      ("note", "str"), ("_weird_col", "str")]
    (tmp_path / "data" / "sub").mkdir(parents=True)
    (tmp_path / "data" / "sub" / "b.bin").write_bytes(b"\x00\x01")
    assert src.load(1) == [b"\x00\x01", -4, 2.5, "7", "x"]
    assert src.describe(1) == f"{tmp_path / 'data' / 'sub/b.bin'} (manifest {tmp_path / 'm.csv'}, line 3)"


@pytest.mark.parametrize("text, message", [
    ('{"path": "a.jpg"}\n[1, 2]\n', r"line 2: expected a JSON object, got list"),
    ('{"path": "a.jpg"}\n{nope\n', r"line 2: not valid JSON"),
    ('{"file": "a.jpg"}\n', r"has no 'path' column \(columns: \['file'\]\); name the path column with path_column="),
    ('{"path": "a.jpg", "n": 1}\n{"path": "b.jpg", "m": 2}\n', r"line 2: columns \['path', 'm'\] differ"),
    ('{"path": "a.jpg", "n": 1}\n{"path": "b.jpg", "n": "two"}\n',
     r"column 'n' mixes value types \['int', 'str'\]: line 2 holds 'two'"),
    ('{"path": "a.jpg", "n": null}\n', r"line 1, column 'n' is missing"),
    ("", "has no rows"),
], ids=["not-an-object", "bad-json", "no-path-column", "columns-differ", "mixed-types", "null", "empty"])
def test_bad_manifests_are_refused_naming_where(tmp_path, text, message):
    (tmp_path / "m.jsonl").write_text(text)
    with pytest.raises(SourceError, match=message):
        ManifestSource(tmp_path / "m.jsonl")


@pytest.mark.parametrize("text, message", [
    ("path,label\na.jpg,1\nb.jpg,\nc.jpg,3\n", r"line 3, column 'label' is blank, in a column of numbers"),
    ("path,label\na.jpg,1\n\nb.jpg,2\nc.jpg, \n", r"line 5, column 'label' is blank"),  # blank lines count
    ("path,w\na.jpg,0.5\nb.jpg,1.5\nc.jpg,1.O\n", r"line 4, column 'w': '1.O' is not a number, though 2 of"),
    ("path,label\na.jpg,1\nb.jpg\n", r"line 3, column 'label' is missing"),
    ("path,label\na.jpg,1\nb.jpg,2,3\n", r"line 3: columns \['path', 'label'\] and values past the last"),
], ids=["blank-int", "blank-after-blank-line", "typo-in-floats", "short-row", "long-row"])
def test_a_bad_csv_cell_stops_the_pack_naming_line_and_column(tmp_path, text, message):
    """Issue 17 row 4: one bad cell never turns a column of numbers into text; lines count from 1 with
    the header as line 1, as in an editor (JSONL lines count the same way: the test above)."""
    (tmp_path / "m.csv").write_text(text)
    with pytest.raises(SourceError, match=message):
        fastload.pack(tmp_path / "m.csv", tmp_path / "out", workers=0)
    assert not (tmp_path / "out").exists()


def test_text_columns_stay_text(tmp_path):
    (tmp_path / "m.csv").write_text("path,caption\na.bin,a dog\nb.bin,\nc.bin,42\n")
    src = ManifestSource(tmp_path / "m.csv")
    assert src.schema.fields[1].kind == "str" and [v[0] for v in src.values] == ["a dog", "", "42"]


def test_declared_missing_values_fill_blank_cells(tmp_path):
    (tmp_path / "files").mkdir()
    for i in range(3):
        (tmp_path / "files" / f"{i}.jpg").write_bytes(jpeg_bytes(20, 20, seed=i))
    (tmp_path / "m.csv").write_text("path,label,w\n0.jpg,0,0.5\n1.jpg,,1.5\n2.jpg,2,\n")
    fastload.pack(tmp_path / "m.csv", tmp_path / "a", root=tmp_path / "files", workers=0,
                  missing={"label": -1, "w": "nan"})
    ds = fastload.open(tmp_path / "a", decode=False)
    assert [ds[i][1] for i in range(3)] == [0, -1, 2] and np.isnan(ds[2][2])
    (tmp_path / "m.jsonl").write_text('{"path": "0.jpg", "label": 3}\n{"path": "1.jpg", "label": null}\n')
    src = ManifestSource(tmp_path / "m.jsonl", root=tmp_path / "files", missing={"label": -1})
    assert src.schema.fields[1].kind == "int" and [v[0] for v in src.values] == [3, -1]
    assert src.fingerprint() != ManifestSource(tmp_path / "m.jsonl", missing={"label": -2}).fingerprint()
    with pytest.raises(SourceError, match=r"missing= names \['nope'\], not a value column"):
        ManifestSource(tmp_path / "m.jsonl", missing={"nope": 0})
    with pytest.raises(SourceError, match="not a manifest"):
        fastload.pack(tmp_path / "files", tmp_path / "b", missing={"label": 0})


def test_zero_padded_ids_keep_their_zeros(tmp_path):
    """A column of ids such as "007" was read as the int 7: the data silently changed. Zero-padded integers make
    the column text, as written; a column of plain integers stays int; Python-only spellings are not numbers."""
    (tmp_path / "m.csv").write_text("path,id,n\na.bin,007,7\nb.bin,0042,42\nc.bin,5,0\n")
    src = ManifestSource(tmp_path / "m.csv")
    assert [f.kind for f in src.schema.fields[1:]] == ["str", "int"]
    assert [v[0] for v in src.values] == ["007", "0042", "5"] and [v[1] for v in src.values] == [7, 42, 0]
    (tmp_path / "u.csv").write_text("path,x\na.bin,1_000\nb.bin,2\nc.bin,3\n")  # int() reads 1000: a typo?
    with pytest.raises(SourceError, match=r"line 2, column 'x': '1_000' is not a number"):
        ManifestSource(tmp_path / "u.csv")
    (tmp_path / "j.jsonl").write_text('{"path": "a.bin", "zip": "02134"}\n{"path": "b.bin", "zip": "90210"}\n')
    assert [v[0] for v in ManifestSource(tmp_path / "j.jsonl").values] == ["02134", "90210"]
    (tmp_path / "f.csv").write_text("path,w\na.bin,0.50\nb.bin,-1e3\nc.bin,nan\n")
    src = ManifestSource(tmp_path / "f.csv")
    assert src.schema.fields[1].kind == "float" and src.values[1][0] == -1000.0
