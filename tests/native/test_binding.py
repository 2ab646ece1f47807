"""The binding files (csrc/binding.cc, csrc/bind_*), the only ones that know about Python: argument checking
with messages that give the value and the expectation, any contiguous bytes-like object as input, and the GIL
released around the work."""

import mmap
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from native_common import JPEG, _C, batch_args, run_batch

CSRC = Path(__file__).resolve().parents[2] / "csrc"


def test_only_binding_files_include_python():
    """The native core stays plain C++ (DESIGN: one binding layer, no Python.h elsewhere), so it can be
    tested, sanitized and reused without an interpreter; the bindings are thin and per area."""
    binding = {"binding.cc"} | {p.name for p in CSRC.glob("bind_*")}
    includes = re.compile(r'^\s*#\s*include\s*[<"](pybind11/|Python\.h)', re.M)
    offenders = sorted(p.name for p in CSRC.iterdir()
                       if p.suffix in (".cc", ".h") and p.name not in binding and includes.search(p.read_text()))
    assert offenders == [], f"csrc files outside the binding files include Python/pybind11: {offenders}"
    assert includes.search((CSRC / "bind_common.h").read_text()), "the pattern misses the bindings' own include"

def test_decode_accepts_buffer_objects(tmp_path):
    ref = _C.decode_jpeg(JPEG)
    path = tmp_path / "x.jpg"
    path.write_bytes(b"junk" + JPEG)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)[4:]
        assert np.array_equal(_C.decode_jpeg(view), ref)
        view.release()
    assert np.array_equal(_C.decode_jpeg(np.frombuffer(JPEG, np.uint8)), ref)
    assert np.array_equal(_C.decode_jpeg(bytearray(JPEG)), ref)
    with pytest.raises(TypeError, match="bytes-like"):
        _C.decode_jpeg(12)
    with pytest.raises((TypeError, ValueError)):
        _C.decode_jpeg(np.frombuffer(JPEG * 2, np.uint8)[::2])  # not contiguous


def test_batch_argument_validation():
    pool = _C.Pool(0)
    base = batch_args([(JPEG, 0, (375, 500), (0, 0, 375, 500), 0)] * 2)

    def call(**over):
        return run_batch(pool, {**base, **over})

    with pytest.raises(TypeError, match=r"out: expected a uint8 .*float32"):
        call(out=np.zeros((2, 8, 8, 3), np.float32))
    with pytest.raises(ValueError, match=r"expected shape \(2, H, W, 3\).*\(3, 8, 8, 3\)"):
        call(out=np.zeros((3, 8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match=r"\(2, H, W, 3\).*\(2, 8, 8, 4\)"):
        call(out=np.zeros((2, 8, 8, 4), np.uint8))
    with pytest.raises(ValueError, match="C-contiguous"):
        call(out=np.zeros((2, 8, 16, 3), np.uint8)[:, :, ::2])
    with pytest.raises(ValueError, match="C-contiguous"):
        call(out=np.zeros((2, 8, 8, 3), np.uint8, order="F"))
    ro = np.zeros((2, 8, 8, 3), np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        call(out=ro)
    with pytest.raises(ValueError, match=r"offset: expected shape \(2,\), got shape \(3,\)"):
        call(offset=np.zeros(3, np.int64))
    with pytest.raises(ValueError, match=r"crop: expected shape \(2, 4\)"):
        call(crop=np.zeros((2, 3), np.int32))
    with pytest.raises(TypeError, match=r"length: expected an integer array.*float64"):
        call(length=base["length"].astype(np.float64))
    with pytest.raises(ValueError, match="flip: value 2"):
        call(flip=np.array([0, 2]))
    with pytest.raises(TypeError, match="regions"):
        call(regions=b"not a list")
    with pytest.raises(TypeError, match=r"regions\[0\]"):
        call(regions=[42])
    # Integer dtypes that convert safely (and plain lists) are accepted.
    ok = {**base, "region": [0, 0], "offset": base["offset"].astype(np.int32),
          "crop": base["crop"].astype(np.int64), "flip": np.array([False, True])}
    assert run_batch(pool, ok) == []


def test_gather_rows_argument_validation():
    pool = _C.Pool(0)
    col = np.arange(100, dtype=np.int32)
    region, offset = np.zeros(4, np.int64), np.array([0, 4, 8, 12])

    def call(**over):
        args = dict(regions=[col], region=region, offset=offset, row_bytes=4,
                    out=np.zeros(4, np.int32))
        args.update(over)
        return _C.gather_rows(pool, **args)

    with pytest.raises(ValueError, match=r"out: has 12 bytes .* n \* row_bytes = 4 \* 4 = 16"):
        call(out=np.zeros(3, np.int32))
    with pytest.raises(ValueError, match=r"out: has 32 bytes"):
        call(out=np.zeros(4, np.int64))
    with pytest.raises(ValueError, match="C-contiguous"):
        call(out=np.zeros(8, np.int32)[::2])
    with pytest.raises(ValueError, match="C-contiguous"):
        call(out=np.zeros((2, 2), np.int32, order="F"), row_bytes=4)
    ro = np.zeros(4, np.int32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        call(out=ro)
    with pytest.raises(TypeError, match="out: expected a writable C-contiguous numpy array"):
        call(out=bytearray(16))
    with pytest.raises(TypeError, match="Python objects"):
        call(out=np.empty(2, object))
    with pytest.raises(ValueError, match="out overlaps regions\\[0\\]"):
        call(out=col[50:54])
    with pytest.raises(ValueError, match="row_bytes must be >= 0, got -4"):
        call(row_bytes=-4)
    with pytest.raises(ValueError, match="overflows"):
        call(row_bytes=2**62)
    with pytest.raises(ValueError, match=r"offset: expected shape \(4,\), got shape \(3,\)"):
        call(offset=offset[:3])
    with pytest.raises(TypeError, match=r"offset: expected an integer array.*float64"):
        call(offset=offset.astype(np.float64))
    with pytest.raises(TypeError, match=r"regions\[1\]"):
        call(regions=[col, 3])
    with pytest.raises(TypeError, match="regions"):
        call(regions=col)
    assert call() is None  # the defaults are valid


def test_gather_pieces_argument_validation():
    pool, regions = _C.Pool(0), [bytes(10)]
    with pytest.raises(ValueError, match="length"):  # arrays of different lengths
        _C.gather_pieces(pool, regions, [0, 0], [0, 0], [1], [0, 1], np.zeros(4, np.uint8))
    with pytest.raises(TypeError, match="out: expected a writable C-contiguous numpy array"):
        _C.gather_pieces(pool, regions, [0], [0], [1], [0], bytearray(4))
    with pytest.raises(ValueError, match="read-only"):
        ro = np.zeros(4, np.uint8)
        ro.flags.writeable = False
        _C.gather_pieces(pool, regions, [0], [0], [1], [0], ro)
    with pytest.raises(ValueError, match="C-contiguous"):
        _C.gather_pieces(pool, regions, [0], [0], [1], [0], np.zeros((4, 4), np.uint8)[:, 0])
    buf = np.zeros(16, np.uint8)
    with pytest.raises(ValueError, match="out overlaps regions"):
        _C.gather_pieces(pool, [buf], [0], [0], [1], [0], buf)


def test_gil_released_during_batch():
    pool = _C.Pool(1)
    args = batch_args([(JPEG, 0, (375, 500), (0, 0, 375, 500), 0)] * 40, (224, 224))
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    time.sleep(0.01)
    t0 = time.perf_counter()
    run_batch(pool, args, dct_scaling=False)
    t1 = time.perf_counter()
    stop.set()
    t.join()
    during = [x for x in ticks if t0 < x < t1]
    assert t1 - t0 < 0.02 or len(during) >= 3  # the ticker kept running while we decoded


def test_the_image_encodings_are_the_native_cores_and_python_takes_them_from_there():
    """csrc/batch.h defines the "meta" column's encodings once; _C exports them and formats/_layout.py (what the
    packer writes and the decoders read) takes them from _C."""
    from fastload.formats import _layout

    assert (_layout.IMAGE_JPEG, _layout.IMAGE_RAW) == (_C.IMAGE_JPEG, _C.IMAGE_RAW)
    assert _layout.IMAGE_ENCODINGS == (_C.IMAGE_JPEG, _C.IMAGE_RAW) and _C.IMAGE_JPEG != _C.IMAGE_RAW
    rgb = np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    for encoding, data in ((_C.IMAGE_RAW, rgb.tobytes()), (_C.IMAGE_JPEG, JPEG)):
        h, w = (8, 8) if encoding == _C.IMAGE_RAW else _C.jpeg_info(JPEG)[:2]
        args = batch_args([(data, encoding, (h, w), (0, 0, h, w), 0)], out_hw=(8, 8))
        assert run_batch(_C.Pool(0), args) == [], encoding  # each encoding is read as what its name says
    wrong = batch_args([(JPEG, _C.IMAGE_RAW, (8, 8), (0, 0, 8, 8), 0)], out_hw=(8, 8))
    assert run_batch(_C.Pool(0), wrong)  # JPEG bytes are not 8x8 raw pixels: refused, not misread
