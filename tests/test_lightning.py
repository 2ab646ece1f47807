"""Real Lightning runs (CPU, devices=2, gloo on localhost) with examples/lightning_train.py: the fast path on
every rank, disjoint and complete ranks, a new order each epoch, a mid-epoch checkpoint resumed exactly, and an
end-of-epoch checkpoint too (Lightning loads no loader state then: the epoch reaches the loader through
set_epoch, see fastload/_front/loader.py's DataLoader docstring on resume)."""

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


pytest.importorskip("lightning")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent
N, BATCH, EPOCHS, CKPT_STEP = 48, 4, 2, 9  # 6 batches per rank and epoch; the checkpoint is epoch 1, batch 3

RUN = """
import json, sys
from pathlib import Path
import torch
import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

import lightning_train as ex  # examples/ is on PYTHONPATH: spawned ranks import it by name


class Record(L.Callback):
    def __init__(self, out):
        self.out, self.rows = Path(out), []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        images, ids = batch[0], batch[2]
        dl = trainer.train_dataloader
        self.rows.append(dict(epoch=trainer.current_epoch, batch=batch_idx, ids=ids.tolist(),
                              pixels=int(images.to(torch.int64).sum()), fast_path=dl.fast_path,
                              reason=dl.fast_path_reason, sampler=type(dl.sampler).__name__))

    def on_train_end(self, trainer, pl_module):
        (self.out / f"rank{{trainer.global_rank}}.json").write_text(json.dumps(self.rows))


class PlainImages(torch.utils.data.Dataset):  # not a fastload.Dataset: the generic path
    def __len__(self):
        return {n}

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8, generator=g), i % 4, i


def main():
    strategy, out, resume, mode, devices = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
    direct = mode == "direct"
    args = ex.parse_args([{data!r}, "--devices", devices, "--strategy", strategy, "--epochs", "{epochs}",
                          "--batch-size", "{batch}", "--image-size", "16", "--root", out])
    L.seed_everything(3, workers=True)  # also makes Lightning set its seeding worker_init_fn
    ckpt = ModelCheckpoint(dirpath=out + "/ckpt", every_n_train_steps={step}, save_top_k=-1,
                           filename="{{epoch}}-{{step}}")
    ends = ModelCheckpoint(dirpath=out + "/ends", every_n_epochs=1, save_top_k=-1, filename="end-{{epoch}}")
    callbacks = [Record(out), ckpt, ends]
    if mode == "own":  # no DistributedSampler injected: fastload's own order splits the ranks (torch.distributed's)
        trainer = L.Trainer(accelerator="cpu", devices=int(devices), strategy=strategy, max_epochs=args.epochs,
                            logger=False, callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,
                            default_root_dir=out, num_sanity_val_steps=0, use_distributed_sampler=False)
    else:
        trainer = ex.make_trainer(args, callbacks=callbacks)
    data = ex.PackedImages(args.data, 16, args.batch_size, num_workers=1, seed=5)
    model = ex.SmallCNN(4)
    resume = None if resume == "-" else resume
    if mode == "generic":
        import fastload
        loader = fastload.DataLoader(PlainImages(), batch_size={batch}, shuffle=True, num_workers=1)
        trainer.fit(model, train_dataloaders=loader, ckpt_path=resume)
    elif direct:  # built in this process and pickled to the spawned ranks
        trainer.fit(model, train_dataloaders=data.train_dataloader(), ckpt_path=resume)
    else:
        trainer.fit(model, datamodule=data, ckpt_path=resume)


if __name__ == "__main__":
    main()
"""


def run(tmp_path: Path, packed: Path, strategy: str, name: str, resume: str = "-", mode: str = "hook",
        devices: int = 2) -> dict:
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(RUN.format(data=str(packed), epochs=EPOCHS, batch=BATCH, step=CKPT_STEP, n=N)))
    out = tmp_path / name
    out.mkdir()
    # PYTHONFAULTHANDLER: a rank that dies of a signal prints which thread died, every Python thread's stack and
    # whether the interpreter was finalizing -- what the abort below still lacks to be explained
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "examples")]), MASTER_ADDR="127.0.0.1",
               OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run([sys.executable, str(script), strategy, str(out), resume, mode, str(devices)],
                          capture_output=True, text=True, timeout=280, env=env, cwd=tmp_path)
    if proc.returncode != 0 and _aborted_after_training(proc, out, devices):
        # A known, not yet explained abort of one spawned rank as it exits, after training and after its results
        # were written ("terminate called without an active exception"; seen in 2 of 4 fresh-clone `make test`
        # runs of this session, never when the test runs alone or in this file's run, ~40 tries; nor in ~140 runs of
        # this script, first and resumed, under load and with the ranks' exit timing perturbed, the next session).
        # It is reported as a warning and the run is repeated once; a second abort, or any other failure, fails.
        said = proc.stderr[max(0, proc.stderr.find("terminate called without an active exception")):]
        warnings.warn("a spawned rank aborted at exit after training (terminate called without an active "
                      "exception); repeating the run once. Its fault handler's report: " + said[:4000], RuntimeWarning)
        shutil.rmtree(out)
        out.mkdir()
        proc = subprocess.run([sys.executable, str(script), strategy, str(out), resume, mode, str(devices)],
                              capture_output=True, text=True, timeout=280, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "FastPathWarning" not in proc.stderr, proc.stderr[-3000:]
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(devices)}


def _aborted_after_training(proc, out: Path, devices: int = 2) -> bool:
    said = proc.stdout + proc.stderr
    return ("terminate called without an active exception" in said and "SIGABRT" in said and "max_epochs=" in said
            and all((out / f"rank{r}.json").is_file() for r in range(devices)))


def check_training_run(ranks: dict, fast: bool = True, sampler: str = "DistributedSampler") -> None:
    for rows in ranks.values():
        assert all(r["fast_path"] == fast for r in rows), rows[0]["reason"]
        assert {r["sampler"] for r in rows} == {sampler}  # Lightning's, driving the fast path (or fastload's)
        assert len(rows) == EPOCHS * N // 2 // BATCH
    for epoch in range(EPOCHS):
        seen = [[i for r in ranks[k] if r["epoch"] == epoch for i in r["ids"]] for k in range(2)]
        assert len(seen[0]) == len(seen[1]) == N // 2
        assert not set(seen[0]) & set(seen[1]) and set(seen[0]) | set(seen[1]) == set(range(N))
    order = [[r["ids"] for r in ranks[0] if r["epoch"] == e] for e in range(EPOCHS)]
    assert order[0] != order[1]  # reshuffled each epoch


def test_ddp_fast_path_ranks_epochs_and_mid_epoch_resume(tmp_path, numbered):
    packed = numbered(N)
    first = run(tmp_path, packed, "ddp", "first")
    check_training_run(first)
    ckpt = tmp_path / "first" / "ckpt" / f"epoch=1-step={CKPT_STEP}.ckpt"
    assert ckpt.exists(), sorted(p.name for p in (tmp_path / "first" / "ckpt").iterdir())
    resumed = run(tmp_path, packed, "ddp", "resumed", resume=str(ckpt))
    done = CKPT_STEP - N // 2 // BATCH  # batches of epoch 1 before the checkpoint
    for rank in range(2):
        want = [r for r in first[rank] if r["epoch"] == 1][done:]
        got = resumed[rank]
        assert [(r["epoch"], r["batch"]) for r in got] == [(1, b) for b in range(done, N // 2 // BATCH)]
        assert [(r["ids"], r["pixels"]) for r in got] == [(r["ids"], r["pixels"]) for r in want]
        assert all(r["fast_path"] for r in got)
    check_end_of_epoch_resume(tmp_path, packed, first, "ddp", "hook")


def check_end_of_epoch_resume(tmp_path: Path, packed: Path, first: dict, strategy: str, mode: str) -> None:
    """Resumed from the checkpoint at the end of epoch 0, each rank sees epoch 1's batches as the first run did
    (the same samples, and on the fast path the same augmentation, which is keyed by the epoch)."""
    ckpt = tmp_path / "first" / "ends" / "end-epoch=0.ckpt"
    assert ckpt.exists(), sorted(p.name for p in (tmp_path / "first" / "ends").iterdir())
    resumed = run(tmp_path, packed, strategy, "from_end", resume=str(ckpt), mode=mode)
    for rank in range(2):
        want = [(r["epoch"], r["batch"], r["ids"], r["pixels"]) for r in first[rank] if r["epoch"] == 1]
        assert [(r["epoch"], r["batch"], r["ids"], r["pixels"]) for r in resumed[rank]] == want


def test_ddp_spawn_pickles_the_loader_to_each_rank_and_resumes(tmp_path, numbered):
    # the loader is built in this process and passed to fit(): ddp_spawn pickles it to the two ranks
    packed = numbered(N)
    first = run(tmp_path, packed, "ddp_spawn", "first", mode="direct")
    check_training_run(first)
    ckpt = tmp_path / "first" / "ckpt" / f"epoch=1-step={CKPT_STEP}.ckpt"
    resumed = run(tmp_path, packed, "ddp_spawn", "resumed", resume=str(ckpt), mode="direct")
    done = CKPT_STEP - N // 2 // BATCH
    for rank in range(2):
        want = [r for r in first[rank] if r["epoch"] == 1][done:]
        assert [(r["ids"], r["pixels"]) for r in resumed[rank]] == [(r["ids"], r["pixels"]) for r in want]


def test_generic_path_loader_checkpoints_and_resumes_mid_epoch(tmp_path, numbered):
    # a plain torch Dataset through fastload.DataLoader: Lightning saves its state_dict in each checkpoint
    packed = numbered(N)
    first = run(tmp_path, packed, "ddp", "first", mode="generic")
    check_training_run(first, fast=False)
    ckpt = tmp_path / "first" / "ckpt" / f"epoch=1-step={CKPT_STEP}.ckpt"
    resumed = run(tmp_path, packed, "ddp", "resumed", resume=str(ckpt), mode="generic")
    done = CKPT_STEP - N // 2 // BATCH
    for rank in range(2):
        want = [r for r in first[rank] if r["epoch"] == 1][done:]
        assert [(r["ids"], r["pixels"]) for r in resumed[rank]] == [(r["ids"], r["pixels"]) for r in want]
    check_end_of_epoch_resume(tmp_path, packed, first, "ddp", "generic")


def test_fastloads_own_order_under_ddp_resumes_mid_epoch_and_at_epoch_end(tmp_path, numbered):
    # use_distributed_sampler=False: the loader's own order (seeded, a new permutation each epoch) splits the
    # ranks; Lightning's epoch reaches it through loader.sampler.set_epoch
    packed = numbered(N)
    first = run(tmp_path, packed, "ddp", "first", mode="own")
    check_training_run(first, sampler="EpochRandomSampler")
    ckpt = tmp_path / "first" / "ckpt" / f"epoch=1-step={CKPT_STEP}.ckpt"
    resumed = run(tmp_path, packed, "ddp", "resumed", resume=str(ckpt), mode="own")
    done = CKPT_STEP - N // 2 // BATCH
    for rank in range(2):
        want = [r for r in first[rank] if r["epoch"] == 1][done:]
        assert [(r["ids"], r["pixels"]) for r in resumed[rank]] == [(r["ids"], r["pixels"]) for r in want]
    check_end_of_epoch_resume(tmp_path, packed, first, "ddp", "own")


def test_fastloads_own_order_resumes_a_two_rank_checkpoint_on_one_rank(tmp_path, numbered):
    """Elastic resume under Lightning (use_distributed_sampler=False: fastload's own order): the mid-epoch checkpoint
    of a 2-device run, resumed on 1 device, reads the rest of the epoch once. (Onto a larger global batch -- 3
    devices here -- Lightning ends the resumed epoch early: it counts on from the checkpoint's 3 batches up to
    ``len(loader)``, 4, of the 2 left; docs/guide/resume.md says so.)"""
    packed = numbered(N)
    first = run(tmp_path, packed, "ddp", "first", mode="own")
    ckpt = tmp_path / "first" / "ckpt" / f"epoch=1-step={CKPT_STEP}.ckpt"
    resumed = run(tmp_path, packed, "ddp", "resumed", resume=str(ckpt), mode="own", devices=1)
    done = CKPT_STEP - N // 2 // BATCH
    before = [i for r in range(2) for row in [x for x in first[r] if x["epoch"] == 1][:done] for i in row["ids"]]
    after = [i for row in resumed[0] if row["epoch"] == 1 for i in row["ids"]]
    assert len(before) == 2 * done * BATCH
    assert not set(before) & set(after), "a sample read before the checkpoint was read again"
    assert set(before) | set(after) == set(range(N)) and len(after) == len(set(after))
    assert all(r["fast_path"] for rows in resumed.values() for r in rows)


def test_an_elastic_resume_under_lightning_reads_the_rest_of_the_epoch_and_whole_epochs_after(tmp_path, numbered):
    """One process: a mid-epoch checkpoint of a run at batch size 4 resumed at batch size 2 (elastic: another batch
    size). Lightning reads ``len(loader)`` once and counts the resumed epoch's batches on from the checkpoint's
    (here 2) up to it: with the resumed epoch's own count as ``len`` (3) it stopped after one batch of the three
    left and cut every later epoch to three batches of seven."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from fastload import transforms as T

    n = 13
    packed = numbered(n)

    class Model(L.LightningModule):
        def __init__(self, batch_size):
            super().__init__()
            self.lin, self.batch_size, self.rows = torch.nn.Linear(1, 1), batch_size, []

        def training_step(self, batch, i):
            self.rows.append((self.current_epoch, batch[2].tolist()))
            return self.lin(torch.ones(1, 1)).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            ds = fastload.open(packed, transforms={"image": [T.RandomResizedCrop(8)]})
            return fastload.DataLoader(ds, batch_size=self.batch_size, shuffle=True, seed=3)

    def fit(batch_size, resume=None):
        model = Model(batch_size)
        every = ModelCheckpoint(dirpath=tmp_path / f"b{batch_size}", every_n_train_steps=2, save_top_k=-1,
                                filename="{epoch}-{step}")
        trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=3, logger=False, callbacks=[every],
                            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                            use_distributed_sampler=False)
        trainer.fit(model, ckpt_path=resume)
        return model.rows

    first = fit(4)
    before = [i for epoch, ids in first if epoch == 0 for i in ids][:2 * 4]  # the checkpoint: epoch 0, 2 batches
    rows = fit(2, resume=str(tmp_path / "b4" / "epoch=0-step=2.ckpt"))
    rest = [i for epoch, ids in rows if epoch == 0 for i in ids]
    assert sorted(before + rest) == list(range(n)), f"read before {before}, after the resume {rest}"
    for epoch in (1, 2):
        assert sorted(i for e, ids in rows if e == epoch for i in ids) == list(range(n)), f"epoch {epoch}"
