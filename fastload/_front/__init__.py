"""The loader's front: what a user constructs and calls.

``DataLoader`` (loader.py) and the packed ``Dataset`` / ``open`` (dataset.py), with what serves them: what
being a drop-in for torch's DataLoader asks (dropin.py), a user's sampler driving the fast path (sampling.py),
``__getitems__`` under torch's own loader (getitems.py), torchvision/timm folder datasets (tvfolder.py), the
pack-once cache of a folder (folder_cache.py), ``num_workers='auto'`` (autotune.py) and the stall counters
(stats.py). Below it: the fast path's chain (``fast/``), the slot fill (``_fill/``) and the generic path
(``_generic/``).
"""
