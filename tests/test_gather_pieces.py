"""The native gather of variable-length pieces (padded and packed token batches): bytes against a
numpy reference, threads, and bounds checks that leave the output untouched."""

from __future__ import annotations

import numpy as np
import pytest

from fastload._native import native

_C = native()


def reference(regions, region, offset, length, dst, out):
    flat = out.reshape(-1).view(np.uint8)
    for r, o, n, d in zip(region, offset, length, dst):
        flat[d:d + n] = np.frombuffer(regions[r], dtype=np.uint8)[o:o + n]


def random_pieces(rng, regions, n, out_bytes):
    """n disjoint pieces in out (in random order), each from a random place in a random region."""
    length = rng.integers(0, 300, n)
    gaps = rng.integers(0, 50, n)
    dst = np.cumsum(gaps + length) - length
    assert dst[-1] + length[-1] <= out_bytes
    region = rng.integers(0, len(regions), n)
    offset = np.array([rng.integers(0, len(regions[r]) - ln + 1) for r, ln in zip(region, length)])
    order = rng.permutation(n)
    return [a[order].astype(np.int64) for a in (region, offset, length, dst)]


@pytest.mark.parametrize("threads", [0, 2])
@pytest.mark.parametrize("n", [0, 1, 500, 20_000])  # 20,000 pieces is ~3 MiB: split across threads
def test_matches_numpy(threads, n):
    rng = np.random.default_rng(n)
    regions = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for size in (1000, 70_000, 300)]
    out = np.full(7_000_000, 0xAB, dtype=np.uint8)
    expected = out.copy()
    args = random_pieces(rng, regions, n, out.nbytes) if n else [np.zeros(0, np.int64)] * 4
    reference(regions, *args, expected)
    _C.gather_pieces(_C.Pool(threads), regions, *args, out)
    assert np.array_equal(out, expected)


def test_any_dtype_and_shape_of_out():
    regions = [np.arange(100, dtype=np.int32).tobytes()]
    out = np.full((2, 5), -1, dtype=np.int32)  # two rows padded to 5 tokens
    _C.gather_pieces(_C.Pool(0), regions, [0, 0], [4 * 10, 4 * 50], [4 * 3, 4 * 5], [0, 4 * 5], out)
    assert out.tolist() == [[10, 11, 12, -1, -1], [50, 51, 52, 53, 54]]


@pytest.mark.parametrize("field, value, pattern", [
    ("region", 3, r"piece 1: region\[1\]=3 is out of range \[0, 2\)"),
    ("region", -1, r"piece 1: region\[1\]=-1 is out of range"),
    ("offset", -4, r"piece 1: offset\[1\]=-4 is negative"),
    ("offset", 95, r"piece 1: offset\[1\]=95 \+ length\[1\]=10 is past the end of regions\[0\] \(100 bytes\)"),
    ("length", -1, r"piece 1: length\[1\]=-1 is negative"),
    ("length", 101, r"piece 1: offset\[1\]=0 \+ length\[1\]=101 is past the end of regions\[0\]"),
    ("dst", 60, r"piece 1: dst\[1\]=60 \+ length\[1\]=10 is outside out \(64 bytes\)"),
    ("dst", -1, r"piece 1: dst\[1\]=-1 \+ length\[1\]=10 is outside out"),
])
def test_bad_piece_is_named_and_out_untouched(field, value, pattern):
    regions = [bytes(range(100)), bytes(50)]
    args = {"region": [0, 0, 1], "offset": [0, 0, 0], "length": [10, 10, 10], "dst": [0, 20, 40]}
    args[field][1] = value
    out = np.full(64, 7, dtype=np.uint8)
    with pytest.raises(ValueError, match=pattern):
        _C.gather_pieces(_C.Pool(2), regions, args["region"], args["offset"], args["length"], args["dst"], out)
    assert (out == 7).all()


def test_argument_errors():
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
