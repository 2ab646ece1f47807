"""Filling one slot: the batcher's one native call per batch (batcher.py) and the image fields' decoders and
plans (images.py). The fast path's chain (``fast/``) drives it; it knows nothing of the chain.
"""
