"""Tests of fastload/sources/, one file per module (a package: its test_dataset.py is ``sources.test_dataset``)."""
