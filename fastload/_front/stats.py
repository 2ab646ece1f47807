"""Stall metrics: cheap counters that tell whether training waits for data.

Two ``perf_counter`` reads per batch on the consumer side and two around each fill; nothing
else. ``loader.stats()`` returns them; ``summary()`` says in one line whether the loop is input-bound.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


class LoaderStats:
    """Counters for one loader, accumulated over its iterations (``reset()`` clears them)."""

    INPUT_BOUND = 0.10  # waiting more than this share of the loop's time means the GPU/CPU step starves

    def __init__(self):
        self.mixing: Any = None  # a mix's (fast/mixing.py): samples handed out are then counted per dataset
        self.from_datasets: np.ndarray | None = None
        self.reset()

    def count_datasets(self, mixing: Any) -> None:
        """Count the samples of the batches handed out by the dataset of ``mixing`` (``fastload.mix``) they
        come from (``mix_counts``)."""
        self.mixing = mixing
        self.from_datasets = np.zeros(len(mixing.names), np.int64)

    def reset(self) -> None:
        self.batches = 0
        self.samples = 0
        self.wait_s = 0.0  # consumer blocked in __next__ waiting for a batch
        self.step_s = 0.0  # consumer time between batches (the training step)
        self.fill_s = 0.0  # time filling the batches handed out (gather + decode + transform), any thread
        self.queue_depth = 0  # sum of ready batches seen at each __next__ (mean = / batches)
        self.skipped = 0
        self._last: float | None = None
        self.from_datasets = None if self.mixing is None else np.zeros(len(self.mixing.names), np.int64)

    # consumer side
    def took(self, started: float, samples: int, ready: int = 0, fill_s: float = 0.0, indices: Any = None) -> None:
        """A batch handed to the caller: ``started`` when it asked (the step before it: since the last one);
        ``ready`` batches were queued behind it; filling it took ``fill_s`` (in whichever thread filled it);
        ``indices``: its samples (counted per dataset for a mix)."""
        now = time.perf_counter()
        if self.from_datasets is not None and indices is not None:
            self.from_datasets += self.mixing.counts(indices)
        self.fill_s += fill_s
        if self._last is not None:
            self.step_s += started - self._last
        self.wait_s += now - started
        self.batches += 1
        self.samples += samples
        self.queue_depth += ready
        self._last = now

    def mix_counts(self) -> dict[str, int] | None:
        """Samples handed out per dataset of a mix (by name); None for any other dataset."""
        if self.from_datasets is None:
            return None
        return dict(zip(self.mixing.names, self.from_datasets.tolist()))

    def end_epoch(self) -> None:
        self._last = None  # time between epochs is not a training step

    def as_dict(self) -> dict:
        loop = self.wait_s + self.step_s
        return {
            "batches": self.batches,
            "samples": self.samples,
            "wait_s": self.wait_s,
            "step_s": self.step_s,
            "fill_s": self.fill_s,
            "wait_fraction": self.wait_s / loop if loop > 0 else 0.0,
            "mean_queue_depth": self.queue_depth / self.batches if self.batches else 0.0,
            "samples_per_s": self.samples / loop if loop > 0 else 0.0,
            "fill_ms_per_batch": 1e3 * self.fill_s / self.batches if self.batches else 0.0,
        }

    def summary(self) -> str:
        d = self.as_dict()
        if not d["batches"]:
            return "fastload: no batches yet"
        head = (
            f"fastload: {d['batches']} batches, {d['samples_per_s']:,.0f} samples/s; the loop waited "
            f"{d['wait_s']:.2f} s of {d['wait_s'] + d['step_s']:.2f} s ({d['wait_fraction']:.0%})"
        )
        if d["wait_fraction"] > self.INPUT_BOUND:
            return (
                head + ": INPUT-BOUND — the step starves for data (more num_workers, a lighter transform, "
                "or 'fastload bench' to find the bottleneck)"
            )
        return head + ": not input-bound"
