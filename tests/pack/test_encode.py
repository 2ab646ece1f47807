"""fastload/pack/_encode.py: source values into stored form. Image modes (passthrough, jpeg, raw, auto) and the JPEG
check through fastload.pack; each field kind's conversions and refusals, and the image inputs, directly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
from fastload import Field, Schema, SchemaError, SourceError
from fastload.fields.image import encode_image
from fastload.pack._encode import ImageOptions, encode_sample, encode_value
from fastload.formats._layout import IMAGE_JPEG, IMAGE_RAW

from conftest import jpeg_bytes, pil_rgb, png_bytes

OPTS = ImageOptions()


def test_image_modes(tmp_path):
    jpg = jpeg_bytes(300, 200, seed=1)
    png_small = png_bytes(32, 32, seed=2)
    png_big = png_bytes(300, 300, seed=3)
    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    for name, data in [("0.jpg", jpg), ("1.png", png_small), ("2.png", png_big)]:
        (root / "a" / name).write_bytes(data)

    def stored(mode, **kw):
        dst = tmp_path / f"out_{mode}_{len(kw)}"
        fastload.pack(root, dst, image_mode=mode, workers=0, **kw)
        ds = fastload.open(dst, decode=False)
        seg, _ = ds.locate(0)
        meta = seg.columns[("image", "meta")]
        return [ds[i][0] for i in range(3)], meta.tolist(), fastload.open(dst)

    with pytest.warns(UserWarning, match=r"2\.png: the image was re-encoded as JPEG at quality=90") as caught:
        blobs, meta, ds = stored("auto")                    # unasked, lossy: said once (issue 27 row 3)
    assert len([w for w in caught if "re-encoded" in str(w.message)]) == 1
    assert blobs[0] == jpg                                  # JPEG untouched
    assert meta[1] == [32, 32, 1]                           # small PNG stored raw, losslessly
    assert np.array_equal(ds[1][0].permute(1, 2, 0).numpy(), pil_rgb(png_small))
    assert meta[2][2] == 0 and blobs[2][:2] == b"\xff\xd8"  # big PNG re-encoded as JPEG

    blobs, meta, ds = stored("raw")
    assert [m[2] for m in meta] == [1, 1, 1]
    assert np.array_equal(ds[2][0].permute(1, 2, 0).numpy(), pil_rgb(png_big))

    blobs, meta, ds = stored("jpeg", max_side=100)
    assert [m[2] for m in meta] == [0, 0, 0]
    assert meta[0][:2] == [100, 67] and meta[2][:2] == [100, 100]
    assert ds[0][0].shape == (3, 100, 67)

    with pytest.raises(SourceError, match=r"1\.png.*not a JPEG"):
        fastload.pack(root, tmp_path / "pt", image_mode="passthrough", workers=0)


def test_header_check_catches_truncation_and_is_recorded(image_folder, tmp_path):
    bad = image_folder / "class_0" / "img_001.jpg"
    bad.write_bytes(bad.read_bytes()[:-50])
    with pytest.raises(SourceError, match="end-of-image"):
        fastload.pack(image_folder, tmp_path / "a", image_mode="passthrough", check="header", workers=0)
    with pytest.raises(ValueError, match="check="):
        fastload.pack(image_folder, tmp_path / "b", check="nothing")


@pytest.mark.parametrize("kw, message", [
    (dict(mode="png"), "image_mode='png' should be one of auto, passthrough, jpeg, raw"),
    (dict(max_side=0), "max_side=0 should be a positive number of pixels"),
    (dict(quality=101), "quality=101 should be between 1 and 100"),
    (dict(check="none"), "check='none' should be 'decode' or 'header'"),
    (dict(mode="passthrough", max_side=64), "max_side cannot be used with image_mode='passthrough'"),
], ids=["mode", "max_side", "quality", "check", "passthrough-max_side"])
def test_image_options_are_checked(kw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ImageOptions(**kw)


@pytest.mark.parametrize("field, value, stored", [
    (Field.int("n"), np.int16(-7), -7),
    (Field.int("n"), np.array([[5]], np.uint8), 5),  # one element of an integer array
    (Field.int("n"), True, 1),
    (Field.int("n"), (1 << 63) - 1, (1 << 63) - 1),
    (Field.float("x"), np.float32(0.5), 0.5),
    (Field.float("x"), 3, 3.0),
], ids=["int-numpy-scalar", "int-one-element-array", "int-bool", "int-max", "float-numpy", "float-int"])
def test_numbers_are_stored_as_python_values(field, value, stored):
    (got,), blob = encode_value(field, value, OPTS)
    assert got == stored and type(got) is type(stored) and blob is None


@pytest.mark.parametrize("field, value, message", [
    (Field.int("n"), 1 << 63, "integer 9223372036854775808 does not fit in 64 bits"),
    (Field.int("n"), 2.5, "expected an integer, got float 2.5"),
    (Field.int("n"), np.arange(2), r"expected an integer, got an array of shape \(2,\)"),
    (Field.float("x"), True, "expected a float, got bool"),
    (Field.float("x"), "1.5", "expected a float, got str"),
    (Field.ndarray("a", "<i2", (3,)), np.zeros(3, np.int32), "array of dtype int32 cannot be stored as int16 without loss"),
    (Field.ndarray("a", "<f4", (3,)), np.zeros(4, np.float32), r"shape \(4,\) does not match the schema's shape \(3,\)"),
    (Field.ndarray("a", "<f4", (None, 2)), np.zeros((2, 3), np.float32), r"does not match the schema's shape \('\*', 2\)"),
    (Field.bytes("b"), "text", "expected bytes, got str"),
    (Field.str("s"), b"text", "expected str, got bytes"),
    (Field.str("s"), "\ud800", "string is not valid unicode"),
], ids=["int-too-large", "int-float", "int-array", "float-bool", "float-str", "array-lossy-cast", "array-shape",
        "array-variable-shape", "bytes-str", "str-bytes", "str-surrogate"])
def test_values_that_cannot_be_stored_are_refused_with_the_reason(field, value, message):
    with pytest.raises(SchemaError, match=message):
        encode_value(field, value, OPTS)


def test_arrays_are_cast_safely_and_variable_ones_stored_little_endian():
    (fixed,), blob = encode_value(Field.ndarray("a", "<f8", (2, 2)), np.arange(4, dtype=np.int16).reshape(2, 2), OPTS)
    assert fixed.dtype == np.float64 and fixed.tolist() == [[0, 1], [2, 3]] and blob is None
    big_endian = np.arange(6, dtype=">f4").reshape(3, 2)
    (shape,), blob = encode_value(Field.ndarray("v", "<f4", (None, 2)), big_endian, OPTS)
    assert shape.tolist() == [3, 2] and shape.dtype == np.dtype("<i8")
    assert blob == big_endian.astype("<f4").tobytes()
    assert encode_value(Field.bytes("b"), memoryview(b"xyz"), OPTS) == ((), b"xyz")
    assert encode_value(Field.str("s"), "é", OPTS) == ((), "é".encode())


def test_a_sample_error_names_its_field():
    schema = Schema([Field.int("label"), Field.str("caption")])
    assert encode_sample(schema, [3, "ok"], OPTS) == [((3,), None), ((), b"ok")]
    with pytest.raises(SchemaError, match="field 'caption': expected str, got int"):
        encode_sample(schema, [3, 4], OPTS)
    with pytest.raises(SchemaError, match=r"sample has 1 fields, the schema has 2 \(\['label', 'caption'\]\)"):
        encode_sample(schema, [3], OPTS)


def test_image_inputs_become_rgb():
    from PIL import Image

    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)
    for value in (rgb, Image.fromarray(rgb), torch.from_numpy(rgb).permute(2, 0, 1)):  # HWC, PIL, torch CHW
        (meta,), blob = encode_image(value, OPTS)  # small and not a JPEG: stored raw, losslessly
        assert meta.tolist() == [20, 30, IMAGE_RAW] and blob == rgb.tobytes()
    gray = rng.integers(0, 256, (20, 30), dtype=np.uint8)
    (meta,), blob = encode_image(Image.fromarray(gray), OPTS)
    assert meta.tolist() == [20, 30, IMAGE_RAW] and blob == np.repeat(gray[:, :, None], 3, axis=2).tobytes()
    smooth = pil_rgb(jpeg_bytes(20, 30, seed=5))  # JPEG-friendly, unlike noise
    (meta,), blob = encode_image(smooth, ImageOptions(mode="jpeg", quality=95))
    assert meta.tolist() == [20, 30, IMAGE_JPEG] and np.abs(pil_rgb(blob).astype(int) - smooth).mean() < 2
    jpg = jpeg_bytes(40, 60, seed=3)
    assert encode_image(jpg, OPTS)[1] == jpg  # a JPEG within max_side passes through untouched
    (meta,), blob = encode_image(jpg, ImageOptions(max_side=30))
    assert meta.tolist() == [20, 30, IMAGE_JPEG] and pil_rgb(blob).shape == (20, 30, 3)
    for bad, message in [(rgb.astype(np.float32), "must be uint8, got float32"),
                         (rgb[:, :, :2], r"must be HxW, HxWx1 or HxWx3 \(CHW for tensors\), got shape \(20, 30, 2\)"),
                         ("picture.jpg", "needs a PIL image, an image file or a uint8 array, got str"),
                         (np.zeros((0, 5, 3), np.uint8), r"image is empty \(height 0, width 5\)")]:
        with pytest.raises(SchemaError, match=message):
            encode_image(bad, OPTS)
    with pytest.raises(SchemaError, match="passthrough.*not a JPEG"):
        encode_image(png_bytes(8, 8), ImageOptions(mode="passthrough"))


def test_a_pil_image_is_stored_as_its_jpeg_file_only_while_it_holds_that_file_s_pixels(tmp_path):
    """Issue 27 row 3: ``Image.open(path)`` untouched is the file (stored byte for byte); drawn on in place (same
    class, same ``format``), converted or resized, it is pixels: re-encoded, and noted for the pack's warning."""
    from PIL import Image, ImageDraw

    from fastload.fields.image import reencodings

    path = tmp_path / "a.jpg"
    path.write_bytes(jpeg_bytes(300, 260, seed=4))
    with reencodings() as notes:
        assert encode_image(Image.open(path), OPTS)[1] == path.read_bytes()
        assert encode_image(Image.open(path), ImageOptions(mode="passthrough"))[1] == path.read_bytes()
    assert notes == []
    drawn = Image.open(path)
    ImageDraw.Draw(drawn).rectangle((0, 0, 20, 20), fill=(255, 0, 0))
    shrunk = Image.open(path)
    shrunk.thumbnail((100, 100))
    for changed in (drawn, shrunk, Image.open(path).convert("L")):
        assert changed.format in ("JPEG", None)
        with reencodings() as notes:
            (meta,), blob = encode_image(changed, OPTS)
        assert blob != path.read_bytes()
        if meta[0] * meta[1] > 65536:  # large pixels: JPEG at quality, said; small ones raw, exact
            assert len(notes) == 1 and "quality=90" in notes[0] and "PIL image" in notes[0]
    with pytest.raises(SchemaError, match="passthrough.*pixels"):
        encode_image(drawn, ImageOptions(mode="passthrough"))


def test_encoded_image_cells_become_what_is_stored_as_it_is(tmp_path):
    from fastload.fields.image import FileImage, encoded_image

    jpg = jpeg_bytes(20, 30, seed=1)
    assert encoded_image({"bytes": jpg, "path": "ignored.jpg"}) == jpg  # a Hugging Face image record
    got = encoded_image({"bytes": None, "path": str(tmp_path / "a.jpg")})
    assert isinstance(got, FileImage) and got.path == str(tmp_path / "a.jpg")
    assert encoded_image(jpg) is jpg
    with pytest.raises(SchemaError, match="neither bytes nor a path"):
        encoded_image({"bytes": None, "path": None})
