"""fastload/sources/: the adapters fastload.pack reads. Each kind of source (arrays, .npy/.npz, CSV and JSONL
manifests, a torch Dataset) packed and read back in both formats; which adapter a source gets, and each
adapter's ordering, typing, naming of samples and refusals, directly."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import fastload
from fastload import Field, SourceError
from fastload.sources import ArraySource, DatasetSource, ImageFolderSource, ManifestSource, as_source

from conftest import FORMATS, jpeg_bytes, make_image_folder


@pytest.mark.parametrize("fmt", FORMATS)
def test_arrays_npy_npz_round_trip(tmp_path, fmt):
    x = np.random.default_rng(0).random((50, 3, 4), dtype=np.float32)
    y = np.arange(50, dtype=np.int16)
    for src in ({"x": x, "y": y}, (x, y)):
        dst = tmp_path / f"d{len(list(tmp_path.iterdir()))}"
        fastload.pack(src, dst, format=fmt, shard_size="1K")
        ds = fastload.open(dst, as_dict=True)
        names = list(ds[0].keys())
        assert len(ds) == 50 and ds.schema[names[0]].shape == (3, 4)
        for i in (0, 17, 49):
            assert np.array_equal(ds[i][names[0]].numpy(), x[i]) and ds[i][names[1]] == int(y[i])
    np.save(tmp_path / "a.npy", x)
    np.savez(tmp_path / "b.npz", feats=x, labels=y)
    fastload.pack(tmp_path / "a.npy", tmp_path / "npy", format=fmt)
    fastload.pack(tmp_path / "b.npz", tmp_path / "npz", format=fmt)
    assert np.array_equal(fastload.open(tmp_path / "npy")[3][0].numpy(), x[3])
    assert fastload.open(tmp_path / "npz").schema.names == ("feats", "labels")


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


class DictDataset(torch.utils.data.Dataset):
    def __init__(self, n=20):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        from PIL import Image

        rng = np.random.default_rng(i)
        return {
            "img": Image.fromarray(rng.integers(0, 255, (20 + i, 30, 3), dtype=np.uint8)),
            "tokens": torch.arange(i % 5 + 1, dtype=torch.int64),
            "emb": torch.full((4,), float(i)),
            "score": float(i) / 3,
            "id": i,
            "name": f"s{i}",
            "blob": bytes([i]) * i,
        }


@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_dataset_source(tmp_path, fmt):
    src = DictDataset()
    fastload.pack(src, tmp_path / "out", format=fmt, workers=2, shard_size="2K")
    ds = fastload.open(tmp_path / "out", as_dict=True)
    assert ds.schema["tokens"].shape == (None,) and ds.schema["emb"].shape == (4,)
    assert ds.schema["img"].kind == "image"
    for i in (0, 7, 19):
        s, ref = ds[i], src[i]
        assert np.array_equal(s["img"].permute(1, 2, 0).numpy(), np.asarray(ref["img"]))  # small -> raw, lossless
        assert torch.equal(s["tokens"], ref["tokens"]) and torch.equal(s["emb"], ref["emb"])
        assert (s["score"], s["id"], s["name"], s["blob"]) == (ref["score"], ref["id"], ref["name"], ref["blob"])
    tup = fastload.open(tmp_path / "out")[3]
    assert isinstance(tup, tuple) and len(tup) == 7


def test_empty_and_bad_sources(tmp_path):
    with pytest.raises(SourceError, match="does not exist"):
        fastload.pack(tmp_path / "nope", tmp_path / "o")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="no class subdirectories"):
        fastload.pack(tmp_path / "empty", tmp_path / "o")
    with pytest.raises(SourceError, match="different lengths"):
        fastload.pack({"a": np.zeros(3), "b": np.zeros(4)}, tmp_path / "o")
    with pytest.raises(SourceError, match="cannot pack"):
        fastload.pack(42, tmp_path / "o")
    with pytest.raises(ValueError, match="image_mode"):
        fastload.pack(tmp_path / "empty", tmp_path / "o", image_mode="png")


def test_each_kind_of_source_gets_its_adapter(tmp_path, image_folder):
    x = np.zeros((4, 2), np.float32)
    np.save(tmp_path / "a.npy", x)
    np.savez(tmp_path / "b.npz", x=x)
    (tmp_path / "m.csv").write_text("path,label\na.jpg,1\n")
    (tmp_path / "m.jsonl").write_text('{"path": "a.jpg", "label": 1}\n')
    assert isinstance(as_source(image_folder), ImageFolderSource)
    for src in (tmp_path / "a.npy", str(tmp_path / "b.npz"), x, {"x": x}, (x, x[:, 0]), [x]):
        assert isinstance(as_source(src), ArraySource), src
    for src in (tmp_path / "m.csv", tmp_path / "m.jsonl"):
        assert isinstance(as_source(src), ManifestSource)
    assert isinstance(as_source(torch.utils.data.TensorDataset(torch.zeros(3))), DatasetSource)
    mine = ArraySource(x)
    assert as_source(mine) is mine
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(SourceError, match="expected a folder, .npy, .npz, .csv or .jsonl file"):
        as_source(tmp_path / "notes.txt")
    with pytest.raises(SourceError, match="schema overrides are not supported for ImageFolder"):
        as_source(image_folder, schema={"label": Field.int("label")})
    with pytest.raises(SourceError, match="schema overrides are not supported for manifest"):
        as_source(tmp_path / "m.csv", schema={"label": Field.int("label")})


def test_image_folder_order_labels_and_names_are_torchvision_s(tmp_path):
    root = tmp_path / "tree"
    files = ["b_cls/z.jpg", "b_cls/a.PNG", "b_cls/sub/a.jpg", "a_cls/y.jpg", "a_cls/notes.txt"]
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_bytes(b"x")
    src = ImageFolderSource(root)
    # classes sorted; within a class, directory by directory (sorted), files sorted; other extensions left out
    assert src.classes == ["a_cls", "b_cls"]
    got = [(os.path.relpath(p, root), label) for p, label in src.samples]
    assert got == [("a_cls/y.jpg", 0), ("b_cls/a.PNG", 1), ("b_cls/z.jpg", 1), ("b_cls/sub/a.jpg", 1)]
    assert len(src) == 4 and src.describe(3) == str(root / "b_cls/sub/a.jpg") and src.load(0)[1] == 0
    before = src.fingerprint()
    (root / "a_cls/y.jpg").write_bytes(b"xy")  # a file changed: resuming a pack of the old tree is refused
    assert ImageFolderSource(root).fingerprint() != before
    (root / "nothing" / "here").mkdir(parents=True)
    with pytest.raises(SourceError, match="has no files with extensions"):
        ImageFolderSource(root / "nothing")


def test_an_empty_class_folder_is_refused_as_torchvision_does(tmp_path):
    """Issue 17 row 9: a folder with no image (an earlier pack's output, a stray folder) is not a class."""
    root = make_image_folder(tmp_path / "tree", classes=2, per_class=2)
    (root / "out").mkdir()
    (root / "out" / "manifest.json").write_text("{}")
    with pytest.raises(SourceError, match=rf"class folder\(s\) {root / 'out'} hold no image"):
        fastload.pack(root, tmp_path / "packed", workers=0)
    assert not (tmp_path / "packed").exists()


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


def test_array_sources_name_fields_and_refuse_what_they_cannot_store(tmp_path):
    x, y = np.zeros((5, 3), np.uint8), np.arange(5)
    assert ArraySource((x, y)).schema.names == ("x", "y")
    assert ArraySource((x, y, y)).schema.names == ("f0", "f1", "f2")
    src = ArraySource({"img": x, "w": np.ones(5, np.float16), "ok": np.ones(5, bool)})
    assert [(f.kind, f.shape) for f in src.schema] == [("ndarray", (3,)), ("float", None), ("int", None)]
    assert src.describe(2) == "arrays row 2" and len(src) == 5
    assert ArraySource(x).fingerprint() != ArraySource(x + 1).fingerprint()
    with pytest.raises(SourceError, match="array 'x' is a scalar"):
        ArraySource(np.float32(1))
    with pytest.raises(SourceError, match="array 's' has dtype <U1; only bool, integer and float arrays"):
        ArraySource({"s": np.array(list("abcde"))})
    with pytest.raises(SourceError, match=r"schema overrides name unknown arrays \['nope'\]"):
        ArraySource({"x": x}, schema={"nope": Field.int("nope")})
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    with pytest.raises(SourceError, match="cannot read numpy file .*bad.npy"):
        ArraySource(tmp_path / "bad.npy")


class Classy(torch.utils.data.Dataset):
    classes = ["cat", "dog"]

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"x": torch.full((2,), i), "label": i % 2} if i != 3 else (torch.zeros(2), 1)


def test_dataset_sources_keep_classes_and_check_every_sample():
    src = DatasetSource(Classy(), infer_samples=2)
    assert src.as_dict and src.schema.names == ("x", "label") and src.metadata["classes"] == ["cat", "dog"]
    assert src.load(1)[1] == 1 and src.describe(3) == "Classy[3]"
    with pytest.raises(fastload.SchemaError, match="expected a dict sample like sample 0, got tuple"):
        src.load(3)
    with pytest.raises(SourceError, match="the source TensorDataset has no samples"):
        DatasetSource(torch.utils.data.TensorDataset(torch.zeros(0)))
    with pytest.raises(SourceError, match="is not a map-style dataset"):
        DatasetSource(iter([1, 2]))


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
