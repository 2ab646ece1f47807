"""The generic path under fastload's Order (issue 17 row 3): rank, world_size, seed and order on a plain Dataset
mean what they mean on the fast path (the same Order, _order.py), resume included; a fastload.Dataset that falls
off the fast path keeps its order and says what it keeps. (Real torch.distributed: test_distributed.py.)"""

from __future__ import annotations

import pytest
import torch

import fastload
from fastload.fast.order import Order
from fastload import transforms as T

from conftest import make_image_folder

N = 23


class Plain(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return i


def flat(loader) -> list[int]:
    out = []
    for b in loader:
        out.extend(b.tolist() if isinstance(b, torch.Tensor) and b.ndim else [int(b)])
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["sequential", "random", "quasi"])
def test_the_fast_paths_order_per_rank(num_workers, kind):
    for rank in range(3):
        dl = fastload.DataLoader(Plain(), batch_size=4, order=kind, seed=11, rank=rank, world_size=3,
                                 num_workers=num_workers)
        want = Order(N, 4, kind=kind, seed=11, rank=rank, world_size=3)
        assert not dl.fast_path and len(dl) == len(want) == 2
        for epoch in range(2):
            assert flat(dl) == want.indices(epoch).tolist()


def test_shuffle_and_seed_without_a_split():
    a = flat(fastload.DataLoader(Plain(), batch_size=5, shuffle=True, seed=4))
    assert a == flat(fastload.DataLoader(Plain(), batch_size=5, shuffle=True, seed=4)) != list(range(N))
    assert sorted(a) == list(range(N))


def test_no_automatic_batching():
    dl = fastload.DataLoader(Plain(), batch_size=None, seed=2, shuffle=True, rank=1, world_size=2)
    assert len(dl) == 12 and flat(dl) == Order(N, 1, kind="random", seed=2, rank=1, world_size=2).indices(0).tolist()


def test_torchs_samplers_when_nothing_is_asked():
    torch.manual_seed(0)
    ours = flat(fastload.DataLoader(Plain(), batch_size=5, shuffle=True))
    torch.manual_seed(0)
    assert ours == flat(torch.utils.data.DataLoader(Plain(), batch_size=5, shuffle=True))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_mid_epoch(num_workers):
    def make():
        return fastload.DataLoader(Plain(), batch_size=3, order="random", seed=8, rank=1, world_size=2,
                                   num_workers=num_workers)

    whole = make()
    flat(whole)
    second = flat(whole)
    dl = make()
    flat(dl)
    it = iter(dl)
    next(it), next(it)
    state = dl.state_dict()
    del it
    again = make()
    again.load_state_dict(state)
    assert flat(again) == second[6:]


def test_fell_off_the_fast_path_keeps_its_order(tmp_path):
    fastload.pack(make_image_folder(tmp_path / "src", classes=2, per_class=5), tmp_path / "ds", workers=0)
    ds = fastload.open(tmp_path / "ds", transforms={"image": [T.Resize(8), T.CenterCrop(8)]})
    fast = fastload.DataLoader(ds, batch_size=2, shuffle=True, seed=3, rank=1, world_size=2)
    with pytest.warns(fastload.FastPathWarning, match=r"stay fastload's \(random, seed=3, rank 1 of 2\)"):
        slow = fastload.DataLoader(ds, batch_size=2, shuffle=True, seed=3, rank=1, world_size=2,
                                   collate_fn=lambda samples: [s[1] for s in samples])
    assert fast.fast_path and not slow.fast_path
    assert [b[1].tolist() for b in fast] == list(slow)
    it = iter(slow)
    next(it)
    state = slow.state_dict()
    assert state == fast.state_dict() | {"epoch": 1, "batches_done": 1}  # the fast path's state, loadable there
