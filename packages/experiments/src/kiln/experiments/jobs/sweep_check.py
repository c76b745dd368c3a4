"""Every job of a sweep checked before the first one starts.

A single job refuses a bad config in its config stage, before it trains. In a sweep that
comes too late: job 0 trains to the end (hours, or a place in a SLURM queue) before job 1's
``optimizer.lr=-1`` is named. So when a sweep starts (the Hydra callback
:class:`~kiln.experiments.jobs.hydra_callbacks.SweepConfigCheck`, before the sweeper, the
launcher or any other callback writes anything), :func:`check_sweep` expands the sweep into
its jobs as the sweeper will (its own ``split_arguments`` over the sweep's overrides),
composes each job's config as the launcher will (Hydra's ``load_sweep_config``, with the
job's number and output directory), and runs the command's config-stage check on it
(``kiln-train``: :func:`kiln.experiments.train.train_config.check_job`; ``kiln-bench``:
:func:`kiln.experiments.bench.bench_config.validate`), and the launcher's check of its own
keys. Any bad job refuses the whole sweep in one message, one line per bad job (its number,
its overrides, the key, the value and what is valid). Every launcher (local,
local_submitit, slurm) gets the check: it runs before any of them is made.

A sweeper that samples its jobs (``hparams_search=``, Optuna) cannot list them up front:
what every trial shares (the config without the searched values) is checked instead.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

JobCheck = Callable[[DictConfig], object]
"""A command's config-stage check of one job's config (without its ``hydra`` node); raises
on a bad value with a message naming the key, the value and what is valid."""

_CHECKS: dict[str, JobCheck] = {}
_CHECKED: set[tuple[str, ...]] = set()  # the jobs checked (the sweeper skips its own compose)

SAMPLED = "every trial's shared config"
"""How the cost line and the message call what a sampling sweeper's check covers."""


def register_job_check(config_name: str, check: JobCheck) -> None:
    """Make ``check`` the config-stage check of the command whose primary config is
    ``config_name`` (``train``, ``bench``): its ``register_configs`` calls this."""
    _CHECKS[config_name] = check


def checked(job: Sequence[str]) -> bool:
    """Whether :func:`check_sweep` composed and checked the job with these overrides."""
    return tuple(job) in _CHECKED


class SweepRefused(SystemExit):
    """A sweep with a bad job, refused before any job started (exit status 1; the message
    lists them). A ``SystemExit``: Hydra turns a callback's ``Exception`` into a warning and
    goes on."""


def check_sweep(config: DictConfig) -> None:
    """Check every job of the sweep ``config`` describes, and its launcher's keys; print what
    the check cost.

    Args:
        config: The sweep's config (with its ``hydra`` node), as ``on_multirun_start`` has it.

    Raises:
        SweepRefused: A job's config does not compose or its command's check refuses it, or
            the launcher refuses a key of its own; the message names every one.
    """
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    start = time.perf_counter()
    loader = GlobalHydra.instance().config_loader()
    sampled = config_sampled(config)
    jobs = sweep_jobs(config, loader)
    check = _CHECKS.get(str(config.hydra.job.config_name))
    problems = _launcher_problems(config)
    varying = _varying_keys(jobs)
    earlier = HydraConfig.instance().cfg
    bad = 0
    _CHECKED.clear()
    composer = _Composer(config, loader)
    first = 0.0
    try:
        for num, job in enumerate(jobs):
            error = _job_error(composer, num, job, check)
            first = first or time.perf_counter() - start  # with the imports the jobs need
            if error is None:
                _CHECKED.add(tuple(job))
                continue
            bad += 1
            shown = [o for o in job if _key(o) in varying] or job
            name = SAMPLED if sampled else f"job #{num}"
            problems.append(" ".join([name, *shown]) + f": {error}")
    finally:
        HydraConfig.instance().cfg = earlier  # the sweep's own, as before (as run_job does)
    took = time.perf_counter() - start
    what = SAMPLED if sampled else f"{len(jobs)} jobs' configs"
    rest = f" (the first {first:.1f} s, with its imports)" if len(jobs) > 1 else ""
    print(f"kiln: checked {what} in {took:.1f} s{rest}", flush=True)
    if problems:
        head = f"{bad} of {len(jobs)} jobs" if bad else "its launcher"
        raise SweepRefused(
            f"sweep refused before any job started ({head} refused; nothing was written):\n"
            + "\n".join(problems)
        )


def config_sampled(config: DictConfig) -> bool:
    """Whether the sweep's sweeper samples its jobs (no ``split_arguments``: Optuna's)."""
    return getattr(_sweeper_class(config), "split_arguments", None) is None


def _sweeper_class(config: DictConfig) -> Any:
    from hydra.utils import get_class

    return get_class(str(config.hydra.sweeper._target_))


def sweep_jobs(config: DictConfig, loader: Any) -> list[list[str]]:
    """Each job's overrides, in the sweeper's order (job ``i`` is Hydra's job ``#i``): the
    sweeper's ``split_arguments`` over ``hydra.sweeper.params`` and the command line, as
    Hydra's basic sweeper does. A sampling sweeper's one "job": the command line without
    its sweeps (what every trial shares)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create(config_loader=loader)
    task = [str(o) for o in config.hydra.overrides.task]
    if config_sampled(config):
        return [
            [str(o.input_line) for o in parser.parse_overrides(task) if not o.is_sweep_override()]
        ]
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    arguments = [f"{key}={value}" for key, value in params.items()] + task
    batches = _sweeper_class(config).split_arguments(parser.parse_overrides(arguments), None)
    return [list(job) for batch in batches for job in batch]


def _launcher_problems(config: DictConfig) -> list[str]:
    """The launcher's own check of its keys (a ``check_settings(params)`` on its class)."""
    from hydra.utils import get_class

    target = OmegaConf.select(config, "hydra.launcher._target_")
    check = getattr(get_class(str(target)), "check_settings", None) if target else None
    if check is None:
        return []
    try:
        check(config.hydra.launcher)
    except Exception as error:
        return [f"launcher: {_one_line(error)}"]
    return []


class _Composer:
    """Each job's config as the launcher composes it (Hydra's ``load_sweep_config``), at a
    sweep's pace: a job whose overrides differ from a job composed before only in scalar
    values of config keys (not groups; Hydra's own defaults list tells them apart) is that
    job's config with those values set as Hydra sets them (``OmegaConf.update``, merged), a
    copy instead of a composition, which costs ~0.1 s a job. Anything else, or a value the
    update refuses, is composed in full, so a refusal is Hydra's own message."""

    def __init__(self, config: DictConfig, loader: Any) -> None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        self.config, self.loader = config, loader
        self.parser = OverridesParser.create(config_loader=loader)
        self.composed: dict[tuple[Any, ...], tuple[list[Any], DictConfig, set[str]]] = {}

    def compose(self, overrides: list[str]) -> DictConfig:
        parsed = self.parser.parse_overrides(overrides)
        shape = tuple((o.key_or_group, o.package, o.type) for o in parsed)
        earlier = self.composed.get(shape)
        if earlier is not None:
            copied = self._copied(parsed, *earlier)
            if copied is not None:
                return copied
        job_config = self.loader.load_sweep_config(self.config, overrides)
        if earlier is None:
            self.composed[shape] = (parsed, copy.deepcopy(job_config), self._values(overrides))
        return job_config

    def _values(self, overrides: list[str]) -> set[str]:
        """The keys of ``overrides`` that set config values (Hydra's ``config_overrides``),
        when none of them is inside another (then their order does not matter)."""
        from hydra.types import RunMode

        hydra = [str(o) for o in self.config.hydra.overrides.hydra]
        name = str(self.config.hydra.job.config_name)
        defaults = self.loader.compute_defaults_list(name, hydra + overrides, RunMode.RUN)
        keys = [str(o.key_or_group) for o in defaults.config_overrides]
        nested = any(a != b and b.startswith(f"{a}.") for a in keys for b in keys)
        return set() if nested or len(keys) != len(set(keys)) else set(keys)

    @staticmethod
    def _copied(
        parsed: list[Any], earlier: list[Any], config: DictConfig, values: set[str]
    ) -> DictConfig | None:
        changed = [
            (o, e) for o, e in zip(parsed, earlier, strict=True) if o.input_line != e.input_line
        ]
        plain = all(
            o.key_or_group in values and o.package is None and o.is_sweep_override() is False
            and _scalar(o.value()) and _scalar(e.value())
            for o, e in changed
        )  # fmt: skip
        if not plain:
            return None
        job_config = copy.deepcopy(config)
        try:
            for override, _ in changed:
                OmegaConf.update(job_config, override.key_or_group, override.value(), merge=True)
        except Exception:
            return None  # composed in full: Hydra's message
        task = [str(o.input_line) for o in parsed if not o.is_hydra_override()]
        with read_write(job_config.hydra), open_dict(job_config.hydra):
            job_config.hydra.overrides.task = task
        return job_config


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _job_error(
    composer: _Composer, num: int, overrides: list[str], check: JobCheck | None
) -> str | None:
    """Job ``num``'s config composed as the launcher composes it, then checked: ``None`` when
    it passes, else the reason on one line."""
    from hydra.core.hydra_config import HydraConfig

    try:
        job_config = composer.compose(overrides)  # this job's own: changed in place
        with open_dict(job_config):
            job_config.hydra.job.id = num
            job_config.hydra.job.num = num
        output_dir = os.path.join(
            str(OmegaConf.select(job_config, "hydra.sweep.dir")),
            str(OmegaConf.select(job_config, "hydra.sweep.subdir")),
        )
        with read_write(job_config.hydra.runtime), open_dict(job_config.hydra.runtime):
            job_config.hydra.runtime.output_dir = os.path.abspath(output_dir)
        HydraConfig.instance().set_config(job_config)  # ${hydra:...} resolves as in the job
        if check is not None:
            with read_write(job_config), open_dict(job_config):
                del job_config["hydra"]  # what the task gets (HydraConfig keeps its own copy)
            check(job_config)
    except Exception as error:
        return _one_line(error)
    return None


def _one_line(error: BaseException) -> str:
    from kiln.experiments.jobs.lifecycle import one_line_reason

    return one_line_reason(error).removeprefix("ValueError: ")


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _varying_keys(jobs: Sequence[Sequence[str]]) -> set[str]:
    """The keys whose override differs between jobs (what tells one job from another)."""
    if len(jobs) < 2:
        return set()
    common = set(jobs[0]).intersection(*map(set, jobs[1:]))
    return {_key(o) for job in jobs for o in job if o not in common}
