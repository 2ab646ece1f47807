"""csrc/batch.cc: decode_batch over mixed JPEG and raw samples matches the one-sample calls, flips exactly,
gives the same bytes for any thread count, and reports (and zeroes) failed samples one by one."""

import numpy as np
import pytest

from native_common import (DCT_TOLERANCE, JPEG, _C, batch_args, mad, mixed_samples, photo, pil_crop_resize,
                           pil_rgb, run_batch)

RNG = np.random.default_rng(1234)

def test_batch_matches_single_sample_api():
    samples = mixed_samples()
    args = batch_args(samples, (48, 40))
    assert run_batch(_C.Pool(2), args) == []
    for k, (data, enc, hw, crop, flip) in enumerate(samples):
        if enc == 0:
            ref = _C.decode_crop_resize(data, crop, (48, 40), bool(flip))
        else:
            src = np.frombuffer(data, np.uint8).reshape(hw[0], hw[1], 3)
            ref = _C.resize_crop(src, crop, (48, 40), bool(flip))
            assert mad(args["out"][k], pil_crop_resize(src, crop, (48, 40))[:, ::-1 if flip else 1]) <= 0.5
        assert np.array_equal(args["out"][k], ref), k


def test_batch_flip_is_exact_mirror():
    samples = mixed_samples()
    a = batch_args([s[:4] + (0,) for s in samples])
    b = batch_args([s[:4] + (1,) for s in samples])
    pool = _C.Pool(1)
    assert run_batch(pool, a) == [] and run_batch(pool, b) == []
    assert np.array_equal(b["out"], a["out"][:, :, ::-1])


def test_thread_counts_give_identical_bytes():
    samples = mixed_samples() * 3
    samples.append((JPEG[:1000], 0, (375, 500), (0, 0, 375, 500), 0))  # a failure among them
    results = []
    for threads in (0, 1, 2):
        args = batch_args(samples, (56, 56))
        fails = run_batch(_C.Pool(threads), args)
        results.append((args["out"].tobytes(), [k for k, _ in fails]))
    assert results[0] == results[1] == results[2]
    assert results[0][1] == [len(samples) - 1]


def test_dct_scaling_flag_in_batch():
    args = batch_args([(JPEG, 0, (375, 500), (0, 0, 375, 500), 0)], (40, 50))
    pool = _C.Pool(0)
    assert run_batch(pool, args, dct_scaling=False) == []
    exact = args["out"][0].copy()
    assert run_batch(pool, args) == []
    ref = pil_crop_resize(pil_rgb(JPEG), (0, 0, 375, 500), (40, 50))
    assert mad(exact, ref) <= 0.5 and mad(args["out"][0], ref) <= DCT_TOLERANCE
    assert not np.array_equal(exact, args["out"][0])  # 1/4 scaling did happen


def failure_cases():
    good = (JPEG, 0, (375, 500), (0, 0, 375, 500), 0)
    raw = photo(10, 12).tobytes()
    return {
        "truncated": ((JPEG[: len(JPEG) // 2], 0, (375, 500), (0, 0, 375, 500), 0), "Premature"),
        "random bytes": ((bytes(RNG.integers(0, 256, 3000, dtype=np.uint8)), 0, (375, 500),
                          (0, 0, 375, 500), 0), "JPEG"),
        "empty": ((b"", 0, (375, 500), (0, 0, 375, 500), 0), "Empty"),
        "src_hw mismatch": ((JPEG, 0, (375, 501), (0, 0, 375, 500), 0), "recorded size"),
        "crop outside": ((JPEG, 0, (375, 500), (300, 0, 76, 500), 0), "not inside"),
        "crop negative": ((JPEG, 0, (375, 500), (0, -1, 10, 10), 0), "not inside"),
        "crop empty": ((JPEG, 0, (375, 500), (0, 0, 0, 10), 0), "not inside"),
        "raw length": ((raw[:-1], 1, (10, 12), (0, 0, 10, 12), 0), "expected"),
        "raw crop": ((raw, 1, (10, 12), (0, 0, 10, 13), 0), "not inside"),
        "bad encoding": ((raw, 7, (10, 12), (0, 0, 10, 12), 0), "encoding"),
        "zero src_hw": ((raw, 1, (0, 12), (0, 0, 10, 12), 0), "positive"),
        "good": (good, None),
    }


def test_failures_are_reported_and_zeroed():
    cases = failure_cases()
    names = list(cases)
    args = batch_args([cases[n][0] for n in names])
    fails = dict(run_batch(_C.Pool(2), args))
    for k, name in enumerate(names):
        pattern = cases[name][1]
        if pattern is None:
            assert k not in fails and args["out"][k].any()
        else:
            assert pattern in fails[k], (name, fails.get(k))
            assert not args["out"][k].any(), name


@pytest.mark.parametrize("field,value,pattern", [
    ("region", 1, "region index 1 out of range"),
    ("region", -1, "region index -1"),
    ("offset", -1, "outside region"),
    ("offset", 10**12, "outside region"),
    ("length", -5, "outside region"),
    ("length", 10**12, "outside region"),
    ("offset", 2**62, "outside region"),  # offset + length would overflow
])
def test_bad_byte_ranges_fail_the_sample(field, value, pattern):
    args = batch_args([(JPEG, 0, (375, 500), (0, 0, 375, 500), 0)] * 2)
    if field == "offset" and value == 2**62:
        args["length"][1] = 2**62
    args[field][1] = value
    fails = run_batch(_C.Pool(1), args)
    assert [k for k, _ in fails] == [1] and pattern in fails[0][1]
    assert args["out"][0].any() and not args["out"][1].any()


def test_zero_samples():
    args = batch_args([(JPEG, 0, (375, 500), (0, 0, 375, 500), 0)])
    empty = {k: (v[:0] if isinstance(v, np.ndarray) else v) for k, v in args.items()}
    assert run_batch(_C.Pool(2), empty) == []
