"""``kiln-bench``: eager against ``torch.compile`` training steps of one model, one Hydra job.

Each job benchmarks one model x precision x compile mode (see
:mod:`kiln.experiments.bench.harness` for the method), writes ``bench.json`` into its
output directory and logs one W&B run. A model that fails the accuracy check or raises is
a row with status ``fail`` or ``error`` and its reason; the sweep goes on.

Examples::

    kiln-bench                                        # tiny BERT, compile=default, 32-true
    kiln-bench -m precision=32-true,bf16-mixed        # about a minute on the CPU
    kiln-bench -m model=bert-tiny-cls,vit-tiny compile=none,default
    kiln-bench -m sweep=bench_hf                      # a dozen HF architectures (GPU-sized)
    kiln-report multirun/<date>/<time>                # the speedup table of a sweep
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from kiln.experiments.bench.bench_config import register_configs
from kiln.experiments.jobs.fast_exit import end_interrupted
from kiln.experiments.settings.compose import run_hydra_app
from kiln.experiments.settings.job_info import BENCH, JobInfo


def result_line(record: dict[str, Any]) -> str:
    """``kiln-bench <model> <precision> compile=<mode>: <status>, speedup ... (reason)``."""
    speedup = record.get("speedup")
    return (
        f"kiln-bench {record['model']} {record['precision']} compile={record['compile_mode']}: "
        f"{record['status']}"
        + (
            f", speedup {speedup:.3f} (95% CI {record['speedup_ci_low']:.3f}-"
            f"{record['speedup_ci_high']:.3f}{'' if record['significant'] else ', noise'})"
            if speedup
            else ""
        )
        + (f", compile {record['compile_time_s']:.1f}s" if record.get("compile_time_s") else "")
        + (f" ({record['reason']})" if record.get("reason") else "")
    )


def task(cfg: DictConfig) -> float | None:
    """The Hydra task: one benchmark. Returns the speedup (for sweepers) or ``None``."""
    # Imported here: --help, --cfg and config errors do not pay for Fabric and the models.
    from kiln.experiments.bench.bench_job import run_bench_job
    from kiln.experiments.jobs.lifecycle import JobFailed

    job = JobInfo.from_hydra(cfg)
    if cfg.get("print_config"):
        print(OmegaConf.to_yaml(cfg, resolve=True))
    record = run_bench_job(cfg, job)
    print(result_line(record))
    if record["status"] == BENCH.failed_status and job.sweep_dir is None:
        raise JobFailed(record["reason"])
    return record.get("speedup")


def main() -> None:
    """Console script entry point (an interrupted run ends killed by SIGINT)."""
    try:
        run_hydra_app(task, "bench", register_configs)
    except KeyboardInterrupt as interrupt:
        end_interrupted(interrupt)


if __name__ == "__main__":
    main()
