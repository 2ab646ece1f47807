"""The fast path as a chain of stages (internal: nothing here is in ``fastload.__all__``).

  order.py     ``Order``: which indices go into which batch (seed, epoch, rank, world); the resume logic;
               ``Jobs``, the first stage: each batch's indices with its augmentation generator
  packing.py   ``BucketOrder``, ``PackedOrder`` (``PackJob``, ``packed_batches``, ``cu_seqlens``): the
               variable-length fields' batch planning, on ``Order``'s resume logic
  position.py  ``Progress`` (the position ``state_dict`` saves: one owner) and ``Count``, the last stage
  chain.py     ``order_for`` (which order a dataset takes) and ``fast_iterator``, which wires the stages
"""
