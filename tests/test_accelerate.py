"""Real ``accelerate launch --num_processes 2 --cpu`` runs of examples/accelerate_train.py through
fastload.accelerate.prepare: fastload's loader on its fast path in each process, disjoint and complete
shards, reshuffled epochs, save_state mid-epoch and load_state resuming at the next batch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import fastload
from test_gpu_decoders_sim import nvjpeg_on_sim, one_truncated, run  # noqa: F401  (fixtures)
from test_ring import sim_cuda  # noqa: F401  (the fixture)


pytest.importorskip("accelerate")
pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
N, BATCH = 40, 4  # 5 batches per process and epoch

RUN = """
import json, sys
from pathlib import Path
import torch
import accelerate_train as ex

out = Path(sys.argv[1])
rows = []

def record(accelerator, loader, epoch, step, batch):
    rows.append(dict(epoch=epoch, step=step, ids=batch[2].tolist(), pixels=int(batch[0].to(torch.int64).sum()),
                     cls=type(loader).__module__ + "." + type(loader).__name__, fast_path=loader.fast_path,
                     world=accelerator.num_processes, distributed=str(accelerator.distributed_type)))

ex.train(ex.parse_args(sys.argv[2:]), on_batch=record)
import torch.distributed as dist
(out / f"rank{dist.get_rank()}.json").write_text(json.dumps(rows))
dist.barrier()
dist.destroy_process_group()  # gloo's threads left to process exit can abort a rank ("terminate called ...")
"""


def launch(tmp_path: Path, packed: Path, name: str, *extra: str) -> dict:
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(RUN))
    out = tmp_path / name
    out.mkdir()
    # `accelerate launch --num_processes 2 --cpu` starts ONE process (its simple launcher; several CPU processes
    # need mpirun there). Two CPU processes: the torchrun launcher (--multi_gpu) with ACCELERATE_USE_CPU, gloo.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "examples")]), OMP_NUM_THREADS="1",
               ACCELERATE_USE_CPU="true", HF_HOME=str(tmp_path / "hf"))  # HF_HOME: no config of the machine's user
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    cmd = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0", str(script), str(out), str(packed),
           "--batch-size", str(BATCH), "--image-size", "16", "--epochs", "2", "--seed", "4", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "FastPathWarning" not in proc.stderr, proc.stderr[-3000:]
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(2)}


@pytest.mark.slow
def test_accelerate_launch_keeps_the_fast_path_and_resumes_mid_epoch(tmp_path, numbered):
    packed = numbered(N)
    first = launch(tmp_path, packed, "first", "--save-at", "1:2", "--state", str(tmp_path / "state"))
    per_epoch = N // 2 // BATCH
    for rows in first.values():
        assert len(rows) == 2 * per_epoch
        assert all(r["fast_path"] and r["cls"] == "fastload._front.loader.DataLoader" and r["world"] == 2 for r in rows)
        assert all(r["distributed"] == "DistributedType.MULTI_CPU" for r in rows)
    for epoch in range(2):
        seen = [[i for r in first[k] if r["epoch"] == epoch for i in r["ids"]] for k in range(2)]
        assert len(seen[0]) == len(seen[1]) == N // 2
        assert not set(seen[0]) & set(seen[1]) and set(seen[0]) | set(seen[1]) == set(range(N))
    assert [r["ids"] for r in first[0] if r["epoch"] == 0] != [r["ids"] for r in first[0] if r["epoch"] == 1]

    resumed = launch(tmp_path, packed, "resumed", "--resume", str(tmp_path / "state"))
    for rank in range(2):
        want = [r for r in first[rank] if r["epoch"] == 1][2:]
        got = resumed[rank]
        assert [(r["epoch"], r["step"]) for r in got] == [(1, s) for s in range(2, per_epoch)]
        assert [(r["ids"], r["pixels"]) for r in got] == [(r["ids"], r["pixels"]) for r in want]


class FakeAccelerator:
    """The attributes fastload.accelerate.prepare reads, for the single-process cases below."""

    def __init__(self, **kw):
        self.process_index, self.num_processes = kw.get("rank", 0), kw.get("world", 1)
        self.split_batches = kw.get("split_batches", False)
        self.dispatch_batches = kw.get("dispatch_batches", False)
        self.device = torch.device("cpu")
        self.prepared = None

    def prepare(self, *args, device_placement=None):
        self.prepared = args
        return args if len(args) > 1 else args[0]


def test_prepare_reshards_fastloads_own_order_for_the_process(numbered):
    packed = numbered(N)
    from fastload.accelerate import prepare

    ds = fastload.open(packed, transforms={"image": [fastload.transforms.Resize((8, 8))]})
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=2)  # built before the process group
    assert len(loader) == N // 4
    shards = []
    for rank in range(2):
        dl = fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=2)
        assert prepare(FakeAccelerator(rank=rank, world=2), dl) is dl
        assert dl._is_accelerate_prepared and dl.use_stateful_dataloader and len(dl) == N // 8
        shards.append(torch.cat([b[2] for b in dl]).tolist())
    assert not set(shards[0]) & set(shards[1]) and set(shards[0]) | set(shards[1]) == set(range(N))


def test_prepare_leaves_what_it_cannot_keep_to_accelerate_with_a_warning(numbered):
    packed = numbered(N)
    from fastload.accelerate import prepare

    ds = fastload.open(packed, transforms={"image": [fastload.transforms.Resize((8, 8))]})
    acc = FakeAccelerator(split_batches=True)
    dl = fastload.DataLoader(ds, batch_size=4)
    with pytest.warns(fastload.FastPathWarning, match="split_batches=True"):
        prepare(acc, dl)
    assert not dl.__dict__.get("_accelerate_ready") and acc.prepared == (dl,)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastload.FastPathWarning)
        model = torch.nn.Linear(2, 2)
        assert prepare(FakeAccelerator(), model, dl) == (model, dl)  # models pass straight through


def test_plain_accelerator_prepare_says_it_drops_the_fast_path(numbered):
    packed = numbered(N)
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from fastload.accelerate import prepare

    ds = fastload.open(packed, transforms={"image": [fastload.transforms.Resize((8, 8))]})
    try:
        accelerator = Accelerator(cpu=True)
        with pytest.warns(fastload.FastPathWarning, match="use|instead") as record:
            rebuilt = accelerator.prepare(fastload.DataLoader(ds, batch_size=4, seed=1))
        assert type(rebuilt).__name__ == "DataLoaderShard"  # accelerate's own, without the fast path
        assert "fastload.accelerate.prepare(accelerator, ...)" in str(record[0].message)
        kept = fastload.DataLoader(ds, batch_size=4, seed=1)
        with warnings.catch_warnings():
            warnings.simplefilter("error", fastload.FastPathWarning)
            assert prepare(accelerator, kept) is kept and kept.fast_path
            assert accelerator.prepare(kept) is kept  # prepared once: accelerate keeps it as it is
        assert kept in accelerator._dataloaders  # registered: save_state/load_state carry its position
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def test_plain_accelerator_prepare_says_it_drops_fastloads_order_on_the_generic_path():
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    try:
        accelerator = Accelerator(cpu=True)
        with pytest.warns(fastload.FastPathWarning, match="fastload.accelerate.prepare"):
            accelerator.prepare(fastload.DataLoader(list(range(8)), batch_size=4, shuffle=True, seed=1))
        with warnings.catch_warnings():  # torch's samplers drive it: accelerate's rebuild keeps what it had
            warnings.simplefilter("error", fastload.FastPathWarning)
            accelerator.prepare(fastload.DataLoader(list(range(8)), batch_size=4, shuffle=True))
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def test_prepare_places_batches_on_the_accelerators_gpu_with_a_gpu_decoder(nvjpeg_on_sim, one_truncated, monkeypatch):
    """A loader made before the Accelerator (no device, decoder='auto': native threads alone then) is placed on
    accelerator.device by prepare, which chooses its decoder again: 'auto' pairs the GPU decoder, on the
    accelerator's GPU (simulated: tests/sim_streams.py). Setting loader.device alone kept the CPU choice."""
    from fastload import decoders
    from fastload.accelerate import prepare
    from fastload.decoders import hybrid

    monkeypatch.setattr(hybrid, "_installed_gpu_decoder", lambda: (decoders.kind("nvjpeg"), []))
    ds = fastload.open(one_truncated, transforms={"image": [fastload.transforms.RandomResizedCrop(16)]})
    kw = dict(batch_size=4, shuffle=True, seed=2, on_error="skip")
    ref = [(x.clone(), y.clone()) for x, y in fastload.DataLoader(ds, **kw)]
    loader = fastload.DataLoader(ds, decoder="auto", **kw)
    assert loader._batcher.images.hybrid is None  # no device yet: native threads
    acc = FakeAccelerator()
    acc.device = torch.device("cuda", 1)
    assert prepare(acc, loader) is loader
    images = loader._batcher.images
    assert images.hybrid is not None and images.device == torch.device("cuda", 1)
    seen = run(nvjpeg_on_sim, loader, nvjpeg_on_sim.default, lag=True)
    assert loader._device_ring.device == torch.device("cuda", 1)
    assert not nvjpeg_on_sim.races and not nvjpeg_on_sim.waits_in()
    assert len(seen) == len(ref) and images.hybrid.stats()["gpu_rate"]  # the GPU decoder decoded its share
    for (x, y), (sx, sy) in zip(ref, seen):
        assert torch.equal(y, sy) and x.shape == sx.shape


def test_prepare_makes_the_ranks_of_an_unseeded_loader_built_before_the_process_group_shuffle_alike(numbered,
                                                                                                   monkeypatch):
    """A shuffled loader with no seed= built before the process group drew its own seed in each process: resharded
    by prepare, the ranks' shares overlapped (samples read twice, others never). They now take the seed a loader
    built under the process group takes; with no process group to say the processes run together it is refused."""
    import torch.distributed as dist

    from fastload.accelerate import prepare

    packed = numbered(N)
    ds = fastload.open(packed, transforms={"image": [fastload.transforms.Resize((8, 8))]})
    loaders = []
    for rank in range(2):
        torch.manual_seed(100 + rank)  # each process's own generator, as drawn before any set_seed
        loaders.append(fastload.DataLoader(ds, batch_size=4, shuffle=True))
    with pytest.raises(ValueError, match="no seed=.*pass the same seed= on every rank"):
        prepare(FakeAccelerator(rank=0, world=2), fastload.DataLoader(ds, batch_size=4, shuffle=True))
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    shards = []
    for rank, dl in enumerate(loaders):
        prepare(FakeAccelerator(rank=rank, world=2), dl)
        shards.append(torch.cat([b[2] for b in dl]).tolist())
    assert not set(shards[0]) & set(shards[1]) and set(shards[0]) | set(shards[1]) == set(range(N))


@pytest.mark.parametrize("seed", [5, None], ids=["seed given", "seed from the state"])
def test_a_loader_restored_before_prepare_goes_on_where_the_state_was_saved(numbered, monkeypatch, seed):
    """A loader built before the process group and restored from a checkpoint there (world size 1: an elastic resume
    of a 2-process state), then prepared for process 0 of 2: the new order started the saved epoch over (the batches
    read before the checkpoint again) and, built with no seed=, took the process group's seed instead of the
    state's (another permutation)."""
    import torch.distributed as dist

    from fastload.accelerate import prepare

    ds = fastload.open(numbered(N), transforms={"image": [fastload.transforms.Resize((8, 8))]})
    run = fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=5, rank=0, world_size=2)  # the run that saved
    list(run)
    it = iter(run)
    before = [next(it)[2].tolist() for _ in range(2)]
    state = run.state_dict()
    rest = [b[2].tolist() for b in it]
    run.set_epoch(3)
    later = [b[2].tolist() for b in run]
    restored = fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=seed)
    restored.load_state_dict(state)
    moved = fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=seed)
    moved.load_state_dict(state)
    moved.set_epoch(3)  # another epoch: the loaded position goes, the state's seed stays
    monkeypatch.setattr(dist, "is_initialized", lambda: True)  # prepare runs under the process group
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepare(FakeAccelerator(rank=0, world=2), restored)
        got = [b[2].tolist() for b in restored]
        prepare(FakeAccelerator(rank=0, world=2), moved)
        assert [b[2].tolist() for b in moved] == later and moved.seed == 5
    assert not [b for b in got if b in before], "batches read before the checkpoint were read again"
    assert got == rest
    assert restored.seed == 5
