"""Reading and verifying packed datasets. One module per on-disk format (``shards.py``, the default;
``lmdb.py``), each defining its ``Format`` (``_format.py``: the interface, writer included) and listed
once in ``registry.py``; ``reader.py`` is the one way in for readers; ``_layout.py`` and ``_manifest.py``
are shared by every format; ``remote.py`` and ``_cache.py`` reach shards at a URL through a local cache.
Writing a dataset is ``fastload/pack/``'s job: it finds each format's writer through the registry."""
