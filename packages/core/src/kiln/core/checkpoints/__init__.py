"""Checkpoints: saving (``save.py``) and loading (``load.py``) the one format every strategy
writes, finding them and telling a damaged one (``lookup.py``), RNG state (``rng.py``),
checksums (``checksum.py``) and the directory one run owns (``rundir.py``).

Nothing is imported here: each module is imported where it is used; the names the other
kiln packages use are exported by ``kiln.core``.
"""
