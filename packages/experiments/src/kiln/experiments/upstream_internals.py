"""The one place kiln.experiments uses another project's private API, each with why it is kept.

- ``atexit._run_exitfuncs`` (:func:`run_exit_handlers`): a finished ``kiln-train`` process
  runs its exit handlers, flushes and ends with ``os._exit(0)``, skipping the interpreter's
  teardown of torch, Lightning and transformers, which takes seconds and writes nothing
  (docs/benchmarks.md, "Other projects' private API"). CPython has no public way to run the
  registered handlers early.
- Hydra's ``BasicSweeper`` (:func:`basic_sweeper`, from ``hydra._internal``): kiln's sweeper is
  Hydra's basic sweeper with the ``repeat`` key varying slowest, so repeats interleave
  (A B A B) and a machine's drift does not land on one variant; Hydra exposes the sweeper's
  expansion only through this class.
- ``wandb.sdk.launch.inputs.internal`` (:data:`WANDB_INIT_IMPORTS`): what ``wandb.init``
  imports, imported before the model and Fabric, where it costs about half as much
  (docs/benchmarks.md, "Other projects' private API"). Imported by name: a W&B release
  without it only loses the head start.

``tests/test_upstream_internals.py`` fails when one of these names moves upstream, and when
any other kiln module imports a private name of torch, Lightning, Hydra or W&B.
"""

from __future__ import annotations

import atexit
from typing import Any

__all__ = ["WANDB_INIT_IMPORTS", "basic_sweeper", "run_exit_handlers"]

WANDB_INIT_IMPORTS = ("wandb", "wandb.sdk.launch.inputs.internal")
"""What ``wandb.init`` imports (the second: its W&B Launch inputs, and with them W&B's public
API models), which ``kiln.experiments.tracking.tracker.import_early`` imports early."""


def basic_sweeper() -> Any:
    """Hydra's ``BasicSweeper`` class as Hydra's plugin scan left it: the scan loads its core
    plugins' modules anew, so the class is looked up when a plugin subclasses it, not when
    this module is imported."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return BasicSweeper


def run_exit_handlers() -> None:
    """Every ``atexit`` handler, in CPython's order, now (each runs once)."""
    atexit._run_exitfuncs()  # pyright: ignore[reportPrivateUsage]
