"""The tools a user runs beside training: ``fastload.doctor`` (doctor.py) and ``fastload bench`` (benchcmd.py).

The ``fastload`` command itself is ``fastload/cli.py`` (the entry point); nothing in the loader imports these.
"""
