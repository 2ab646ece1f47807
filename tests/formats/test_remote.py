"""Remote datasets (formats/remote.py, formats/_cache.py) against real servers on localhost: moto's S3
server (a process of its own), a TCP proxy that cuts or slows its connections, and an HTTP file server
that corrupts or drops chosen responses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload import FormatError, RemoteError
from fastload.transforms import RandomResizedCrop

from remote_common import FaultProxy, FileServer, MotoServer, upload

pytestmark = pytest.mark.timeout(240)
TF = {"image": [RandomResizedCrop(24)]}


@pytest.fixture(scope="module")
def moto():
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def bucket(moto, photos) -> str:
    fs = moto.fs()
    fs.mkdir("data")
    upload(fs, photos, "data/photos")
    return "s3://data/photos"


def shard_count(photos: Path) -> int:
    return len(json.loads((photos / "manifest.json").read_text())["shards"])


def batches(ds, **kw) -> list:
    kw.setdefault("batch_size", 5)
    return [[t.clone() for t in b] for b in fastload.DataLoader(ds, **kw)]


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(len(x) == len(y) and all(torch.equal(u, v) for u, v in zip(x, y))
                                    for x, y in zip(a, b))


def cached_files(cache: Path, suffix: str) -> list[Path]:
    return sorted(p for p in cache.glob("*/*") if p.name.endswith(suffix))


def test_open_reads_only_the_manifest(moto, bucket, photos, tmp_path):
    ds = fastload.open(bucket, cache_dir=tmp_path / "c", storage_options=moto.options())
    assert len(ds) == len(fastload.open(photos)) and ds.remote and ds.schema == fastload.open(photos).schema
    assert ds.remote_stats()["downloads"] == 0
    assert cached_files(tmp_path / "c", ".fls") == []
    assert ds[7][1] == fastload.open(photos)[7][1]  # one sample: one shard, no more
    assert ds.remote_stats()["downloads"] == 1


@pytest.mark.parametrize("order", ["random", "quasi"])
def test_epochs_equal_local_bit_for_bit(moto, bucket, photos, tmp_path, order):
    kw = dict(order=order, seed=11, num_workers=2, window=2)
    remote = fastload.open(bucket, cache_dir=tmp_path / "c", storage_options=moto.options(), transforms=TF)
    local = fastload.open(photos, transforms=TF)
    rl, ll = fastload.DataLoader(remote, batch_size=5, **kw), fastload.DataLoader(local, batch_size=5, **kw)
    for epoch in range(2):  # a cold cache, then a warm one
        assert same([[t.clone() for t in b] for b in rl], [[t.clone() for t in b] for b in ll]), epoch
    stats = rl.stats()["remote"]
    assert stats["downloads"] == shard_count(photos)  # every shard once, none twice
    assert stats["hits"] >= shard_count(photos)  # the second epoch found them all
    assert stats["retries"] == stats["corrupt_downloads"] == 0
    # single-threaded fill takes the same plan
    assert same(batches(remote, order=order, seed=11, window=2), batches(local, order=order, seed=11, window=2))


def test_resume_mid_epoch_from_a_fresh_cache(moto, bucket, photos, tmp_path):
    kw = dict(shuffle=True, seed=5, num_workers=1, batch_size=4)
    first = fastload.DataLoader(fastload.open(bucket, cache_dir=tmp_path / "a", storage_options=moto.options(),
                                              transforms=TF), **kw)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    del it
    again = fastload.DataLoader(fastload.open(bucket, cache_dir=tmp_path / "b", storage_options=moto.options(),
                                              transforms=TF), **kw)
    again.load_state_dict(state)
    reference = batches(fastload.open(photos, transforms=TF), **kw)
    assert same([[t.clone() for t in b] for b in again], reference[3:])


def test_eviction_keeps_the_cache_under_its_limit(moto, bucket, photos, tmp_path):
    sizes = [s["bytes"] for s in json.loads((photos / "manifest.json").read_text())["shards"]]
    limit = 2 * max(sizes) + 1
    remote = fastload.open(bucket, cache_dir=tmp_path / "c", cache_limit=limit, storage_options=moto.options(),
                           transforms=TF)
    loader = fastload.DataLoader(remote, batch_size=3, order="quasi", window=1, seed=2, num_workers=1)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # quasi with window=1 fits: no over-limit warning
        for b in loader:
            out.append([t.clone() for t in b])
            assert remote._remote.cache.usage() <= limit
    local = fastload.DataLoader(fastload.open(photos, transforms=TF), batch_size=3, order="quasi", window=1, seed=2)
    assert same(out, [[t.clone() for t in b] for b in local])
    stats = loader.stats()["remote"]
    assert stats["evictions"] > 0 and stats["downloads"] >= len(sizes)


def test_eviction_never_touches_files_the_cache_did_not_write(moto, bucket, photos, tmp_path):
    """Issue 17 row 1 (audit): eviction removed any *.fls or *.part in any folder of cache_dir, so a
    cache_dir that also held a user's packed dataset (or a browser's download) lost those files."""
    import shutil

    from misuse.conftest import unchanged

    cache = tmp_path / "nvme"
    shutil.copytree(photos, cache / "my_dataset")  # a local packed dataset kept beside the cache
    (cache / "downloads").mkdir()
    (cache / "downloads" / "film.mkv.part").write_bytes(b"half a film")
    (cache / "0123456789abcdef").mkdir()  # named like a cache folder, but not one (no url.txt)
    (cache / "0123456789abcdef" / "shard-00000.0123456789abcdef.fls").write_bytes(b"mine")
    sizes = [s["bytes"] for s in json.loads((photos / "manifest.json").read_text())["shards"]]
    remote = fastload.open(bucket, cache_dir=cache, cache_limit=2 * max(sizes) + 1, storage_options=moto.options(),
                           transforms=TF)
    loader = fastload.DataLoader(remote, batch_size=3, order="quasi", window=1, seed=2)
    with unchanged(cache / "my_dataset", cache / "downloads", cache / "0123456789abcdef"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in loader:
                pass
        assert loader.stats()["remote"]["evictions"] > 0
    assert len(fastload.open(cache / "my_dataset")) == len(fastload.open(photos))


def test_a_limit_smaller_than_the_working_set_warns_once(moto, bucket, photos, tmp_path):
    sizes = [s["bytes"] for s in json.loads((photos / "manifest.json").read_text())["shards"]]
    remote = fastload.open(bucket, cache_dir=tmp_path / "c", cache_limit=max(sizes) + 1,
                           storage_options=moto.options(), transforms=TF)
    with pytest.warns(RuntimeWarning, match="over the limit") as record:
        got = batches(remote, batch_size=36, shuffle=True, seed=1)  # one batch needs every shard
    assert sum("over the limit" in str(w.message) for w in record) == 1
    assert same(got, batches(fastload.open(photos, transforms=TF), batch_size=36, shuffle=True, seed=1))
    with pytest.raises(ValueError, match="smaller than the largest shard"):
        fastload.open(bucket, cache_dir=tmp_path / "d", cache_limit=max(sizes) - 1, storage_options=moto.options())


CHILD = textwrap.dedent("""
    import hashlib, json, sys
    import fastload
    from fastload.transforms import RandomResizedCrop
    url, cache, endpoint, out = sys.argv[1:5]
    opts = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    ds = fastload.open(url, cache_dir=cache, storage_options=opts, transforms={"image": [RandomResizedCrop(24)]})
    loader = fastload.DataLoader(ds, batch_size=5, shuffle=True, seed=4, num_workers=1)
    h = hashlib.sha256()
    for images, labels in loader:
        h.update(images.numpy().tobytes()); h.update(labels.numpy().tobytes())
    json.dump({"digest": h.hexdigest(), "stats": loader.stats()["remote"]}, open(out, "w"))
""")


def run_child(url: str, cache: Path, endpoint: str, out: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen([sys.executable, "-c", CHILD, url, str(cache), endpoint, str(out)], env=env)


def local_digest(photos: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    for images, labels in fastload.DataLoader(fastload.open(photos, transforms=TF), batch_size=5, shuffle=True,
                                              seed=4, num_workers=1):
        h.update(images.numpy().tobytes())
        h.update(labels.numpy().tobytes())
    return h.hexdigest()


@pytest.mark.slow
def test_two_processes_share_one_cache(moto, bucket, photos, tmp_path):
    proxy = FaultProxy(moto.port)
    proxy.slow(0.02)  # downloads take a while, so the two processes want the same shards at the same time
    try:
        procs = [run_child(bucket, tmp_path / "cache", proxy.endpoint, tmp_path / f"out{i}.json") for i in range(2)]
        assert [p.wait(180) for p in procs] == [0, 0]
    finally:
        proxy.stop()
    results = [json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(2)]
    assert results[0]["digest"] == results[1]["digest"] == local_digest(photos)
    # one download per shard across both processes: the other one waited on the lock and found it
    assert sum(r["stats"]["downloads"] for r in results) == shard_count(photos)
    assert cached_files(tmp_path / "cache", ".part") == []


@pytest.mark.slow
def test_a_download_killed_with_sigkill_is_never_taken_for_complete(moto, photos, tmp_path):
    fs = moto.fs()
    fs.mkdir("big")
    big = tmp_path / "big"
    rng = np.random.default_rng(0)
    fastload.pack({"x": rng.integers(0, 255, size=(8, 1 << 18), dtype=np.uint8)}, big, shard_size="1MB")
    upload(fs, big, "big/ds")
    proxy = FaultProxy(moto.port)
    proxy.slow(0.05)  # 2 MiB shards at ~320 KB/s: several seconds each
    code = textwrap.dedent("""
        import sys, fastload
        ds = fastload.open("s3://big/ds", cache_dir=sys.argv[1],
                           storage_options={"endpoint_url": sys.argv[2], "key": "testing", "secret": "testing"})
        for batch in fastload.DataLoader(ds, batch_size=8):
            pass
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    cache = tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, "-c", code, str(cache), proxy.endpoint], env=env)
    try:
        deadline = time.monotonic() + 120
        while not any(p.stat().st_size > 0 for p in cached_files(cache, ".part")):
            assert proc.poll() is None and time.monotonic() < deadline, "the child never started a download"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        proxy.stop()
    assert cached_files(cache, ".part"), "the killed download left its partial file"
    assert cached_files(cache, ".fls") == [], "a partial download has a complete shard's name"
    ds = fastload.open("s3://big/ds", cache_dir=cache, storage_options=moto.options())
    got = next(iter(fastload.DataLoader(ds, batch_size=8)))[0]
    assert torch.equal(got, next(iter(fastload.DataLoader(fastload.open(big), batch_size=8)))[0])
    assert cached_files(cache, ".part") == []  # the dead process's partial file was cleaned up
    assert ds.remote_stats()["corrupt_downloads"] == 0


def test_dropped_connections_are_retried_and_counted(moto, bucket, photos, tmp_path):
    proxy = FaultProxy(moto.port)
    try:
        remote = fastload.open(bucket, cache_dir=tmp_path / "c", storage_options=moto.options(proxy.endpoint),
                               transforms=TF)
        proxy.cut(3, after=2000)  # the next three connections die mid-response
        loader = fastload.DataLoader(remote, batch_size=5, shuffle=True, seed=9, num_workers=1)
        got = [[t.clone() for t in b] for b in loader]
    finally:
        proxy.stop()
    assert proxy.cut_done >= 1
    assert same(got, batches(fastload.open(photos, transforms=TF), batch_size=5, shuffle=True, seed=9))
    stats = loader.stats()["remote"]
    # a cut shows either as an error (retried) or as a short body the checksum refuses (downloaded again);
    # the HTTP client may itself re-send a request on a fresh connection: at least one must be counted
    assert stats["retries"] + stats["corrupt_downloads"] >= 1
    assert stats["downloads"] - stats["corrupt_downloads"] == shard_count(photos)


def test_a_corrupt_object_is_downloaded_twice_then_raises_naming_the_url(moto, photos, tmp_path):
    fs = moto.fs()
    fs.mkdir("bad")
    upload(fs, photos, "bad/ds")
    data = bytearray((photos / "shard-00001.fls").read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte off: only the checksum can tell
    fs.pipe_file("bad/ds/shard-00001.fls", bytes(data))
    ds = fastload.open("s3://bad/ds", cache_dir=tmp_path / "c", storage_options=moto.options(), transforms=TF)
    with pytest.raises(FormatError, match=r"s3://bad/ds/shard-00001\.fls: downloaded twice"):
        batches(ds)
    assert ds.remote_stats()["corrupt_downloads"] == 2
    assert not any("shard-00001" in p.name for p in cached_files(tmp_path / "c", ".fls"))


def test_https_corrupt_once_is_downloaded_again_and_drops_are_retried(photos, tmp_path):
    server = FileServer(photos)
    try:
        url = f"{server.url}/"
        ds = fastload.open(url, cache_dir=tmp_path / "c", transforms=TF)
        server.corrupt["shard-00001.fls"] = 1
        server.drop["shard-00002.fls"] = 2
        got = batches(ds, shuffle=True, seed=3)
    finally:
        server.stop()
    assert same(got, batches(fastload.open(photos, transforms=TF), shuffle=True, seed=3))
    stats = ds.remote_stats()
    assert stats["corrupt_downloads"] == 1 and server.gets["shard-00001.fls"] == 2
    assert stats["retries"] >= 1 and server.gets["shard-00002.fls"] >= 3  # both drops happened, then a success


def test_missing_bucket_raises_at_open(moto, tmp_path):
    with pytest.raises(RemoteError, match=r"s3://no-such-bucket/ds/manifest\.json.*(bucket|Bucket)"):
        fastload.open("s3://no-such-bucket/ds", cache_dir=tmp_path, storage_options=moto.options())


def test_missing_credentials_raise_at_open(moto, bucket, tmp_path, monkeypatch):
    for k in list(os.environ):
        if k.startswith("AWS_") and k != "AWS_EC2_METADATA_DISABLED":
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    t = time.monotonic()
    with pytest.raises(RemoteError, match=r"s3://data/photos/manifest\.json.*[Cc]redentials"):
        fastload.open(bucket, cache_dir=tmp_path, storage_options={"endpoint_url": moto.endpoint})
    assert time.monotonic() - t < 10  # not retried: no backoff for an error retrying cannot fix


def test_not_a_dataset_and_unfinished_pack(moto, tmp_path):
    fs = moto.fs()
    fs.mkdir("misc")
    fs.pipe_file("misc/empty/readme.txt", b"hello")
    with pytest.raises(RemoteError, match=r"s3://misc/empty/manifest\.json"):
        fastload.open("s3://misc/empty", cache_dir=tmp_path, storage_options=moto.options())
    fs.pipe_file("misc/half/pack_state.json", b"{}")
    with pytest.raises(FormatError, match="unfinished pack"):
        fastload.open("s3://misc/half", cache_dir=tmp_path, storage_options=moto.options())
    fs.pipe_file("misc/junk/manifest.json", b"{not json")
    with pytest.raises(FormatError, match="not valid JSON"):
        fastload.open("s3://misc/junk", cache_dir=tmp_path, storage_options=moto.options())


def test_file_urls_and_local_options_warning(photos, tmp_path):
    remote = fastload.open(photos.as_uri(), cache_dir=tmp_path / "c", transforms=TF)
    assert same(batches(remote, shuffle=True, seed=1), batches(fastload.open(photos, transforms=TF), shuffle=True,
                                                               seed=1))
    with pytest.warns(RuntimeWarning, match="cache_dir apply to remote datasets"):
        fastload.open(photos, cache_dir=tmp_path)


def labels_only(samples):
    return [s[1] for s in samples]


def test_worker_processes_read_through_the_cache(moto, bucket, photos, tmp_path):
    # the generic path: forked workers must not use the parent's fsspec filesystem (not fork-safe)
    ds = fastload.open(bucket, cache_dir=tmp_path / "c", storage_options=moto.options())
    with pytest.warns(fastload.FastPathWarning, match="custom collate_fn"):
        loader = fastload.DataLoader(ds, batch_size=6, num_workers=2, collate_fn=labels_only)
    assert not loader.fast_path
    got = [x for b in loader for x in b]
    assert got == [fastload.open(photos)[i][1] for i in range(len(ds))]
    assert len(cached_files(tmp_path / "c", ".fls")) == shard_count(photos)


def test_each_rank_downloads_only_its_own_shards(moto, bucket, photos, tmp_path):
    n_shards = shard_count(photos)
    seen, downloads = [], []
    for rank in range(2):
        remote = fastload.open(bucket, cache_dir=tmp_path / f"node{rank}", storage_options=moto.options(),
                               transforms=TF)
        loader = fastload.DataLoader(remote, batch_size=4, order="quasi", window=1, seed=3, rank=rank, world_size=2,
                                     num_workers=1)
        assert loader._order.split == "shards"  # the default for a remote dataset on several ranks
        got = [[t.clone() for t in b] for b in loader]
        local = fastload.DataLoader(fastload.open(photos, transforms=TF), batch_size=4, order="quasi", window=1,
                                    seed=3, rank=rank, world_size=2, split="shards")
        assert same(got, [[t.clone() for t in b] for b in local])
        downloads.append(loader.stats()["remote"]["downloads"])
        seen.append(set(loader._order.indices(0).tolist()))
    assert sum(downloads) == n_shards and all(0 < d < n_shards for d in downloads)
    assert seen[0] | seen[1] == set(range(len(fastload.open(photos))))


def test_more_ranks_than_shards_warns_and_splits_by_samples(moto, bucket, photos, tmp_path):
    remote = fastload.open(bucket, cache_dir=tmp_path / "c", storage_options=moto.options(), transforms=TF)
    with pytest.warns(RuntimeWarning, match="cannot apply here.*at least one per rank"):
        loader = fastload.DataLoader(remote, batch_size=4, rank=0, world_size=shard_count(photos) + 1)
    assert loader._order.split == "samples"
    with pytest.raises(ValueError, match="at least one per rank"):
        fastload.DataLoader(remote, batch_size=4, rank=0, world_size=shard_count(photos) + 1, split="shards")


def test_the_default_split_follows_the_world_a_loader_is_retargeted_to(moto, bucket, photos, tmp_path):
    """accelerate retargets a loader built before the process group (one rank) to its rank: the default split of a
    remote dataset is then whole shards per rank, as for a loader built under the group; an explicit one stays."""
    from fastload._front.loader import retarget

    remote = fastload.open(bucket, cache_dir=tmp_path / "c", storage_options=moto.options(), transforms=TF)
    local = fastload.open(photos, transforms=TF)
    for rank in range(2):
        loader = fastload.DataLoader(remote, batch_size=4, seed=3, rank=0, world_size=1)
        assert loader._order.split == "samples"
        retarget(loader, rank, 2)
        want = fastload.DataLoader(local, batch_size=4, seed=3, rank=rank, world_size=2, split="shards")
        assert loader._order.split == "shards"
        assert loader._order.indices(0).tolist() == want._order.indices(0).tolist()
        retarget(loader, 0, 1)  # back to one process: the default is samples again
        assert loader._order.split == "samples"
    given = fastload.DataLoader(remote, batch_size=4, seed=3, rank=0, world_size=1, split="samples")
    retarget(given, 1, 2)
    assert given._order.split == "samples"
    crowded = fastload.DataLoader(remote, batch_size=4, seed=3, rank=0, world_size=1)
    with pytest.warns(RuntimeWarning, match="cannot apply here.*at least one per rank"):
        retarget(crowded, 0, shard_count(photos) + 1)
    assert crowded._order.split == "samples"


def test_a_distributed_sampler_on_a_remote_dataset_warns_that_ranks_read_everything(moto, bucket, photos, tmp_path):
    from torch.utils.data import DistributedSampler

    remote = fastload.open(bucket, cache_dir=tmp_path / "c", storage_options=moto.options(), transforms=TF)
    sampler = DistributedSampler(remote, num_replicas=2, rank=1, shuffle=True, seed=0)
    with pytest.warns(RuntimeWarning, match="each rank downloads every shard"):
        loader = fastload.DataLoader(remote, batch_size=4, sampler=sampler, seed=7)
    assert loader.fast_path
    local = fastload.DataLoader(fastload.open(photos, transforms=TF), batch_size=4, seed=7,
                                sampler=DistributedSampler(remote, num_replicas=2, rank=1, shuffle=True, seed=0))
    assert same([[t.clone() for t in b] for b in loader], [[t.clone() for t in b] for b in local])
