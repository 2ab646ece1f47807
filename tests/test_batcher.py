"""fastload/_fill/batcher.py: one native call per batch fills a slot. A filled and collated batch holds, row for
row, what ``ds[i]`` gives; configurations the fast path cannot batch are refused with the reason; a sample
that fails to decode is named, or with on_error='skip' replaced by a good sample of the same batch."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload import DecodeError
from fastload import transforms as T
from fastload._fill.batcher import Batcher
from fastload.fast.collate import Collator
from fastload.fields import NotFastPath

from conftest import jpeg_bytes

def open_fixed(path, **kw):
    """Deterministic transforms (no crop at random), so that a batch row and ``ds[i]`` are comparable."""
    return fastload.open(path, transforms={"image": [T.Resize((24, 20))], "tokens": T.Pad(6, value=-1)}, **kw)


def batch_of(batcher: Batcher, indices) -> object:
    slot = batcher.new_slot()
    objects = batcher.fill(slot, np.asarray(indices), np.random.default_rng(0))
    return Collator.for_batcher(batcher).collate(slot, len(indices), objects)


@pytest.mark.parametrize("threads", [0, 2])
def test_a_batch_holds_what_the_dataset_gives_row_for_row(every_kind, threads):
    ds = open_fixed(every_kind, as_dict=True)
    batcher = Batcher(ds, batch_size=4, num_threads=threads)
    indices = [9, 0, 5]  # fewer than batch_size: the batch is cut to them
    batch = batch_of(batcher, indices)
    assert list(batch) == ["image", "label", "score", "emb", "tokens", "name", "raw"]
    assert batch["image"].shape == (3, 3, 24, 20) and batch["image"].dtype == torch.uint8
    assert batch["image"].is_contiguous(memory_format=torch.channels_last)
    tokens, lengths = batch["tokens"]
    for k, i in enumerate(indices):
        ref = ds[i]
        assert torch.equal(batch["image"][k], ref["image"]), i
        assert batch["label"][k].item() == ref["label"] and batch["score"][k].item() == ref["score"]
        assert torch.equal(batch["emb"][k], ref["emb"])
        assert torch.equal(tokens[k], ref["tokens"][0]) and lengths[k].item() == ref["tokens"][1] == i % 6
        assert batch["name"][k] == ref["name"] and batch["raw"][k] == ref["raw"]
    assert tokens.shape == (3, 6)  # Pad(6): every row padded to 6 with -1
    batcher.close()


def test_tuple_datasets_give_lists_in_field_order(every_kind):
    batch = batch_of(Batcher(open_fixed(every_kind), batch_size=2, num_threads=0), [3, 4])
    assert isinstance(batch, list) and len(batch) == 7
    assert batch[1].tolist() == [3 * 7 - 20, 4 * 7 - 20] and batch[5] == ["sample 3 é", "sample 4 é"]


def test_what_cannot_be_batched_is_refused_with_the_reason(every_kind):
    with pytest.raises(NotFastPath, match="image field 'image' has no transform giving a fixed output size"):
        Batcher(fastload.open(every_kind), batch_size=2, num_threads=0)
    with pytest.raises(NotFastPath, match=r"ndarray field 'tokens' has a variable shape \(None,\) and no Pad/Bucket"):
        Batcher(fastload.open(every_kind, transforms={"image": [T.Resize((8, 8))]}), batch_size=2, num_threads=0)
    with pytest.raises(ValueError, match="on_error='ignore' should be 'raise' or 'skip'"):
        Batcher(open_fixed(every_kind), batch_size=2, num_threads=0, on_error="ignore")


@pytest.fixture(scope="module")
def one_corrupt(tmp_path_factory) -> Path:
    """Six pictures, the third with zeroed entropy-coded data: the header check at pack time lets it in."""
    root = tmp_path_factory.mktemp("corrupt")
    for i in range(6):
        data = bytearray(jpeg_bytes(48, 64, seed=i))
        if i == 2:
            data[-150:-50] = bytes(100)  # inside the scan, the end-of-image marker kept
        (root / "src" / "c").mkdir(parents=True, exist_ok=True)
        (root / "src" / "c" / f"{i}.jpg").write_bytes(bytes(data))
    fastload.pack(root / "src", root / "ds", workers=0, image_mode="passthrough", check="header")
    return root / "ds"


def test_a_sample_that_fails_is_named_or_replaced_by_a_good_one(one_corrupt):
    ds = fastload.open(one_corrupt, transforms={"image": [T.Resize((16, 16))]})
    with pytest.raises(DecodeError, match=r"shard-\d+\.fls.*sample 2.*on_error='skip'"):
        batch_of(Batcher(ds, batch_size=4, num_threads=0), [1, 2, 3, 0])
    skip = Batcher(ds, batch_size=4, num_threads=0, on_error="skip")
    images, labels = batch_of(skip, [1, 2, 3, 0])
    assert skip.skipped == 1
    assert torch.equal(images[1], images[0])  # position 1 (sample 2) now holds the batch's first good sample
    assert torch.equal(images[0], ds[1][0]) and torch.equal(images[2], ds[3][0])
    with pytest.raises(DecodeError, match="sample 2"):  # nothing good in the batch to stand in
        batch_of(skip, [2])


@pytest.fixture(scope="module")
def raw_images(tmp_path_factory) -> Path:
    """24 raw uint8 3x224x224 arrays with labels: a batch of 16 images is 2.4 MB, above the native gather's
    ``GATHER_INLINE_BYTES``."""
    rng = np.random.default_rng(5)
    path = tmp_path_factory.mktemp("raw") / "raw"
    fastload.pack({"x": rng.integers(0, 256, (24, 3, 224, 224), dtype=np.uint8), "label": np.arange(24)}, path)
    return path


@pytest.fixture
def torch_threads():
    """Sets torch's intra-op thread count for the test, and puts the old one back."""
    old = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(old)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: no helper thread to give")
def test_a_large_batch_at_num_workers_0_is_copied_with_torchs_threads(raw_images, torch_threads):
    """num_workers=0: a batch of rows of 2 MiB or more is copied by the calling thread and
    torch.get_num_threads() - 1 helper threads (``Batcher.copy_helpers``), started by the first such batch; torch at
    one thread keeps it in the calling thread alone. The rows are the dataset's either way."""
    ds = fastload.open(raw_images, as_dict=True)
    indices = [23, 0, 7, 7, 12, 3, 19, 1, 2, 5, 8, 13, 21, 4, 6, 9]
    for threads, helpers in ((2, 1), (1, 0)):
        torch_threads(threads)
        batcher = Batcher(ds, batch_size=16, num_threads=0)
        batcher.begin_iteration(0)
        assert (batcher.pool.size, batcher.pool.copy_helpers) == (0, helpers)
        small = batch_of(batcher, indices[:4])  # 602 KB: the calling thread alone, nothing started
        assert batcher.pool.copy_helpers_started == 0 and torch.equal(small["x"][3], ds[7]["x"])
        batch = batch_of(batcher, indices)  # 2.4 MB
        assert batcher.pool.copy_helpers_started == helpers, threads
        for k, i in enumerate(indices):
            assert torch.equal(batch["x"][k], ds[i]["x"]) and batch["label"][k].item() == i
        batcher.close()


def test_the_loader_at_num_workers_0_copies_large_batches_with_a_helper(raw_images, torch_threads):
    torch_threads(2)
    ds = fastload.open(raw_images)
    loader = fastload.DataLoader(ds, batch_size=16, num_workers=0, drop_last=True, shuffle=True, seed=1)
    (images, labels), = list(loader)
    assert loader._batcher.pool.copy_helpers_started == (1 if (os.cpu_count() or 1) > 1 else 0)
    for k, i in enumerate(labels.tolist()):
        assert torch.equal(images[k], ds[i][0])


def test_num_workers_keep_their_own_pool_for_large_batches(raw_images, torch_threads):
    torch_threads(2)
    batcher = Batcher(fastload.open(raw_images, as_dict=True), batch_size=16, num_threads=2)
    batcher.begin_iteration(0)
    batch = batch_of(batcher, range(16))
    assert (batcher.pool.copy_helpers, batcher.pool.copy_helpers_started) == (0, 0)
    assert torch.equal(batch["x"][5], fastload.open(raw_images, as_dict=True)[5]["x"])
    batcher.close()
