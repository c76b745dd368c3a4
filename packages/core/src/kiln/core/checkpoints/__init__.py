"""Checkpoints: single-file and sharded saves and loads (``checkpoint.py``, ``sharded.py``),
what a checkpoint path may be (``paths.py``), the directory one run owns (``rundir.py``) and
the resume stage of ``fit`` (``resume.py``).

Nothing is imported here: each module is imported where it is used.
"""
