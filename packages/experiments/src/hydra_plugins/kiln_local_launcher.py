"""kiln's local submitit launcher (``launcher=local_submitit``): hydra-submitit-launcher's
``LocalLauncher`` whose sweep owns its jobs (:mod:`kiln.experiments.launchers.local`):
stopping the sweep or any job stops every job at a step boundary with a checkpoint, leaves
no process, and ends with one line per job naming its state.

A Hydra plugin lives below ``hydra_plugins`` (Hydra refuses a launcher class elsewhere);
Hydra imports this module at every start, so it imports nothing heavy, and nothing at all
where hydra-submitit-launcher (kiln-experiments' ``submitit`` extra) is not installed.
"""

import logging
from collections.abc import Sequence
from typing import Any

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher
except ImportError:  # the submitit extra is not installed: no launcher=local_submitit
    LocalLauncher = None  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)

if LocalLauncher is not None:
    from dataclasses import dataclass

    from hydra.core.config_store import ConfigStore
    from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf

    @dataclass
    class KilnLocalQueueConf(LocalQueueConf):
        """hydra-submitit-launcher's local settings, with kiln's launcher."""

        _target_: str = "hydra_plugins.kiln_local_launcher.KilnLocalLauncher"

    ConfigStore.instance().store(
        group="hydra/launcher", name="kiln_local", node=KilnLocalQueueConf, provider="kiln"
    )

    class KilnLocalLauncher(LocalLauncher):
        """``LocalLauncher`` whose sweep owns its jobs' processes."""

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
            """Start one local submitit job per Hydra job, as ``LocalLauncher`` does, and
            wait for them (:func:`kiln.experiments.launchers.local.wait_for_jobs`)."""
            import submitit
            from hydra.core.utils import filter_overrides

            from kiln.experiments.launchers.local import own_jobs, wait_for_jobs
            from kiln.experiments.launchers.submitit_sweep import (
                submit_jobs,
                sweep_dir,
                update_parameters,
            )

            assert self.config is not None
            params = dict(self.params)
            executor = submitit.AutoExecutor(
                folder=params.pop("submitit_folder"),
                cluster="local",
                **({"local_max_num_timeout": params.pop("max_num_timeout")}
                   if "max_num_timeout" in params else {}),
            )  # fmt: skip
            own_jobs(executor)
            update_parameters(executor, params, "local")
            directory = sweep_dir(self.config, "local")
            numbers = range(initial_job_idx, initial_job_idx + len(job_overrides))
            for idx, overrides in zip(numbers, job_overrides, strict=True):
                log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            # a job's name in the sweep's last words: what sets it apart from the others
            common = set.intersection(*(set(o) for o in job_overrides))
            names = [
                f"#{idx} {' '.join(x for x in filter_overrides(o) if x not in common)}".strip()
                for idx, o in zip(numbers, job_overrides, strict=True)
            ]
            jobs, job_dirs = submit_jobs(self, executor, job_overrides, numbers, directory)
            return wait_for_jobs(jobs, names, job_dirs)
