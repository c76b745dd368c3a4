"""Beyond one process: starting worker processes (``launch.py``), stopping every rank alike
on a signal (``stop.py``), each rank's threads (``threads.py``) and FSDP2 sharding
(``sharding.py``).

Nothing is imported here: each module is imported where it is used; the names the other
kiln packages use are exported by ``kiln.core``.
"""
