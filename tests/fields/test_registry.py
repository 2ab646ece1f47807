"""fields/registry.py: field kinds listed once; a new kind is one new codec plus one registration line.

``RgbColor`` below is such a kind, written here without touching any other module of fastload: a colour of 3
uint8 stored in a fixed-size column. Packed, opened, read by ``ds[i]``, batched by the loader (the native row
gather), by ``__getitems__``, described by ``fastload inspect``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import fastload
from fastload import Field, Schema, SchemaError
from fastload.cli import main
from fastload.fields import CODECS, Codec, Column, FixedPart, codec_of, kinds, register
from fastload.fields import registry

from .conftest import batches


class RgbColor(Codec):
    """A colour: 3 uint8 (r, g, b), given as any sequence of 3 ints in 0..255; ds[i] gives a uint8 tensor (3,)."""

    kind = "rgb_color"

    def fixed_size(self, field):
        return True

    def np_dtype(self, field):
        return np.dtype("u1")

    def columns(self, field):
        return (Column("values", np.dtype("u1"), (3,)),)

    def encode(self, field, value, opts):
        rgb = tuple(value)
        if len(rgb) != 3 or not all(isinstance(c, int) and 0 <= c <= 255 for c in rgb):
            raise SchemaError(f"expected 3 ints in 0..255, got {value!r}")
        return (np.array(rgb, dtype="u1"),), None

    def read(self, field, reader, at, ctx):
        return torch.from_numpy(np.array(reader.row(at, field.name, "values", 0)))

    def batch(self, field, dataset):
        return FixedPart(field, self.columns(field)[0])


COLORS = [(i, 255 - i, (7 * i) % 256) for i in range(10)]


@pytest.fixture
def rgb_kind(monkeypatch):
    monkeypatch.setitem(CODECS, "rgb_color", RgbColor())  # the one registration line (run-time form)


def test_a_made_up_kind_packs_opens_reads_and_batches(rgb_kind, pack_samples):
    samples = [{"color": c, "label": i} for i, c in enumerate(COLORS)]
    path = pack_samples(samples, schema={"color": Field("color", "rgb_color")})
    ds = fastload.open(path, as_dict=True)
    assert ds.schema == Schema([Field("color", "rgb_color"), Field.int("label")])
    assert repr(ds.schema["color"]) == "Field.rgb_color('color')"
    for i in (0, 3, 9):
        item = ds[i]
        assert item["color"].dtype == torch.uint8 and item["color"].tolist() == list(COLORS[i]) and item["label"] == i
    got = batches(ds, 4)
    assert [b["color"].shape for b in got] == [(4, 3), (4, 3), (2, 3)]
    assert torch.cat([b["color"] for b in got]).tolist() == [list(c) for c in COLORS]
    assert torch.cat([b["label"] for b in got]).tolist() == list(range(10))
    shuffled = batches(ds, 3, num_workers=2, shuffle=True, seed=5)  # threads, a random order
    labels = torch.cat([b["label"] for b in shuffled]).tolist()
    assert sorted(labels) == list(range(10)) and labels != list(range(10))
    assert torch.cat([b["color"] for b in shuffled]).tolist() == [list(COLORS[i]) for i in labels]
    items = ds.__getitems__([9, 2])  # torch's own DataLoader: one native batch fill
    assert [x["color"].tolist() for x in items] == [list(COLORS[9]), list(COLORS[2])]
    out = CliRunner().invoke(main, ["inspect", str(path)])
    assert out.exit_code == 0 and "rgb_color" in out.output


def test_a_made_up_kind_refuses_bad_values_naming_the_field(rgb_kind, pack_samples):
    with pytest.raises(fastload.SourceError, match=r"Samples\[0\]: SchemaError: field 'color': expected 3 ints in 0\.\.255, got \(1, 2\)"):
        pack_samples([{"color": (1, 2)}], schema={"color": Field("color", "rgb_color")})


def test_a_dataset_of_an_unregistered_kind_is_refused_naming_the_kind(rgb_kind, pack_samples, monkeypatch):
    path = pack_samples([{"color": c} for c in COLORS], schema={"color": Field("color", "rgb_color")})
    monkeypatch.delitem(CODECS, "rgb_color")
    with pytest.raises(fastload.FormatError, match="kind 'rgb_color' is not one of image, int, float, ndarray, bytes, str"):
        fastload.open(path)


def test_the_built_in_kinds_are_listed_once_in_order():
    assert kinds() == ("image", "int", "float", "ndarray", "bytes", "str", "mask")
    assert all(codec.kind == name for name, codec in CODECS.items())
    assert codec_of(Field.int("x")) is CODECS["int"]


def test_register_adds_a_kind_and_refuses_a_taken_name(monkeypatch):
    monkeypatch.setattr(registry, "CODECS", dict(CODECS))
    codec = register(RgbColor())
    assert registry.CODECS["rgb_color"] is codec
    with pytest.raises(ValueError, match="field kind 'rgb_color' is already registered"):
        register(RgbColor())
    with pytest.raises(ValueError, match="should be a Codec whose kind is an identifier"):
        register(object())


def test_an_unknown_kind_is_named_with_the_choices():
    with pytest.raises(SchemaError, match="field 'x': kind 'complex' is not one of image, int, float, ndarray, bytes, str"):
        Field("x", "complex")
    with pytest.raises(SchemaError, match=r"kind \['int'\] is not one of"):
        Field("x", ["int"])
