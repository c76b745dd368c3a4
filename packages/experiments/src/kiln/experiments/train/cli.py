"""``kiln-train``: compose the config, train, report. One Hydra job = one run.

Examples::

    kiln-train                                    # the default run (MiniLM on generated text, CPU)
    kiln-train experiment=vit_digits trainer.max_steps=200
    kiln-train -m precision=32-true,bf16-mixed compile=none,default
    kiln-train -m sweep=devices debug=fast        # trainer.devices=1,2: worker processes per job
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from kiln.experiments.jobs.fast_exit import end_interrupted, end_process
from kiln.experiments.settings.compose import run_hydra_app
from kiln.experiments.train.objective import OptimizedMetric, objective_value
from kiln.experiments.train.train_config import register_configs


def task(cfg: DictConfig) -> float:
    """The Hydra task: one job. Returns ``optimized_metric``'s value for sweepers; a failed or
    non-finite trial returns the worst value (``+inf`` for ``min``, ``-inf`` for ``max``)."""
    # Imported here: --help, --cfg and config errors never reach the task, so they do not
    # pay for Fabric, transformers and timm.
    from kiln.experiments.jobs.console import job_table, show_table
    from kiln.experiments.settings.job_info import JobInfo
    from kiln.experiments.train.train_job import run_job
    from kiln.experiments.train.worker import global_rank

    job = JobInfo.from_hydra(cfg)
    if cfg.get("print_config") and global_rank() == 0:
        print(OmegaConf.to_yaml(cfg, resolve=False))  # resolving here would escape run_job
    summary = run_job(cfg, job)
    if global_rank() == 0:
        show_table(job_table(summary))  # the error, once; the traceback is in error.log
    if summary["status"] != "ok":
        if job.sweep_dir is None:
            raise SystemExit(1)  # exit non-zero without Hydra printing a second traceback
    # a failed job in a sweep: the sweep goes on; SweepStatus makes it exit non-zero at the end
    return objective_value(summary, optimized_metric(cfg))


def optimized_metric(cfg: DictConfig) -> OptimizedMetric:
    """``cfg.optimized_metric`` (the default metric where the config does not resolve)."""
    node = cfg.get("optimized_metric")
    try:
        return (
            OptimizedMetric(**OmegaConf.to_container(node, resolve=True))
            if node
            else OptimizedMetric()
        )
    except Exception:
        return OptimizedMetric()


def main() -> None:
    """Console script entry point: the process ends here (a failed job exits non-zero
    through ``SystemExit``; a finished one without the interpreter's teardown; an
    interrupted one killed by SIGINT)."""
    try:
        run_hydra_app(task, "train", register_configs)
    except KeyboardInterrupt as interrupt:
        end_interrupted(interrupt)
    end_process()


if __name__ == "__main__":
    main()
