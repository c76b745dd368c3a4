"""What kiln's two submitit launchers (``launcher=slurm``, ``launcher=local_submitit``) do
alike, as hydra-submitit-launcher does it: set the executor's parameters, make the sweep
directory, and submit one job per Hydra job as an array."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def update_parameters(executor: Any, params: dict[str, Any], prefix: str) -> None:
    """Give ``executor`` the launcher's ``params``: the keys every submitit executor shares
    as they are, the others with the executor's ``prefix`` (``slurm``, ``local``)."""
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    shared = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(
        **{k if k in shared else f"{prefix}_{k}": v for k, v in params.items()}
    )


def sweep_dir(config: Any, kind: str) -> Path:
    """The sweep's directory (``hydra.sweep.dir``), made, with ``hydra.sweep.mode``."""
    directory = Path(str(config.hydra.sweep.dir))
    log.info(f"Submitit '{kind}' sweep output dir : {directory}")
    directory.mkdir(parents=True, exist_ok=True)
    if "mode" in config.hydra.sweep:
        directory.chmod(int(str(config.hydra.sweep.mode), 8))
    return directory


def submit_jobs(
    launcher: Any,
    executor: Any,
    job_overrides: Sequence[Sequence[str]],
    numbers: Sequence[int],
    directory: Path,
) -> tuple[list[Any], list[Path]]:
    """Submit job ``numbers[i]`` with ``job_overrides[i]`` (``launcher`` is what each job
    calls); returns the submitit jobs and their job directories (``hydra.sweep.subdir``'s
    default)."""
    from hydra.core.singleton import Singleton

    state = Singleton.get_state()
    jobs = executor.map_array(
        launcher,
        [list(o) for o in job_overrides],
        ["hydra.sweep.dir"] * len(numbers),
        list(numbers),
        [f"job_id_for_{idx}" for idx in numbers],
        [state] * len(numbers),
    )
    return jobs, [directory / str(idx) for idx in numbers]
