"""Checkpoints: what one holds (``registry.py``), saving (``save.py``) and loading
(``load.py``) the one format every strategy writes, finding them and telling a damaged
one (``lookup.py``), RNG state (``rng.py``), checksums (``checksum.py``) and the directory
one run owns (``rundir.py``).

Nothing is imported here: import a name from its module (``kiln.core`` exports only what
a user of ``fit`` needs).
"""
