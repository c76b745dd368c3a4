"""Beyond one process: starting worker processes (``launch.py``), stopping every rank alike
on a signal (``stop.py``), each rank's threads (``threads.py``) and FSDP2 sharding
(``sharding.py``).

Nothing is imported here: import a name from its module (``kiln.core`` exports only what
a user of ``fit`` needs).
"""
