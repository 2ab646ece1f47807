"""Variable-length fields: Pad and Bucket, in ds[i] and in the loader, both formats."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
from fastload import transforms as T

from conftest import FORMATS


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n=200, seed=0):
        rng = np.random.default_rng(seed)
        self.lengths = rng.integers(1, 120, size=n)
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        L = int(self.lengths[i])
        return {"tokens": np.arange(L, dtype=np.int32) + 1000 * i, "label": i}


@pytest.fixture(params=FORMATS)
def packed_tokens(pack_once, request):
    """``Tokens()`` in one format (8KB shards), packed once per session; a sequence dataset, unlike conftest's
    image and every-kind ones: Pad/Bucket/PackSequences need rows of many lengths, longer than the bounds."""
    path = pack_once(f"tokens_{request.param}", Tokens, format=request.param, shard_size="8K", workers=0,
                     schema={"tokens": fastload.Field.ndarray("tokens", np.int32, (None,))})
    return path, Tokens()


def expected_row(src, i, L):
    ref = np.arange(src.lengths[i], dtype=np.int32)[:L] + 1000 * i
    row = np.full(L, -1, dtype=np.int32)
    row[: len(ref)] = ref
    return row, len(ref)


def test_pad_in_ds_and_loader(packed_tokens):
    path, src = packed_tokens
    ds = fastload.open(path, transforms={"tokens": T.Pad(128, value=-1)}, as_dict=True)
    padded, n = ds[5]["tokens"]
    row, want_n = expected_row(src, 5, 128)
    assert n == want_n and np.array_equal(padded.numpy(), row)
    dl = fastload.DataLoader(ds, batch_size=16, shuffle=True, seed=0, num_workers=2)
    assert dl.fast_path, dl.fast_path_reason
    seen = 0
    for batch in dl:
        toks, lens = batch["tokens"]
        assert toks.shape == (len(batch["label"]), 128) and toks.is_contiguous() and lens.dtype == torch.int64
        for j, i in enumerate(batch["label"].tolist()):
            row, want_n = expected_row(src, i, 128)
            assert lens[j] == want_n and np.array_equal(toks[j].numpy(), row)
        seen += len(batch["label"])
    assert seen == 200
    # the same structure as torch's default_collate over ds[i]
    theirs = next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    ours = next(iter(fastload.DataLoader(ds, batch_size=4)))
    assert type(ours["tokens"]) is type(theirs["tokens"]) is list
    assert torch.equal(ours["tokens"][0], theirs["tokens"][0]) and torch.equal(ours["tokens"][1], theirs["tokens"][1])


def test_too_long_samples_are_refused_when_opened_not_mid_epoch(packed_tokens):
    """Lengths are in the shape columns: a sample longer than Pad/Bucket allows is refused by fastload.open,
    naming the field, how many, the longest and an example, and the way out (truncate=True), instead of a
    DecodeError at whichever batch holds the first of them (issue 17, row 6)."""
    path, src = packed_tokens
    too_long = np.flatnonzero(src.lengths > 50)
    longest = int(np.argmax(src.lengths))
    for spec, room in ((T.Pad(50), "pad to a length of at least"), (T.Bucket([16, 50]), "add a boundary of at least")):
        with pytest.raises(ValueError) as info:
            fastload.open(path, transforms={"tokens": spec})
        msg = str(info.value)
        assert f"field 'tokens': {too_long.size} of 200 samples are longer" in msg, msg
        assert f"the longest is sample {longest}, of length {src.lengths[longest]}" in msg, msg
        assert f"e.g. samples {too_long[0]}," in msg and "truncate=True" in msg and room in msg, msg
    ds = fastload.open(path, transforms={"tokens": T.Pad(50, truncate=True)})
    long_i = int(too_long[0])
    (toks, lens), _ = next(iter(fastload.DataLoader(ds, batch_size=200)))
    assert lens.max() == 50 and np.array_equal(toks[long_i].numpy(), np.arange(50, dtype=np.int32) + 1000 * long_i)
    assert ds[long_i][0][1] == 50
    fastload.open(path, transforms={"tokens": T.Pad(int(src.lengths.max()))})  # exactly the longest fits


def test_too_long_samples_of_a_remote_dataset(packed_tokens, tmp_path):
    """A remote dataset is not downloaded whole at open: Bucket is checked when the loader plans its buckets
    (it reads every length then anyway), Pad in ds[i] and batch by batch, with the same way out."""
    path, src = packed_tokens
    if not (path / "manifest.json").exists():
        pytest.skip("a dataset at a URL is shards")
    url, cache = f"file://{path}", tmp_path / "cache"
    long_i = int(np.flatnonzero(src.lengths > 50)[0])
    ds = fastload.open(url, transforms={"tokens": T.Bucket([16, 50])}, cache_dir=cache)
    with pytest.raises(ValueError, match=r"field 'tokens': \d+ of 200 samples are longer.*truncate=True"):
        fastload.DataLoader(ds, batch_size=8)
    ds = fastload.open(url, transforms={"tokens": T.Pad(50)}, cache_dir=cache)
    with pytest.raises(fastload.DecodeError, match=rf"sample {long_i}, field 'tokens'.*exceeds.*truncate=True"):
        ds[long_i]


def test_bucket_batches_have_fixed_shapes_and_cover_everything(packed_tokens):
    path, src = packed_tokens
    bounds = [16, 32, 64, 128]
    ds = fastload.open(path, transforms={"tokens": T.Bucket(bounds)})
    dl = fastload.DataLoader(ds, batch_size=8, shuffle=True, seed=3, num_workers=1)
    labels, shapes = [], set()
    for (toks, lens), lab in dl:
        L = toks.shape[1]
        assert L in bounds and toks.is_contiguous()
        for j, i in enumerate(lab.tolist()):
            want_bound = min(b for b in bounds if b >= src.lengths[i])
            assert want_bound == L  # every sample of the batch belongs to this bucket
            row, n = expected_row(src, i, L)
            assert lens[j] == n and np.array_equal(toks[j].numpy()[:n], row[:n]) and (toks[j, n:] == 0).all()
        labels.extend(lab.tolist())
        shapes.add(L)
    assert sorted(labels) == list(range(200)) and len(shapes) > 1
    # deterministic, resumable and independent of num_workers
    a = [b[1].clone() for b in fastload.DataLoader(ds, batch_size=8, shuffle=True, seed=3, num_workers=0)]
    dl2 = fastload.DataLoader(ds, batch_size=8, shuffle=True, seed=3, num_workers=2)
    it = iter(dl2)
    for _ in range(5):
        next(it)
    state = dl2.state_dict()
    del it
    dl3 = fastload.DataLoader(ds, batch_size=8, shuffle=True, seed=99)
    dl3.load_state_dict(state)
    rest = [b[1].clone() for b in dl3]
    assert all(torch.equal(x, y) for x, y in zip(rest, a[5:])) and len(rest) == len(a) - 5


def test_bucket_distributed_equal_counts(packed_tokens):
    path, _ = packed_tokens
    ds = fastload.open(path, transforms={"tokens": T.Bucket([32, 64, 128])})
    counts, seen = set(), []
    for rank in range(3):
        dl = fastload.DataLoader(ds, batch_size=8, shuffle=True, seed=1, rank=rank, world_size=3)
        batches = [b[1].tolist() for b in dl]
        counts.add(len(batches))
        assert len(dl) == len(batches)
        seen.extend(x for b in batches for x in b)
    assert len(counts) == 1 and set(seen) == set(range(200))


def test_bad_declarations(packed_tokens):
    path, _ = packed_tokens
    with pytest.raises(ValueError, match="increasing"):
        T.Bucket([64, 32])
    with pytest.raises(ValueError, match="length"):
        T.Pad(0)
    with pytest.raises(ValueError, match="only image fields"):
        fastload.open(path, transforms={"label": T.Pad(4)})
    ds = fastload.open(path)  # no Pad: variable shapes go to torch's path, which cannot stack them
    dl = fastload.DataLoader(ds, batch_size=4)
    assert not dl.fast_path and "Pad/Bucket" in dl.fast_path_reason


def _segments(batch, L):
    toks, cu, ids = batch["tokens"].reshape(-1), batch["cu_seqlens"], batch["sample_ids"]
    return [(int(i), toks[a:b].numpy()) for i, a, b in zip(ids.tolist(), cu[:-1].tolist(), cu[1:].tolist())]


def test_pack_sequences_rebuilds_the_stream(packed_tokens):
    path, src = packed_tokens
    L, B = 64, 4
    ds = fastload.open(path, transforms={"tokens": T.PackSequences(L, value=-7, drop_fields=["label"])})
    assert ds[3][0].shape == (src.lengths[3],)  # ds[i] is the sample itself
    dl = fastload.DataLoader(ds, batch_size=B, shuffle=True, seed=4, num_workers=2)
    assert dl.fast_path, dl.fast_path_reason
    total = int(src.lengths.sum())
    assert len(dl) == -(-total // (B * L))
    pieces: dict[int, list] = {}
    n_batches = 0
    for batch in dl:
        n_batches += 1
        assert batch["tokens"].shape == (B, L) and batch["cu_seqlens"].dtype == torch.int32
        cu = batch["cu_seqlens"].tolist()
        assert cu[0] == 0 and all(a < b for a, b in zip(cu, cu[1:]))
        assert all(any(a <= r * L < b for a, b in zip(cu, cu[1:])) is False or r * L in cu
                   for r in range(B) if r * L < cu[-1])  # no segment crosses a row start
        for i, seg in _segments(batch, L):
            pieces.setdefault(i, []).append(seg)
        flat = batch["tokens"].reshape(-1)
        assert (flat[cu[-1]:] == -7).all()
    assert n_batches == len(dl)
    assert sorted(pieces) == list(range(200))
    for i, parts in pieces.items():  # every sample's tokens, in order, exactly once
        assert np.array_equal(np.concatenate(parts), np.arange(src.lengths[i], dtype=np.int32) + 1000 * i)


def test_pack_sequences_ranks_and_resume(packed_tokens):
    path, src = packed_tokens
    ds = fastload.open(path, transforms={"tokens": T.PackSequences(32, drop_fields=["label"])})
    counts, seen = set(), 0
    for rank in range(3):
        dl = fastload.DataLoader(ds, batch_size=2, shuffle=True, seed=8, rank=rank, world_size=3, drop_last=True)
        batches = list(dl)
        counts.add(len(batches))
        seen += sum(int(b["cu_seqlens"][-1]) for b in batches)
    assert len(counts) == 1
    assert seen == (int(src.lengths.sum()) // 64) // 3 * 3 * 64  # full global batches, split evenly
    make = lambda: fastload.DataLoader(ds, batch_size=2, shuffle=True, seed=8, num_workers=1)  # noqa: E731
    ref = [b["tokens"].clone() for b in make()]
    dl = make()
    it = iter(dl)
    for _ in range(7):
        next(it)
    state = dl.state_dict()
    del it
    again = make()
    again.load_state_dict(state)
    rest = [b["tokens"].clone() for b in again]
    assert len(rest) == len(ref) - 7 and all(torch.equal(a, b) for a, b in zip(rest, ref[7:]))


def test_pack_sequences_never_drops_a_field_unasked(packed_tokens):
    """A packed batch holds token rows, cu_seqlens and sample_ids only: a dataset with another per-sample field
    is refused at open, naming the field and the way out, until the user drops it by name (issue 17, row 10)."""
    path, src = packed_tokens
    with pytest.raises(ValueError, match=r"per-sample field\(s\) \['label'\].*"
                                         r"T\.PackSequences\(32, drop_fields=\['label'\]\)"):
        fastload.open(path, transforms={"tokens": T.PackSequences(32)})
    with pytest.raises(ValueError, match=r"drop_fields names \['lable'\], which are not other fields.*\['label'\]"):
        fastload.open(path, transforms={"tokens": T.PackSequences(32, drop_fields=["lable"])})
    with pytest.raises(ValueError, match=r"drop_fields names \['tokens'\]"):
        fastload.open(path, transforms={"tokens": T.PackSequences(32, drop_fields=["label", "tokens"])})
    with pytest.raises(TypeError, match=r"drop_fields='label' should be a list of field names"):
        T.PackSequences(32, drop_fields="label")
    ds = fastload.open(path, transforms={"tokens": T.PackSequences(32, drop_fields=["label"])}, as_dict=True)
    batch = next(iter(fastload.DataLoader(ds, batch_size=2)))
    assert set(batch) == {"tokens", "cu_seqlens", "sample_ids"}
    k = int(batch["sample_ids"][0])
    assert ds[k]["label"] == k and len(ds[k]["tokens"]) == src.lengths[k]  # the dropped field, one lookup away
