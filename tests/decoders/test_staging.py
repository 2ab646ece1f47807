"""decoders/_staging.py: the GPU decoders' small per-batch arrays reach the device through pinned staging on the
simulated GPU (tests/sim_streams.py), whose copies run late and which records every host wait."""

from __future__ import annotations

import numpy as np
import torch

from fastload.decoders._staging import Uploads
from sim_streams import SimGpu


def test_uploads_never_wait_and_refill_a_buffer_only_after_its_copy_completed():
    sim = SimGpu()
    dec = sim.fork("decoder")
    up = Uploads(dec, min_elements=8)
    with dec.side_context():
        crops, = up.put(np.array([[1, 2], [3, 4]]))
        idx, flips = up.put(np.array([5, 6, 7]), np.array([True, False]))
    assert len(up.buffers) == 2  # the first copy has not run: its buffer is not refilled
    assert not sim.host_waits  # pinned: no copy from pageable memory waited for the stream
    sim.run_all()
    assert crops.tolist() == [[1, 2], [3, 4]] and idx.tolist() == [5, 6, 7] and flips.tolist() == [1, 0]
    with dec.side_context():
        more, = up.put(np.arange(3))
        big, = up.put(np.arange(20))  # larger than every buffer: a new one
    assert len(up.buffers) == 3  # the completed one was found by a query and refilled
    sim.run_all()
    assert more.tolist() == [0, 1, 2] and big.tolist() == list(range(20))
    assert not sim.host_waits and not sim.races


def test_packed_uploads_keep_every_dtype_and_shape_and_never_wait():
    """put_packed (an augmentation plan's columns: float64 matrices, bool, uint8, int64, empty ones) through the
    same pinned buffers: one copy, no host wait, each array back with its dtype and shape; a buffer is refilled
    only once its copy completed. Fails with the offsets not 8-byte aligned (a float64 view of an odd offset)
    or the dtype table wrong."""
    sim = SimGpu()
    dec = sim.fork("decoder")
    up = Uploads(dec, min_elements=4)
    arrays = [np.arange(3, dtype=np.int64), np.linspace(0, 1, 12).reshape(2, 2, 3), np.array([True, False, True]),
              np.arange(5, dtype=np.uint8), np.zeros((0, 2, 3)), np.array([7, 8], np.int32), np.float32([0.5])]
    with dec.side_context():
        out = up.put_packed(arrays)
        again = up.put_packed(arrays[:2])
    assert len(up.buffers) == 2 and not sim.host_waits  # the first copy has not run: a second buffer
    sim.run_all()
    for a, t in zip(arrays, out):
        assert t.dtype == torch.from_numpy(a).dtype and tuple(t.shape) == a.shape
        assert np.array_equal(t.numpy(), a)
    assert np.array_equal(again[1].numpy(), arrays[1])
    with dec.side_context():
        up.put_packed(arrays[:1])
    assert len(up.buffers) == 2 and not sim.host_waits and not sim.races  # a completed buffer, found by a query
