"""The fast path as a chain of stages (internal: nothing here is in ``fastload.__all__``).

One batch goes through the stages in this order; each takes its upstream and the collaborators it uses,
never the loader, and speaks ``stage.Stage``'s protocol (next, state, reset, close):

  order.py      ``Order``: which indices go into which batch (seed, epoch, rank, world) and the one resume
                logic; ``Jobs``, the first stage: each batch's indices with its augmentation generator
  packing.py    ``BucketOrder``, ``PackedOrder`` (``packed_batches``: ``_sequences.PackJob`` batches): the
                variable-length fields' batch planning, on ``Order``'s resume logic
  readahead.py  ``ReadAhead``: a remote dataset's read plan downloads the coming batches' shards
  fill.py       ``Fill``: a free host slot filled by the batcher with the pool it was given
  producer.py   ``Produce``: the calling thread or a producer thread fills, as ``FillPolicy`` measures
  collate.py    ``Collate``: the slot as default_collate's batch (``Collator``); the caller's wait and step
  device.py     ``DevicePrefetcher`` (``device='cuda'``): side-stream copies into a ``DeviceRing``, handed
                over by events; ``to_device``
  position.py   ``Progress`` (the position ``state_dict`` saves, one writer) and ``Count``, the last stage
  chain.py      ``order_for`` (which order a dataset takes), ``fast_iterator`` (wires the stages, with
                ``device.DevicePrefetcher`` before ``Count`` for ``device='cuda'``), ``FastIterator``
"""
