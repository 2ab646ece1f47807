"""fastload/sources/webdataset.py: WebDataset tar shards as a source -- shards built here with tarfile, packed
and read back: members grouped into samples by webdataset's key rule, extensions as fields, bytes stored
untouched, shards named by file, folder, glob and brace pattern, and every bad shard refused at open naming
its shard and key."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload import SourceError
from fastload.sources import WebDatasetSource, as_source
from fastload.sources._files import expand_braces
from fastload.sources.webdataset import split_key

from conftest import FORMATS, jpeg_bytes


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def png_bytes(h: int, w: int, seed: int) -> bytes:
    arr = np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def sample(shard: int, i: int, prefix: str = "") -> list[tuple[str, bytes]]:
    key = f"{prefix}{shard:03d}_{i:04d}"
    return [(f"{key}.jpg", jpeg_bytes(24 + i % 5, 32, seed=shard * 100 + i)),
            (f"{key}.cls", f"{(shard + i) % 4}\n".encode()),
            (f"{key}.txt", f"caption {shard}/{i} é".encode()),
            (f"{key}.json", json.dumps({"shard": shard, "i": i}).encode()),
            (f"{key}.npy", npy_bytes(np.arange(3 + i % 2, dtype=np.float32) * i)),
            (f"{key}.seg.png", png_bytes(4, 4, seed=i)),
            (f"{key}.pyd", b"\x80\x04 pickled bytes, never unpickled")]


def shards(folder: Path, n: int = 3, per: int = 4, prefix: str = "") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [write_tar(folder / f"train-{s:03d}.tar", [m for i in range(per) for m in sample(s, i, prefix)])
            for s in range(n)]


def test_keys_and_brace_patterns_follow_webdataset():
    assert split_key("a/b/0001.seg.png") == ("a/b/0001", "seg.png")
    assert split_key("x.y/0001.JPG") == ("x.y/0001", "jpg")
    assert split_key("README") is None
    assert expand_braces("s-{008..011}.tar") == ["s-008.tar", "s-009.tar", "s-010.tar", "s-011.tar"]
    assert expand_braces("{a,b}-{0..1}") == ["a-0", "a-1", "b-0", "b-1"]
    with pytest.raises(SourceError, match=r"the brace group \{x\} is neither a range"):
        expand_braces("s-{x}.tar")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("workers", [0, 2])
def test_shards_pack_with_their_bytes_untouched(tmp_path, fmt, workers):
    files = shards(tmp_path / "wds", prefix="part/")
    fastload.pack(str(tmp_path / "wds" / "train-{000..002}.tar"), tmp_path / "ds", format=fmt, workers=workers)
    ds = fastload.open(tmp_path / "ds", as_dict=True)
    raw = fastload.open(tmp_path / "ds", as_dict=True, decode=False)
    assert len(ds) == 12
    assert [(f.name, f.kind) for f in ds.schema] == [("jpg", "image"), ("cls", "int"), ("txt", "str"),
                                                     ("json", "str"), ("npy", "ndarray"), ("seg_png", "bytes"),
                                                     ("pyd", "bytes")]
    assert ds.schema["npy"].shape == (None,)
    members = {}
    for f in files:
        with tarfile.open(f) as tf:
            members.update({m.name: tf.extractfile(m).read() for m in tf})
    for k in (0, 5, 11):
        s, i = divmod(k, 4)
        key = f"part/{s:03d}_{i:04d}"
        assert raw[k]["jpg"] == members[f"{key}.jpg"]  # byte for byte
        assert ds[k]["cls"] == (s + i) % 4 and ds[k]["txt"] == f"caption {s}/{i} é"
        assert json.loads(ds[k]["json"]) == {"shard": s, "i": i}
        assert torch.equal(ds[k]["npy"], torch.from_numpy(np.arange(3 + i % 2, dtype=np.float32) * i))
        assert ds[k]["seg_png"] == members[f"{key}.seg.png"] and ds[k]["pyd"] == members[f"{key}.pyd"]


def test_pixels_equal_the_source(tmp_path):
    pngs = [png_bytes(10 + i, 12, seed=i) for i in range(4)]
    write_tar(tmp_path / "a.tar", [m for i, p in enumerate(pngs) for m in ((f"{i}.png", p), (f"{i}.cls", b"1"))])
    ds = fastload.open(fastload.pack(tmp_path / "a.tar", tmp_path / "ds", workers=0).dest, as_dict=True)
    for i, data in enumerate(pngs):
        want = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        assert np.array_equal(ds[i]["png"].permute(1, 2, 0).numpy(), want)


def test_a_folder_and_a_glob_name_shards_in_order(tmp_path):
    shards(tmp_path / "wds", n=3, per=2)
    (tmp_path / "wds" / "notes.md").write_text("not a shard")
    src = as_source(tmp_path / "wds")
    assert isinstance(src, WebDatasetSource) and len(src) == 6
    assert src.describe(3) == f"{tmp_path / 'wds' / 'train-001.tar'} key '001_0001'"
    glob = as_source(str(tmp_path / "wds" / "train-00[02].tar"))
    assert [glob.describe(i).rsplit("'", 2)[1] for i in range(len(glob))] == ["000_0000", "000_0001", "002_0000",
                                                                            "002_0001"]
    both = tmp_path / "both"
    shards(both / "train", n=1, per=1)
    shards(both / "val", n=1, per=1)
    with pytest.raises(SourceError, match=r"holds the splits train, val .* e.g. '.*both/train'"):
        as_source(both)


def members_of(*samples: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    return [m for s in samples for m in s]


def test_bad_shards_are_refused_at_open_naming_shard_and_key(tmp_path):
    good = members_of(*(sample(0, i) for i in range(3)))
    missing = [m for m in good if m[0] != "000_0001.cls"]
    write_tar(tmp_path / "missing.tar", missing)
    with pytest.raises(SourceError, match=r"missing.tar, key '000_0001' has no 'cls' member, unlike the first "
                                          r"sample \(.*missing.tar, key '000_0000'"):
        as_source(tmp_path / "missing.tar")
    extra = good + [("000_0002.wav", b"RIFF")]  # the last sample has one more
    write_tar(tmp_path / "extra.tar", extra)
    with pytest.raises(SourceError, match=r"extra.tar, key '000_0002' has a 'wav' member"):
        as_source(tmp_path / "extra.tar")
    write_tar(tmp_path / "twice.tar", good + [("000_0002.cls", b"1")])
    with pytest.raises(SourceError, match=r"twice.tar, key '000_0002': extension 'cls' appears twice"):
        as_source(tmp_path / "twice.tar")
    write_tar(tmp_path / "apart.tar", good + sample(0, 0))
    with pytest.raises(SourceError, match=r"apart.tar: key '000_0000' appears again after other keys"):
        as_source(tmp_path / "apart.tar")
    write_tar(tmp_path / "noext.tar", good + [("README", b"hi")])
    with pytest.raises(SourceError, match=r"noext.tar: member 'README' has no extension"):
        as_source(tmp_path / "noext.tar")
    write_tar(tmp_path / "npy.tar", good + [(n.replace("0002", "0003"), npy_bytes(np.zeros(2, np.int8))
                                             if n.endswith(".npy") else d) for n, d in sample(0, 2)])
    with pytest.raises(SourceError, match=r"npy.tar, key '000_0003': the .npy member is int8 of shape \(2,\), but "
                                          r"the first .* is float32"):
        as_source(tmp_path / "npy.tar")
    with pytest.raises(SourceError, match=r"compressed shards cannot be read member by member"):
        as_source(tmp_path / "x.tar.gz")


def test_a_corrupt_or_truncated_shard_is_refused_naming_it(tmp_path):
    data = write_tar(tmp_path / "ok.tar", members_of(*(sample(0, i) for i in range(3)))).read_bytes()
    with tarfile.open(tmp_path / "ok.tar") as tf:
        third = [m for m in tf.getmembers()][9]  # a header in the middle: 000_0001.txt
    corrupt = bytearray(data)
    corrupt[third.offset:third.offset + 100] = b"\xff" * 100  # its name and checksum garbled
    (tmp_path / "corrupt.tar").write_bytes(bytes(corrupt))
    with pytest.raises(SourceError, match=r"corrupt.tar is corrupt or truncated after member '000_0001.cls'"):
        as_source(tmp_path / "corrupt.tar")
    (tmp_path / "cut.tar").write_bytes(data[:third.offset_data + 3])  # inside a member's data
    with pytest.raises(SourceError, match=r"cut.tar is corrupt or truncated after member '000_0001.txt'"):
        as_source(tmp_path / "cut.tar")
    (tmp_path / "cut2.tar").write_bytes(data[:third.offset])  # on a header boundary: no end-of-archive marker
    with pytest.raises(SourceError, match=r"cut2.tar is corrupt or truncated after member '000_0001.cls'"):
        as_source(tmp_path / "cut2.tar")


def test_a_bad_member_fails_the_pack_naming_shard_and_key(tmp_path):
    members = members_of(*(sample(0, i) for i in range(3)))
    members = [(n, b"three" if n == "000_0002.cls" else d) for n, d in members]
    write_tar(tmp_path / "a.tar", members)
    with pytest.raises(SourceError, match=r"a.tar key '000_0002': ValueError: member '000_0002.cls': 'three' is not "
                                          r"an integer class"):
        fastload.pack(tmp_path / "a.tar", tmp_path / "ds", workers=0)
    members = [(n, b"{oops" if n == "000_0001.json" else d) for n, d in members_of(*(sample(0, i) for i in range(3)))]
    write_tar(tmp_path / "b.tar", members)
    with pytest.raises(SourceError, match=r"b.tar key '000_0001': ValueError: member '000_0001.json': not valid JSON"):
        fastload.pack(tmp_path / "b.tar", tmp_path / "ds2", workers=0)


def test_a_sample_split_across_shards_is_refused_naming_both(tmp_path):
    # webdataset's group_by_keys joins consecutive members of one key across a shard boundary; fastload reads a
    # sample from one shard, so the error says the sample is split, naming both shards and the key
    whole = members_of(*(sample(0, i) for i in range(3)))
    cut = next(j for j, (n, _) in enumerate(whole) if n == "000_0001.txt")
    (tmp_path / "split").mkdir()
    write_tar(tmp_path / "split" / "a.tar", whole[:cut])
    write_tar(tmp_path / "split" / "b.tar", whole[cut:])
    with pytest.raises(SourceError, match=r"key '000_0001' is split across shards: .*a.tar holds its jpg, cls "
                                          r"members, .*b.tar its txt"):
        as_source(tmp_path / "split")
    # the first sample split: said as such, not as every other sample having fields the first lacks
    (tmp_path / "first").mkdir()
    cut = next(j for j, (n, _) in enumerate(whole) if n == "000_0000.cls")
    write_tar(tmp_path / "first" / "a.tar", whole[:cut])
    write_tar(tmp_path / "first" / "b.tar", whole[cut:])
    with pytest.raises(SourceError, match=r"key '000_0000' is split across shards"):
        as_source(tmp_path / "first")
    # one key again at the next shard's start with a member the first already has is a new sample (webdataset's
    # rule too), not a split one
    (tmp_path / "again").mkdir()
    write_tar(tmp_path / "again" / "a.tar", members_of(sample(0, 0)))
    write_tar(tmp_path / "again" / "b.tar", members_of(sample(0, 0), sample(0, 1)))
    src = as_source(tmp_path / "again")
    assert [src.describe(i).rsplit("/", 1)[1] for i in range(len(src))] == [
        "a.tar key '000_0000'", "b.tar key '000_0000'", "b.tar key '000_0001'"]
