"""kiln's Hydra sweeper: the basic sweeper with ``repeat=range(N)`` interleaved (A B A B).

Hydra's basic sweeper runs the product of the swept keys with the *last* key varying fastest,
and puts a sweep file's keys before the command line's: ``-m sweep=compile repeat=range(3)``
would run A A A B B B, so a drift of the machine (other work starting) lands on one variant.
:class:`InterleavedSweeper` moves the ``repeat`` key first, so every repeat runs all variants
before the next one starts. Hydra finds it by scanning ``hydra_plugins`` (its rule for
plugins) after its own, so this module's ``hydra/sweeper: basic`` replaces Hydra's; another
sweeper (Optuna's) is left alone. (No ``from __future__ import annotations``: Hydra's scan
imports this module outside ``sys.modules``, where dataclasses cannot resolve string types.)
"""

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore

from kiln.experiments.settings.repeats import REPEAT_KEY
from kiln.experiments.upstream_internals import basic_sweeper

BasicSweeper = basic_sweeper()


class InterleavedSweeper(BasicSweeper):
    """Hydra's basic sweeper, with the ``repeat`` override varying slowest (interleaved).
    kiln checks every job of the sweep before the sweeper starts
    (:mod:`kiln.experiments.jobs.sweep_check`)."""

    @staticmethod
    def split_arguments(overrides: list[Any], max_batch_size: int | None) -> list[list[list[str]]]:
        ordered = sorted(overrides, key=lambda o: o.get_key_element() != REPEAT_KEY)
        return BasicSweeper.split_arguments(ordered, max_batch_size)

    def validate_batch_is_legal(self, batch: Any) -> None:
        """Hydra's check that each job's config composes, left out for the jobs kiln's check
        of the whole sweep composed and checked already (``SweepConfigCheck``)."""
        from kiln.experiments.jobs.sweep_check import checked

        if not all(checked(job) for job in batch):
            super().validate_batch_is_legal(batch)


@dataclass
class InterleavedSweeperConf:
    """``hydra/sweeper: basic`` as kiln runs it (the fields of Hydra's ``BasicSweeperConf``)."""

    _target_: str = f"{__name__}.InterleavedSweeper"
    max_batch_size: int | None = None
    params: dict[str, str] | None = None


ConfigStore.instance().store(
    group="hydra/sweeper", name="basic", node=InterleavedSweeperConf, provider="kiln"
)
