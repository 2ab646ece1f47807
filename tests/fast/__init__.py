"""Tests of fastload/fast/, one file per module (a package, so that its conftest.py is ``fast.conftest``)."""
