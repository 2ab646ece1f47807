"""csrc/gather.cc: gather_rows (fixed-size rows of a column) and gather_pieces (variable-length pieces of
padded and packed token batches) against numpy, over regions of every kind and any thread count, with
bounds checks that name the bad row or piece and leave the output untouched."""

import mmap
import threading

import numpy as np
import pytest

from native_common import _C

ROW_KINDS = [  # (dtype, row shape): 1, 2, 3, 4, 7, 8, 16, 60 and 969 bytes, and larger than 4 KiB
    (np.uint8, ()), (np.int16, ()), (np.uint8, (3,)), (np.float32, ()), (np.uint8, (7,)),
    (np.int64, ()), (np.complex128, ()), (np.int32, (5, 3)), (np.uint8, (3, 17, 19)),
    (np.float64, (601,)),
]


def gather_columns(tmp_path, dtype, shape, counts=(40, 1, 25), seed=0):
    """One column split over regions of different kinds (bytes with a 5-byte header, an mmap'd
    file, a numpy array, ...). Returns (regions, headers, parts) where parts[i] is region i's rows
    as an array and headers[i] the bytes before its first row."""
    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, 256, (c,) + shape + (np.dtype(dtype).itemsize,), np.uint8)
             .view(dtype).reshape((c,) + shape) for c in counts]
    raw = [p.tobytes() for p in parts]
    path = tmp_path / "col.bin"
    path.write_bytes(b"\0" * 3 + raw[1])
    f = open(path, "rb")
    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    f.close()
    regions = [b"head!" + raw[0], mm, np.frombuffer(raw[2], np.uint8).copy()]
    return regions, [5, 3, 0], parts


def gather_ref(parts, region, index):
    """The rows numpy's fancy indexing picks from the concatenated column."""
    starts = np.cumsum([0] + [len(p) for p in parts[:-1]])
    return np.concatenate(parts)[starts[region] + index]


def pick(order, counts, n, rng):
    """(region, row index) pairs: random (with repeats), sequential runs, one row repeated."""
    if order == "random":
        region = rng.integers(0, len(counts), n)
        return region, rng.integers(0, np.array(counts)[region])
    if order == "sequential":  # region 0 from row 3 on, then all of region 2, then region 1
        seq = [(0, j) for j in range(3, counts[0])] + [(2, j) for j in range(counts[2])]
        seq = (seq + [(1, 0)]) * (n // len(seq) + 1)
        return np.array([s[0] for s in seq[:n]]), np.array([s[1] for s in seq[:n]])
    return np.full(n, 2), np.full(n, 7)  # repeated


def gather(pool, regions, region, offset, row_bytes, out):
    return _C.gather_rows(pool, regions, region, offset, row_bytes, out)


@pytest.mark.parametrize("dtype,shape", ROW_KINDS)
@pytest.mark.parametrize("order", ["random", "sequential", "repeated"])
def test_gather_rows_matches_numpy(tmp_path, dtype, shape, order):
    regions, headers, parts = gather_columns(tmp_path, dtype, shape)
    row_bytes = parts[0][0].nbytes
    rng = np.random.default_rng(7)
    region, index = pick(order, [len(p) for p in parts], 70, rng)
    offset = np.array(headers)[region] + index * row_bytes
    ref = gather_ref(parts, region, index)
    outs = []
    for threads in (0, 1, 2):
        out = np.full_like(ref, 0x5A if ref.dtype == np.uint8 else 3)
        assert gather(_C.Pool(threads), regions, region, offset, row_bytes, out) is None
        assert out.tobytes() == ref.tobytes()
        outs.append(out)
    # Rows are raw bytes: any dtype and shape of out with the right size will do.
    flat = np.zeros(ref.nbytes, np.uint8)
    gather(_C.Pool(0), regions, list(region), list(offset), row_bytes, flat)
    assert flat.tobytes() == ref.tobytes()
    regions[1].close()


@pytest.mark.parametrize("threads", [0, 1, 2, 3, 8])  # the pool's threads and the caller take chunks in turn
@pytest.mark.parametrize("row_bytes,n", [  # all above the 2 MiB that run in the calling thread
    (150_528, 70),   # 3x224x224 images: above the 8 MiB streaming-store threshold
    (200_003, 12),   # a few odd-sized huge rows: the two threads' chunks meet inside a row
    (4_097, 600),    # just above the row-aligned chunking limit
    (256, 9000),     # many small rows
    (70_001, 40),    # under the streaming threshold, rows of pages: memcpy with the pages touched ahead
])
def test_gather_rows_large_batches(threads, row_bytes, n):
    rng = np.random.default_rng(row_bytes)
    rows = n + 9
    column = rng.integers(0, 256, (rows, row_bytes), np.uint8)
    blob = b"xy" + column.tobytes()
    for index in (rng.integers(0, rows, n), np.arange(n) + 5, np.arange(n)[::-1] + 2):
        out = np.empty((n, row_bytes), np.uint8)
        gather(_C.Pool(threads), [column, blob], index % 2, 2 * (index % 2) + index * row_bytes,
               row_bytes, out)
        assert np.array_equal(out, column[index])


def in_threads(worker, n):
    """worker(seed) for seeds 0 .. n-1, in n Python threads at once; returns when all are done."""
    threads = [threading.Thread(target=worker, args=(s,)) for s in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_gather_rows_shared_pool_from_python_threads():
    column = np.random.default_rng(3).integers(0, 256, (300, 1024), np.uint8)
    pools = [_C.Pool(2), _C.Pool(0)]
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for i in range(20):
            idx = rng.integers(0, 300, int(rng.integers(1, 600)))
            out = np.empty((len(idx), 1024), np.uint8)
            gather(pools[i % 2], [column], np.zeros(len(idx), np.int64), idx * 1024, 1024, out)
            if not np.array_equal(out, column[idx]):
                errors.append(seed)

    in_threads(worker, 4)
    assert errors == []


def test_a_pool_of_no_threads_copies_large_gathers_with_its_copy_helpers():
    """``Pool(0).copy_helpers``: helper threads (started by the first gather of GATHER_INLINE_BYTES or more) copy
    chunks with the calling thread; smaller gathers and other pools never start them."""
    rng = np.random.default_rng(4)
    column = rng.integers(0, 256, (80, 150_528), np.uint8)
    pool = _C.Pool(0)
    assert (pool.copy_helpers, pool.copy_helpers_started) == (0, 0)
    pool.copy_helpers = 1
    small = rng.integers(0, 80, 10)  # 1.5 MB: the calling thread
    out = np.empty((10, 150_528), np.uint8)
    gather(pool, [column], np.zeros(10, np.int64), small * 150_528, 150_528, out)
    assert np.array_equal(out, column[small]) and pool.copy_helpers_started == 0
    for helpers in (1, 3, 0):
        pool.copy_helpers = helpers
        for index in (rng.integers(0, 80, 70), np.arange(70) + 3):
            out = np.empty((70, 150_528), np.uint8)
            gather(pool, [column], np.zeros(70, np.int64), index * 150_528, 150_528, out)
            assert np.array_equal(out, column[index])
        assert pool.copy_helpers_started == helpers
    with pytest.raises(ValueError, match="copy_helpers must be >= 0, got -1"):
        pool.copy_helpers = -1
    two = _C.Pool(2)
    two.copy_helpers = 1  # a pool with threads copies with its own
    out = np.empty((70, 150_528), np.uint8)
    gather(two, [column], np.zeros(70, np.int64), np.arange(70) * 150_528, 150_528, out)
    assert np.array_equal(out, column[:70]) and two.copy_helpers_started == 0


def test_large_gathers_share_a_pool_with_the_threads_of_other_calls():
    """Large row gathers (the caller takes chunks with the pool's threads, ``ThreadPool::run_shared``) and large
    piece gathers (the pool's threads alone, ``run``) from four Python threads over one pool: every batch whole,
    whichever run a pool thread wakes into late."""
    rng = np.random.default_rng(11)
    column = rng.integers(0, 256, (64, 70_001), np.uint8)
    blob = column.tobytes()
    pools = [_C.Pool(1), _C.Pool(2)]
    errors = []

    def worker(seed):
        r = np.random.default_rng(seed)
        for i in range(12):
            pool = pools[(seed + i) % 2]
            idx = r.integers(0, 64, int(r.integers(30, 64)))  # 2.1-4.5 MB: above the inline 2 MiB
            out = np.empty((len(idx), 70_001), np.uint8)
            if i % 3:
                gather(pool, [column], np.zeros(len(idx), np.int64), idx * 70_001, 70_001, out)
            else:
                k = len(idx)
                _C.gather_pieces(pool, [blob], np.zeros(k, np.int64), idx * 70_001, np.full(k, 70_001),
                                 np.arange(k) * 70_001, out)
            if not np.array_equal(out, column[idx]):
                errors.append((seed, i))

    in_threads(worker, 4)
    assert errors == []


@pytest.mark.parametrize("threads", [0, 2])
@pytest.mark.parametrize("region_k,offset_k,pattern", [
    (-1, 0, r"row {k}: region\[{k}\]=-1 is out of range \[0, 2\)"),
    (2, 0, r"row {k}: region\[{k}\]=2 is out of range \[0, 2\)"),
    (1, -8, r"row {k}: offset\[{k}\]=-8 is negative"),
    (1, 8 * 40 - 8 + 1, r"row {k}: offset\[{k}\]=313 \+ row_bytes=8 is past the end of "
                        r"regions\[1\] \(320 bytes\)"),
    (0, 20, r"offset\[{k}\]=20 \+ row_bytes=8 is past the end of regions\[0\] \(24 bytes\)"),
    (1, 2**63 - 1, r"offset\[{k}\]=9223372036854775807 \+ row_bytes=8 is past the end"),
])
def test_gather_rows_bounds_raise_and_leave_out_untouched(threads, region_k, offset_k, pattern):
    regions = [bytes(range(24)), np.arange(40, dtype=np.int64)]
    n = 300_000 if threads else 50  # threaded: above the 2 MiB that run in the calling thread
    rng = np.random.default_rng(0)
    region = np.ones(n, np.int64)
    offset = rng.integers(0, 40, n) * 8
    k = n - 1  # the last row: nothing may be copied before every row is checked
    region[k], offset[k] = region_k, offset_k
    out = np.full(n, -7, np.int64)
    with pytest.raises(ValueError, match=pattern.format(k=k)):
        gather(_C.Pool(threads), regions, region, offset, 8, out)
    assert (out == -7).all()
    # The first of several bad rows is the one named.
    region[3] = 5
    with pytest.raises(ValueError, match=r"row 3: region\[3\]=5"):
        gather(_C.Pool(threads), regions, region, offset, 8, out)


def test_gather_rows_region_smaller_than_a_row():
    out = np.zeros((1, 10), np.uint8)
    with pytest.raises(ValueError, match=r"row 0: offset\[0\]=0 \+ row_bytes=10 .*\(4 bytes\)"):
        gather(_C.Pool(0), [b"abcd"], [0], [0], 10, out)
    assert not out.any()


def test_gather_rows_empty():
    pool = _C.Pool(2)
    gather(pool, [b"abc"], np.zeros(0, np.int64), np.zeros(0, np.int64), 3,
           np.empty((0, 3), np.uint8))
    gather(pool, [], [], [], 5, np.empty(0, np.uint8))
    # Zero-byte rows: offsets must still lie inside their region.
    gather(pool, [b"abc"], [0, 0], [0, 3], 0, np.empty(0, np.uint8))
    with pytest.raises(ValueError, match=r"row 1: offset\[1\]=4"):
        gather(pool, [b"abc"], [0, 0], [0, 4], 0, np.empty(0, np.uint8))


# -- gather_pieces -----------------------------------------------------------------------------------

def pieces_reference(regions, region, offset, length, dst, out):
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
def test_gather_pieces_matches_numpy(threads, n):
    rng = np.random.default_rng(n)
    regions = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for size in (1000, 70_000, 300)]
    out = np.full(7_000_000, 0xAB, dtype=np.uint8)
    expected = out.copy()
    args = random_pieces(rng, regions, n, out.nbytes) if n else [np.zeros(0, np.int64)] * 4
    pieces_reference(regions, *args, expected)
    _C.gather_pieces(_C.Pool(threads), regions, *args, out)
    assert np.array_equal(out, expected)


def test_gather_pieces_any_dtype_and_shape_of_out():
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
