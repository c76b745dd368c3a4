"""kiln's SLURM launcher (``launcher=slurm``): hydra-submitit-launcher's ``SlurmLauncher``
whose batch scripts pass a signal to the job step and keep one that came before it
(:mod:`kiln.experiments.launchers.slurm_batch`), whose jobs defer a preemption signal from
their first instant until submitit can requeue on it and requeue once, and whose submitter stops
waiting on a job SLURM has ended or forgotten (:mod:`kiln.experiments.launchers.slurm`).

A Hydra plugin lives below ``hydra_plugins`` (Hydra refuses a launcher class elsewhere);
Hydra imports this module at every start, so it imports nothing heavy, and nothing at all
where hydra-submitit-launcher (kiln-experiments' ``submitit`` extra) is not installed.
"""

import logging
from collections.abc import Sequence
from typing import Any

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
except ImportError:  # the submitit extra is not installed: no launcher=slurm
    SlurmLauncher = None  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)

if SlurmLauncher is not None:
    from dataclasses import dataclass

    from hydra.core.config_store import ConfigStore
    from hydra.errors import CompactHydraException
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf

    @dataclass
    class KilnSlurmQueueConf(SlurmQueueConf):
        """hydra-submitit-launcher's SLURM settings, and kiln's."""

        _target_: str = "hydra_plugins.kiln_slurm_launcher.KilnSlurmLauncher"
        preempt_requeue: str = "auto"
        """When SLURM preempts a job, once it is checkpointed: ``auto`` requeues it unless
        its partition's ``PreemptMode`` is ``CANCEL``, ``true`` always, ``false`` never (it
        stops; a re-run of the sweep resumes it). Time limits requeue whatever it says."""

    ConfigStore.instance().store(
        group="hydra/launcher", name="kiln_slurm", node=KilnSlurmQueueConf, provider="kiln"
    )

    class SweepJobLost(CompactHydraException):
        """A job of the sweep left no result (``SlurmJobLost``); Hydra prints the message
        alone."""

    class KilnSlurmLauncher(SlurmLauncher):
        """``SlurmLauncher`` with kiln's job entry and its submitter's watch on SLURM."""

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            from kiln.experiments.launchers.slurm import (
                forget_earlier_result,
                guard_requeue,
                ignore_stop_signals,
                replay_deferred_signal,
                requeue_if_preempted,
                set_preempt_requeue,
            )

            set_preempt_requeue(self.params.get("preempt_requeue", "auto"))
            forget_earlier_result()  # a requeued attempt's result is this attempt's alone
            guard_requeue()  # in the job: submitit's handlers are in place now
            replay_deferred_signal()
            try:
                result = super().__call__(*args, **kwargs)
            except SystemExit as stopped:  # SIGTERM outside the step loop: recorded, stopped
                requeue_if_preempted(stopped)
                raise
            ignore_stop_signals()  # the job ended as its record says: the task ends so too
            return result

        @staticmethod
        def check_settings(params: Any) -> None:
            """Refuse a bad ``hydra.launcher`` key of kiln's: a sweep's check of every job
            (:mod:`kiln.experiments.jobs.sweep_check`) calls this before anything is made.

            Raises:
                ValueError: One line naming the key, the value and what is valid.
            """
            from kiln.experiments.launchers.slurm import check_preempt_requeue

            check_preempt_requeue(params.get("preempt_requeue", "auto"))

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
            """Submit one SLURM job per Hydra job (an array), as ``SlurmLauncher`` does,
            and wait for their results
            (:func:`kiln.experiments.launchers.slurm.wait_for_results`)."""
            import submitit
            from hydra.core.utils import filter_overrides
            from hydra.errors import ConfigCompositionException

            from kiln.experiments.launchers.slurm import (
                SlurmJobLost,
                check_preempt_requeue,
                preemption_signal,
                wait_for_results,
            )
            from kiln.experiments.launchers.slurm_batch import batch_setup, task_command
            from kiln.experiments.launchers.submitit_sweep import (
                submit_jobs,
                sweep_dir,
                update_parameters,
            )

            assert self.config is not None
            params = dict(self.params)
            try:  # each job reads it; refused here, before anything is submitted
                check_preempt_requeue(params.pop("preempt_requeue", "auto"))
            except ValueError as error:
                raise ConfigCompositionException(str(error)) from None  # one line, no trace
            folder = params.pop("submitit_folder")
            executor = submitit.AutoExecutor(
                folder=folder,
                cluster="slurm",
                slurm_max_num_timeout=params.pop("max_num_timeout"),
                slurm_python=task_command(),
            )
            # SLURM's warning goes to the batch shell, which passes it on or keeps it for a
            # step that has not started yet (a site's additional_parameters.signal wins)
            name = preemption_signal().name.removeprefix("SIG")
            signal_at = f"B:{name}@{params['signal_delay_s']}"
            extra = {"signal": signal_at, **(params.pop("additional_parameters", None) or {})}
            params["additional_parameters"] = extra
            params["setup"] = [*batch_setup(str(folder), name), *(params.get("setup") or [])]
            update_parameters(executor, params, "slurm")
            directory = sweep_dir(self.config, "slurm")
            numbers = range(initial_job_idx, initial_job_idx + len(job_overrides))
            names = [
                f"#{idx} {' '.join(filter_overrides(o))}".strip()
                for idx, o in zip(numbers, job_overrides, strict=True)
            ]
            for name in names:
                log.info(f"\t{name}")
            jobs, job_dirs = submit_jobs(self, executor, job_overrides, numbers, directory)
            try:
                return wait_for_results(jobs, names, job_dirs)
            except SlurmJobLost as lost:  # the message says it all: no traceback
                raise SweepJobLost(str(lost)) from None
