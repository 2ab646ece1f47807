"""Randomness keyed per sample (issue 31 item 2): a sample's crop, flip, augmentation and user-callable draws depend
only on (seed, epoch, sample index) -- and, for a sample read again in the epoch, its occurrence
(test_repeated_reads.py) -- so the same sample gets the same pixels whatever the batch size, the number of
workers, the rank or the world size. Each configuration loads a shuffled epoch of numbered samples; the pixels are
compared by sample id."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
import fastload.transforms as T
from fastload._draws import SampleDraws

pytest.importorskip("fastload._C")

N = 23  # not a multiple of 4, 6 or 2 x 6: the batches of the two configurations cut the epoch differently


def noisy(img):
    """A user callable fastload does not know (a uint8 CHW tensor in and out, run in the per-sample fallback,
    seeded per sample): noise from numpy's global generator."""
    noise = torch.from_numpy(np.random.randint(-40, 40, size=tuple(img.shape)))
    return (img.to(torch.int16) + noise).clamp(0, 255).to(torch.uint8)


PIPELINES = {
    "crop_flip": lambda: [T.RandomResizedCrop((24, 28), scale=(0.2, 1.0)), T.RandomHorizontalFlip()],
    "augment": lambda: [
        T.RandomResizedCrop((24, 28), scale=(0.2, 1.0)),
        T.RandomHorizontalFlip(),
        T.RandomRotation(30),
        T.TrivialAugmentWide(),
    ],
    "user_callable": lambda: [T.RandomResizedCrop((24, 28)), noisy],
}


def by_id(path, pipeline, epochs, batch_size, num_workers, world_size) -> dict:
    """{(epoch, sample id): pixels} of a shuffled run, the ranks' batches put together."""
    out: dict = {}
    for rank in range(world_size):
        ds = fastload.open(path, transforms={"image": pipeline()}, as_dict=True)
        dl = fastload.DataLoader(
            ds,
            batch_size=batch_size,
            shuffle=True,
            num_workers=num_workers,
            seed=7,
            rank=rank,
            world_size=world_size,
            drop_last=False,
        )
        for epoch in range(epochs):
            dl.set_epoch(epoch)
            for batch in dl:
                images, ids = batch["image"], batch["id"]
                for img, i in zip(images, ids.tolist()):
                    out.setdefault((epoch, i), img.numpy().copy())  # a padding copy, read later, draws anew
    return out


@pytest.mark.filterwarnings("ignore::fastload.FastPathWarning")  # the user callable runs per sample, as meant
@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_same_pixels_in_any_configuration(numbered, name):
    path = numbered(N)
    a = by_id(path, PIPELINES[name], 2, batch_size=4, num_workers=0, world_size=1)
    b = by_id(path, PIPELINES[name], 2, batch_size=6, num_workers=2, world_size=2)
    assert set(a) == {(e, i) for e in range(2) for i in range(N)}
    assert set(b) == set(a)  # wrap padding repeats a sample (a second read, its own draws): its first read kept
    differ = sorted(k for k in a if not np.array_equal(a[k], b[k]))
    assert not differ, f"{len(differ)} of {len(a)} (epoch, sample) pairs got other pixels: {differ[:8]}"
    # and the draws are random: epochs differ, samples differ
    assert sum(not np.array_equal(a[(0, i)], a[(1, i)]) for i in range(N)) > N // 2


def test_sample_draws_depend_on_index_alone():
    """The draws of sample 7 are the same in any batch around it; another epoch or seed draws others."""
    small, big = SampleDraws(3, 1, [7, 2]), SampleDraws(3, 1, [5, 9, 7, 1])
    for d in (small, big):
        d.u, d.k, d.s = d.random((d.n, 10)), d.integers(0, np.arange(d.n) + 50), d.integers(0, 2**63, d.n, np.uint64)
    assert np.array_equal(small.u[0], big.u[2])
    assert small.s[0] == big.s[2]
    other = SampleDraws(3, 2, [7])
    assert not np.array_equal(other.random((1, 10))[0], small.u[0])


def test_sample_draws_are_uniform():
    """Floats in [0, 1) and integers in [low, high) with the right moments (the crop distributions rest on them)."""
    d = SampleDraws(0, 0, np.arange(200_000))
    u = d.random(d.n)
    assert 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
    k = d.integers(3, 10)
    assert k.min() == 3 and k.max() == 9
    counts = np.bincount(k - 3) / k.size
    assert np.all(np.abs(counts - 1 / 7) < 0.005)
    s = d.integers(0, 2**63, size=d.n, dtype=np.uint64)
    assert s.dtype == np.uint64 and int(s.max()) < 2**63 and int(s.max()) > 2**62
    with pytest.raises(ValueError, match="one row per sample"):
        d.random(5)


def every_random_augmentation():
    """Every random transform fastload plans, the ones drawing for subsets of a batch (RandomApply, RandomChoice,
    RandomOrder, RandomErasing, the policies' chosen operations) included."""
    return [
        T.RandomResize(30, 60),
        T.RandomCrop((28, 32), padding=4, pad_if_needed=True),
        T.RandomHorizontalFlip(),
        T.RandomApply([T.RandomRotation(20), T.GaussianBlur(3, sigma=(0.1, 2.0))], p=0.5),
        T.RandomChoice([T.RandomGrayscale(0.5), T.RandomSolarize(100, p=0.5), T.RandomInvert(0.5)]),
        T.RandomOrder([T.ColorJitter(0.3, 0.3, 0.3, 0.1), T.RandomAffine(10, translate=(0.1, 0.1), scale=(0.8, 1.2),
                                                                         shear=(-5, 5, -5, 5))]),
        T.TrivialAugmentWide(),
        T.RandAugment(2, 9, magnitude_std=0.5) if _has_std() else T.RandAugment(2, 9),
        T.AutoAugment(),
        T.ThreeAugment(color_jitter=0.3),
        T.RandomVerticalFlip(0.5),
        T.RandomErasing(p=0.5, value="random"),
    ]


def _has_std() -> bool:
    import inspect

    return "magnitude_std" in inspect.signature(T.RandAugment).parameters


def per_sample(plan, k: int):
    g = plan.augment.geometry
    return (
        plan.crops[k].tolist(), plan.out_hw[k].tolist(), bool(g.hflip[k]), bool(g.vflip[k]), g.affine[k].tolist(),
        [(op, {c: np.asarray(v).tolist() for c, v in row.items()}) for op, row in plan.augment.ops_of(k)],
    )


def test_every_augmentation_plans_a_sample_the_same_in_any_batch():
    """The plan of a sample (crop, flips, affine, every pixel operation and its parameters) is the same in a batch
    of 40 and in a batch of 3 around it, though the others drew other operations."""
    pipe = T.ImagePipeline(every_random_augmentation())
    rng = np.random.default_rng(1)
    idx = np.arange(100, 140)
    hw = {int(i): (int(rng.integers(20, 80)), int(rng.integers(20, 80))) for i in idx}

    def plan(ids):
        return pipe.plan(np.array([hw[i][0] for i in ids]), np.array([hw[i][1] for i in ids]), SampleDraws(5, 2, ids))

    big = plan(list(map(int, idx)))
    assert len({str(per_sample(big, k)[5]) for k in range(40)}) > 20  # the samples drew different operations
    for trio in ([117, 100, 139], [139, 120, 101], [105]):
        small = plan(trio)
        for j, i in enumerate(trio):
            assert per_sample(small, j) == per_sample(big, i - 100), f"sample {i} planned differently in {trio}"


def _splitmix(v: int) -> int:
    """SplitMix64's finaliser on a Python int: the reference the vectorised draws must equal bit for bit."""
    m = (1 << 64) - 1
    v = (v + 0x9E3779B97F4A7C15) & m
    v = ((v ^ (v >> 30)) * 0xBF58476D1CE4E5B9) & m
    v = ((v ^ (v >> 27)) * 0x94D049BB133111EB) & m
    return v ^ (v >> 31)


def test_the_draws_are_splitmix64_of_sample_call_and_column_bit_for_bit():
    from fastload._draws import epoch_key, mix64

    values = np.array([0, 1, 2**63 + 5, 2**64 - 1, 0x1234_5678_9ABC_DEF0], dtype=np.uint64)
    keep = values.copy()
    with np.errstate(all="raise"):  # array arithmetic wraps unchecked: no overflow error, no warning
        got = mix64(values)
        assert int(mix64(np.uint64(2**64 - 1))) == _splitmix(2**64 - 1)  # a numpy scalar takes its own path
    assert got.tolist() == [_splitmix(int(v)) for v in keep]
    assert np.array_equal(values, keep)  # the caller's array is not mixed in place
    m = (1 << 64) - 1
    idx = np.array([7, 3, 2**40 + 11])
    SampleDraws(5, 3, idx)  # another epoch's key asked (and kept) first: epoch_key keeps each apart
    draws = SampleDraws(np.int64(5), 2, idx)
    # the epoch's key: numpy's SeedSequence of ("SAMP", seed, epoch) as 32-bit words, whatever epoch_key keeps
    ek = int(np.random.SeedSequence([0x53414D50, 5, 0, 2, 0]).generate_state(1, np.uint64)[0])
    assert epoch_key(5, 2) == ek
    keys = [_splitmix(ek ^ _splitmix(int(i))) for i in idx]
    with np.errstate(all="raise"):
        draws.random((3, 4))  # call 1
        words = draws._words((3, 4))  # call 2: (sample, column) -> mix(key ^ mix(2 * golden + column))
    want = [[_splitmix(keys[r] ^ _splitmix((2 * 0x9E3779B97F4A7C15 + c) & m)) for c in range(4)] for r in range(3)]
    assert words.tolist() == want
