"""On-disk formats: ``shards.py`` (default), ``lmdb.py``; ``_layout.py`` and ``_manifest.py`` are shared."""
