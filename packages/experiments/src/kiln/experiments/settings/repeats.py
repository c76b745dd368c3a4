"""Repeats of a sweep's configurations: ``-m compile=none,default repeat=range(3)`` runs
each configuration 3 times, interleaved (A B A B A B), so a drift of a shared machine hits
every variant alike and kiln-report can bootstrap across the repeats.

The interleaving is Hydra's basic sweeper with the ``repeat`` key moved first
(``hydra_plugins.kiln_sweeper.InterleavedSweeper``, which kiln installs as ``basic``).
"""

REPEAT_KEY = "repeat"
"""The config key that numbers a configuration's repeats
(:attr:`kiln.experiments.settings.base.JobConfig.repeat`): runs that differ only in it are repeats
of one configuration."""
