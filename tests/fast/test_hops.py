"""One batch of the fast path enters each module of the chain once, the calls going upstream only (issue 20).

``count_hops.py`` profiles one ``next()`` (``num_workers=0``: one thread sees the whole path). Before the
chain (d1c4eaa) a batch made 33 calls across fastload's module boundaries, entering ``_order.py`` 3
times, ``_fill/batcher.py`` 3 (the reader called back into it), ``_front/stats.py`` 3 and ``_front/loader.py`` twice (the
slot and the generator came through it).
"""

from __future__ import annotations

import collections

from .count_hops import hops_of_one_batch

CHAIN = ["fastload.fast.position", "fastload.fast.collate", "fastload.fast.producer", "fastload.fast.fill",
         "fastload.fast.order"]  # downstream to upstream: each calls the next one's __next__
# the image field's path: _images gathers the batch's ImageSources (plain data) with one reader call and
# hands them to the decoder, which reads attributes only (before, _base was entered 5 times, the decoder
# calling back into the reader through ImageSources' closures)
IMAGES = ["fastload._fill.images", "fastload.decoders._base", "fastload.decoders.native"]
ONCE = CHAIN + ["fastload._fill.batcher", "fastload._ring", "fastload._front.stats"] + IMAGES


def test_one_batch_enters_each_stage_once_going_upstream():
    hops = hops_of_one_batch()
    entered = collections.Counter(callee for _, callee, _ in hops)
    assert {m: entered[m] for m in ONCE} == dict.fromkeys(ONCE, 1), hops
    chain = [(caller, callee) for caller, callee, fn in hops if callee in CHAIN]
    assert chain == [("fastload._front.loader", CHAIN[0])] + list(zip(CHAIN, CHAIN[1:])), chain
    # nothing below the chain calls back into it, nor into the loader
    assert not [h for h in hops if h[1] in CHAIN + ["fastload._front.loader"] and h[0] not in CHAIN + ["fastload._front.loader"]]
    # the decoders call nothing: neither the reader nor anything else of fastload, once given the batch
    assert not [h for h in hops if h[0] in IMAGES[1:]], hops
    assert [(c, fn) for c, m, fn in hops if m == "fastload.formats.reader" and c == "fastload._fill.images"] == \
        [("fastload._fill.images", "image_sources")], hops
    # the whole batch made 33 calls across fastload's module boundaries before the chain, 29 with it and 23 once
    # ImageSources became plain data (the rest are formats/ and fields/: `python tests/fast/count_hops.py --verbose`
    # lists them)
