"""decoders/_staging.py: the GPU decoders' small per-batch arrays reach the device through pinned staging on the
simulated GPU (tests/sim_streams.py), whose copies run late and which records every host wait."""

from __future__ import annotations

import numpy as np

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
