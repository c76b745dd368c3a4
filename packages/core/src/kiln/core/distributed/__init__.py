"""Beyond one process: starting worker processes (``launch.py``) and FSDP2 sharding
(``sharding.py``).

Nothing is imported here: each module is imported where it is used.
"""
