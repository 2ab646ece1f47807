"""fastload.DataLoader: the drop-in contract, determinism, resume, slot safety, errors, shutdown."""

from __future__ import annotations

import inspect
import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader as TorchLoader

import fastload
from fastload import transforms as T

from conftest import make_image_folder, resumed_and_reference, open_train


# 103 rows of plain arrays, both formats: torch's own loader batches these too (no images), for comparisons
@pytest.fixture(scope="module", params=["shards", "lmdb"])
def packed_arrays(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("arrays")
    rng = np.random.default_rng(0)
    data = {"x": rng.random((103, 5), dtype=np.float32), "y": np.arange(103), "w": rng.random(103)}
    fastload.pack(data, root / "ds", shard_size="2K", format=request.param)
    return root / "ds", data


def test_lmdb_and_shards_give_the_same_batches(packed_images_by_format):
    runs = []
    for fmt in ("shards", "lmdb"):
        dl = fastload.DataLoader(open_train(packed_images_by_format / fmt), batch_size=5, shuffle=True, seed=2,
                                 num_workers=2)
        assert dl.fast_path
        runs.append([(b[0].clone(), b[1].clone()) for b in dl])
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(*runs))


def test_signature_matches_torch():
    ours = inspect.signature(fastload.DataLoader.__init__).parameters
    theirs = inspect.signature(TorchLoader.__init__).parameters
    for name, p in theirs.items():
        assert name in ours, name
        assert ours[name].default == p.default and ours[name].kind == p.kind, name
    assert list(ours)[: len(theirs)] == list(theirs)
    extra = [n for n in ours if n not in theirs]
    assert all(ours[n].kind == inspect.Parameter.KEYWORD_ONLY for n in extra)
    assert {"device", "seed"} <= set(extra)


@pytest.mark.parametrize("kwargs", [
    dict(shuffle=True, sampler=[0, 1]),
    dict(batch_sampler=[[0]], batch_size=2),
    dict(num_workers=-1),
    dict(prefetch_factor=2),
    dict(persistent_workers=True),
    dict(batch_sampler=[[0]], drop_last=True),
])
def test_same_errors_as_torch(packed_arrays, kwargs):
    ds = fastload.open(packed_arrays[0])
    with pytest.raises(ValueError) as theirs:
        TorchLoader(ds, **kwargs)
    with pytest.raises(ValueError) as ours:
        fastload.DataLoader(ds, **kwargs)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("as_dict", [False, True])
def test_same_batches_and_structure_as_torch(packed_arrays, drop_last, as_dict):
    ds = fastload.open(packed_arrays[0], as_dict=as_dict)
    ours = fastload.DataLoader(ds, batch_size=10, drop_last=drop_last)
    theirs = TorchLoader(ds, batch_size=10, drop_last=drop_last)
    assert ours.fast_path and len(ours) == len(theirs)
    got, want = list(ours), list(theirs)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert type(a) is type(b)
        items = a.items() if as_dict else enumerate(a)
        for k, v in items:
            assert v.dtype == b[k].dtype and torch.equal(v, b[k])


def test_images_channels_last_and_close_to_per_sample(image_shards):
    ds = open_train(image_shards)
    batch = next(iter(fastload.DataLoader(ds, batch_size=8, num_workers=2)))
    images, labels = batch
    assert images.shape == (8, 3, 32, 32) and images.dtype == torch.uint8
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert labels.dtype == torch.int64 and labels.tolist() == [ds[i][1] for i in range(8)]
    # without randomness the loader and ds[i] use the same kernels: identical pixels
    plain = fastload.open(image_shards, transforms={"image": [T.Resize((24, 20))]})
    imgs, _ = next(iter(fastload.DataLoader(plain, batch_size=5)))
    for i in range(5):
        assert torch.equal(imgs[i], plain[i][0])


@pytest.mark.parametrize("order", ["sequential", "random", "quasi"])
def test_batches_independent_of_num_workers(image_shards, order):
    runs = []
    for workers in (0, 1, 2):
        dl = fastload.DataLoader(open_train(image_shards), batch_size=6, num_workers=workers, seed=7, order=order)
        runs.append([(b[0].clone(), b[1].clone()) for b in dl])
    for other in runs[1:]:
        assert len(other) == len(runs[0])
        for (a, la), (b, lb) in zip(runs[0], other):
            assert torch.equal(a, b) and torch.equal(la, lb)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_newer_iterator_stops_the_older_one_and_gets_the_right_batches(image_shards, workers):
    """Two iterators of one loader both filling the loader's slots handed out each other's batches (num_workers=2:
    wrong labels and pixels, silently). A new iteration now stops the older one, whose next() says why; the
    newer one gets what the same sequence gives run one after the other: an abandoned epoch, then the next."""
    kw = dict(batch_size=4, shuffle=True, seed=3, num_workers=workers)
    ref_loader = fastload.DataLoader(open_train(image_shards), **kw)
    it = iter(ref_loader)
    head = [tuple(t.clone() for t in next(it)) for _ in range(3)]
    del it
    ref_next = [tuple(t.clone() for t in b) for b in ref_loader]

    loader = fastload.DataLoader(open_train(image_shards), **kw)
    a = iter(loader)
    got_head = [tuple(t.clone() for t in next(a)) for _ in range(3)]
    b = iter(loader)
    got_next = [tuple(t.clone() for t in x) for x in b]
    for (x, y), (rx, ry) in zip(got_head + got_next, head + ref_next, strict=True):
        assert torch.equal(y, ry) and torch.equal(x, rx)
    with pytest.raises(RuntimeError, match="newer iter\\(loader\\) of the same loader"):
        next(a)
    with pytest.raises(StopIteration):  # an iterator that had run out stays run out
        next(b)
    c = iter(loader)
    next(c)
    with pytest.raises(StopIteration):
        next(b)


def test_epochs_differ_and_set_epoch_repeats(packed_arrays):
    ds = fastload.open(packed_arrays[0])
    dl = fastload.DataLoader(ds, batch_size=103, shuffle=True, seed=1)
    e0 = next(iter(dl))[1].clone()
    e1 = next(iter(dl))[1].clone()
    assert not torch.equal(e0, e1) and sorted(e0.tolist()) == list(range(103))
    dl.set_epoch(0)
    assert torch.equal(next(iter(dl))[1], e0)


@pytest.mark.parametrize("workers_after", [0, 2])
def test_resume_mid_epoch_bit_for_bit(image_shards, workers_after):
    make = lambda w: fastload.DataLoader(open_train(image_shards), batch_size=4, shuffle=True,  # noqa: E731
                                         num_workers=w, seed=3)
    rest, ref = resumed_and_reference(make, workers_after)
    assert len(rest) == len(ref)
    assert all(torch.equal(a, b) for a, b in zip(rest, ref))


def test_held_batches_are_never_overwritten(image_shards):
    dl = fastload.DataLoader(open_train(image_shards), batch_size=4, shuffle=True, num_workers=2, seed=0)
    held = list(dl)  # the caller keeps every batch: the ring must grow, not alias
    again = [b[0].clone() for b in fastload.DataLoader(open_train(image_shards), batch_size=4, shuffle=True,
                                                        num_workers=2, seed=0)]
    assert all(torch.equal(h[0], a) for h, a in zip(held, again))
    assert len({h[0].data_ptr() for h in held}) == len(held)
    # a loop that drops each batch reuses a small ring
    dl2 = fastload.DataLoader(open_train(image_shards), batch_size=4, num_workers=2)
    for _ in range(3):
        for batch in dl2:
            pass
    assert dl2.stats()["slots"] <= 5


def test_corrupt_jpeg_named_or_skipped(tmp_path):
    folder = make_image_folder(tmp_path / "src", classes=2, per_class=6)
    fastload.pack(folder, tmp_path / "ds", workers=0)
    shard = next((tmp_path / "ds").glob("shard-*.fls"))
    data = bytearray(shard.read_bytes())
    ds = fastload.open(tmp_path / "ds", decode=False)
    seg, local = ds.locate(5)
    start = seg.data_start["image"] + int(seg.offsets["image"][local])
    data[start + 200:start + 260] = b"\x00" * 60  # inside sample 5's entropy-coded data
    shard.write_bytes(bytes(data))
    dl = fastload.DataLoader(open_train(tmp_path / "ds"), batch_size=12)
    with pytest.raises(fastload.DecodeError, match=rf"{shard.name}.*sample 5"):
        next(iter(dl))
    dl = fastload.DataLoader(open_train(tmp_path / "ds"), batch_size=12, on_error="skip")
    images, labels = next(iter(dl))
    assert images.shape[0] == 12 and dl.stats()["skipped"] == 1


def test_generic_path_is_torch(image_shards):
    plain = fastload.open(image_shards)  # no transforms: images differ in size, torch's path and errors
    dl = fastload.DataLoader(plain, batch_size=1)
    assert not dl.fast_path and "fixed output size" in dl.fast_path_reason
    assert next(iter(dl))[0].shape[0] == 1
    tds = torch.utils.data.TensorDataset(torch.arange(10))
    assert [b[0].tolist() for b in fastload.DataLoader(tds, batch_size=4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert isinstance(fastload.DataLoader(tds), TorchLoader)


def test_distributed_ranks_partition(packed_arrays):
    path, data = packed_arrays
    seen = []
    counts = set()
    for rank in range(3):
        dl = fastload.DataLoader(fastload.open(path), batch_size=8, shuffle=True, seed=5, rank=rank, world_size=3)
        ys = torch.cat([b[1] for b in dl]).tolist()
        counts.add(len(dl))
        seen.extend(ys)
    assert len(counts) == 1
    assert set(seen) == set(range(103)) and len(seen) == 105  # padded to a multiple of 3, like DistributedSampler


def test_ctrl_c_in_a_real_process_exits_promptly(image_shards, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "loop.py"
    script.write_text(f"""
import sys, time, fastload
from fastload import transforms as T
ds = fastload.open({str(image_shards)!r}, transforms={{"image": [T.RandomResizedCrop(32)]}})
dl = fastload.DataLoader(ds, batch_size=4, num_workers=2)
while True:
    for b in dl:
        print("batch", flush=True)
        time.sleep(0.01)
""")
    import os
    from pathlib import Path

    env = dict(os.environ, PYTHONPATH=str(Path(fastload.__file__).parent.parent))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout.readline().strip() == "batch"
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the process hung after Ctrl-C")
    assert proc.returncode != 0 and "KeyboardInterrupt" in err


def _digest_rank(path: Path, rank: int, world: int) -> str:
    import hashlib

    h = hashlib.sha256()
    ds = fastload.open(path, transforms={"image": [T.RandomResizedCrop(24), T.RandomHorizontalFlip()]})
    for images, labels in fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=11, rank=rank,
                                              world_size=world, num_workers=2):
        h.update(images.numpy().tobytes())
        h.update(labels.numpy().tobytes())
    raw = fastload.open(path, decode=False)
    whole = hashlib.sha256(b"".join(raw[i][0] + raw[i][1].to_bytes(8, "little") for i in range(len(raw))))
    return h.hexdigest() + ":" + whole.hexdigest()


@pytest.mark.timeout(120)
def test_eight_concurrent_readers_get_the_bytes_of_one(packed_images):
    """Eight processes reading one dataset at the same time, each its rank's part, get what one alone gets."""
    path = packed_images
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(8)
    queue = ctx.Queue()

    def reader(rank):
        barrier.wait(timeout=30)  # all eight read at the same time
        queue.put((rank, _digest_rank(path, rank, 8)))

    procs = [ctx.Process(target=reader, args=(r,)) for r in range(8)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=90) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    alone = {r: _digest_rank(path, r, 8) for r in range(8)}
    assert got == alone
    assert len({d.split(":")[0] for d in got.values()}) == 8  # each rank read its own part
    assert len({d.split(":")[1] for d in got.values()}) == 1  # and every process saw the same dataset
