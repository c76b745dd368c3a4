"""The one place that talks to Weights & Biases (and the CSV/no-logger alternatives).

One Hydra job is one W&B run. The job process opens the run, hands Fabric logger(s) to
``kiln.core.fit`` (they pickle, so worker processes started by ``kiln.core.launch`` attach
to the same run), writes the final summary and finishes the run whatever happens::

    with Tracker(cfg.logger, job, config=resolved, tags=tags) as tracker:
        result = fit(module, ..., loggers=tracker.loggers)
        tracker.summarize({"val/accuracy": 0.9, ...})
    # an exception inside the block finishes the run as failed, with the reason

The run lives in ``<job output dir>/wandb/`` and is offline unless ``logger.mode=online``.
Its id lives in ``<job output dir>/wandb_run_id``: a job re-run into its directory (a resume
after a crash, a preemption, a re-run sweep) resumes that run, and drops the rows of steps
the run's files there already hold, so its history has one row per step.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.experiments.settings import job_files
from kiln.experiments.settings.base import LoggerConfig
from kiln.experiments.settings.dotted import flatten
from kiln.experiments.settings.job_info import JobInfo

if TYPE_CHECKING:  # Fabric is imported when a run opens, not when a config error is recorded
    from lightning.fabric.loggers.logger import Logger

STEP_METRIC = "trainer/global_step"
"""The x-axis of every W&B chart: wandb's Fabric logger adds it to each logged row."""

RUN_ID_FILE = "wandb_run_id"
"""The job directory's W&B run id: one run per job, across restarts."""
FINISHED_FILE = "wandb_finished"
"""Written (with the run id) once the job directory's W&B run has its exit record; removed
while an attempt holds the run open. A finished job re-run finds a run killed between its
``summary.json`` and its end without reading the run's files."""
RUN_IN_USE_WAIT_S = 60.0
"""How long a resumed job waits for the attempt before it to let go of their W&B run."""


def import_early(cfg: LoggerConfig) -> None:
    """Import the W&B modules a ``cfg`` run opens with, now: call it once the config is
    valid and before the job imports its model and Fabric.

    W&B's pydantic models read their fields' docstrings from source (pydantic's
    ``use_attribute_docstrings``), and on Python < 3.13 each model class looks its module up
    by scanning every loaded module, so the imports cost less the fewer modules are loaded
    (measured in docs/benchmarks.md, "Other projects' private API"). Nothing for the CSV logger, no
    logger or W&B's ``disabled`` mode; a W&B release without one of
    ``WANDB_INIT_IMPORTS`` only loses the head start (``wandb.init`` imports what it needs).
    """
    if cfg.backend != "wandb" or cfg.mode == "disabled":
        return
    from kiln.experiments.upstream_internals import WANDB_INIT_IMPORTS

    for name in WANDB_INIT_IMPORTS:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


class Tracker:
    """A job's experiment tracking: the W&B run (or CSV logger) and its Fabric loggers.

    Args:
        cfg: The ``logger`` config.
        job: The job's identity (output dir, overrides, sweep).
        config: The resolved config, stored as the W&B run's config (with the job's Hydra
            choices and overrides under ``hydra``: :attr:`run_config`).
        tags: Tags for this run (e.g. ``["model:minilm-cls", "precision:32-true"]``).
        name: Run name; defaults to ``job.run_name`` (made from the overrides).
        resume: Keep the run's id in the job directory and continue that run when the job
            is re-run there (``kiln-train``); otherwise each start is a new run.
        run_id: An existing W&B run to log to (resumed, e.g. by ``kiln-eval``); ``None``: the
            job directory's run (with ``resume``) or a new one.
    """

    def __init__(
        self,
        cfg: LoggerConfig,
        job: JobInfo,
        *,
        config: dict[str, Any] | None = None,
        tags: list[str] | None = None,
        name: str | None = None,
        resume: bool = False,
        run_id: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.resume = resume
        self.run_id = run_id
        self.job = job
        self.config = config or {}
        self.tags = list(dict.fromkeys([*(tags or []), *cfg.tags]))  # de-duplicated, in order
        self.name = name or job.run_name
        self.run: Any = None
        self.loggers: list[Logger] = []
        self.finished = False
        self.logged_through: dict[str, int] = {}
        """The last step of each kind of row (``train``, ``validation``, ``test``:
        ``wandb_files.row_kind``) an earlier attempt's W&B files hold (a resumed job's
        run): each kind is logged apart, so a killed attempt may have sent a step's
        training row and not its validation row."""
        self.logged_rows: set[tuple[str, int]] = set()
        """``(kind, step)`` of every row the run holds: in an earlier attempt's W&B files,
        or logged by :meth:`log_missing`."""

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Tracker:
        """Open the run and build the Fabric loggers (``self.loggers``)."""
        if self.cfg.backend == "wandb":
            self._start_wandb()
        elif self.cfg.backend == "csv":
            from lightning.fabric.loggers.csv_logs import CSVLogger

            self.loggers = [CSVLogger(root_dir=self.job.output_dir, name="csv", version="")]
        return self

    def _start_wandb(self) -> None:
        import wandb

        from kiln.experiments.tracking.wandb_files import logged_rows, run_files

        id_file = Path(self.job.output_dir) / RUN_ID_FILE
        run_id = self.run_id
        if run_id is None and self.resume and id_file.is_file():
            run_id = id_file.read_text().strip()
        if run_id:  # this job ran before: continue its run after the steps it holds
            files = run_files(self.job.output_dir, run_id)
            self.logged_rows = logged_rows(files, STEP_METRIC)
            for kind, step in self.logged_rows:
                self.logged_through[kind] = max(self.logged_through.get(kind, step), step)
        else:
            run_id = secrets.token_hex(4)  # W&B ids: lowercase letters and digits
        if self.resume:
            id_file.parent.mkdir(parents=True, exist_ok=True)
            job_files.write(id_file, run_id + "\n")
            (id_file.parent / FINISHED_FILE).unlink(missing_ok=True)  # open again
        self.run = _init_when_free(
            wandb,
            id=run_id,
            resume="allow",
            project=self.cfg.project,
            entity=self.cfg.entity,
            group=self.cfg.group or self.job.group,
            job_type=self.cfg.job_type,
            name=self.name,
            tags=self.tags,
            notes=self.cfg.notes,
            config=self.run_config,
            dir=self.job.output_dir,
            mode=self.cfg.mode,
            reinit="create_new",  # sweeps run several jobs in one process, one run each
            settings=wandb.Settings(console=self.cfg.console, silent=True),
        )
        self.run.define_metric(STEP_METRIC)
        self.run.define_metric("*", step_metric=STEP_METRIC, step_sync=True)
        # The logger pickles down to the run's attach id: a worker process re-attaches.
        from kiln.experiments.tracking.wandb_logger import KilnWandbLogger

        self.loggers = [KilnWandbLogger(experiment=self.run, skip_through=self.logged_through)]

    @property
    def run_config(self) -> dict[str, Any]:
        """The W&B config: the given config, plus the job's Hydra choices and overrides
        (``hydra.choices.compile``, ``hydra.overrides``) where it has any: what a chart groups
        or filters runs by."""
        if not (self.job.choices or self.job.overrides) or "hydra" in self.config:
            return self.config
        hydra = {"choices": dict(self.job.choices), "overrides": list(self.job.overrides)}
        return {**self.config, "hydra": hydra}

    def update_config(self, values: dict[str, Any]) -> None:
        """Add or replace ``values`` in the run's config (e.g. the machine's load and
        calibration at the end of the job)."""
        if self.run is not None:
            self.run.config.update(values, allow_val_change=True)

    def summarize(self, values: dict[str, Any]) -> None:
        """Write ``values`` (final metrics, telemetry, status) into the run's summary."""
        if self.run is not None:
            self.run.summary.update(flatten(values, sep="/"))

    def log_missing(self, rows: list[dict[str, Any]]) -> int:
        """Log the rows of ``rows`` (a job's history: ``{"step": N, <metric>: value}``) the
        run does not hold yet (:attr:`logged_rows`, by kind and step), in step order (a
        step's training row before its validation row, as the loop logs them); returns how
        many. What an attempt's W&B process never wrote (it was killed, or lost its service)
        is logged once, and nothing twice."""
        if self.run is None:
            return 0
        from kiln.experiments.tracking.wandb_files import record_row_key

        count = 0
        for row in sorted(rows, key=lambda r: r["step"]):
            key = record_row_key(row)
            if key in self.logged_rows:
                continue
            metrics = {k: v for k, v in row.items() if k != "step"}
            self.run.log({**metrics, STEP_METRIC: key[1]})
            self.logged_rows.add(key)
            count += 1
        return count

    def log_folder(self, path: str | Path, name: str, kind: str) -> None:
        """Log the folder ``path`` to the W&B run as an artifact ``name`` of type ``kind``
        (a compile trace's tlparse report); nothing without a run or an existing folder."""
        if self.run is None or not Path(path).is_dir():
            return
        import wandb

        artifact = wandb.Artifact(name, type=kind)
        artifact.add_dir(str(path))
        self.run.log_artifact(artifact)

    def finish(self, status: str = "ok", error: str | None = None) -> None:
        """Finish the run once with ``status`` in its summary: ``ok`` exits 0; ``failed``
        (with ``error`` as reason) and ``stopped`` (a signal stopped it) exit 1.

        Raises:
            Exception: W&B's error when the run cannot end (its service is gone: SLURM
                signals every process of a job); this process's W&B connection is dropped
                first, so its exit adds no second traceback and a later run starts a new
                service. The run stays without its end: a re-run of the job ends it.
        """
        if self.finished:
            return
        self.finished = True
        if self.loggers:
            from lightning.fabric.loggers.csv_logs import CSVLogger

        for logger in self.loggers:
            if isinstance(logger, CSVLogger):  # W&B's logger is finished with its run
                logger.finalize(status)
        if self.run is not None:
            try:
                self.run.summary.update({"status": status, "error": error})
                self.run.finish(exit_code=0 if status == "ok" else 1)
            except Exception:
                self.abandon()
                raise
            if self.resume:
                job_files.write(Path(self.job.output_dir) / FINISHED_FILE, self.run.id + "\n")

    def abandon(self) -> None:
        """Give up a run that cannot end (W&B's service is gone: SLURM signals every process
        of a job): tear down this process's W&B connection, so its exit adds no second
        traceback and a later run starts a new service. A re-run of the job ends the run."""
        self.finished = True
        import wandb

        with contextlib.suppress(Exception):
            wandb.teardown()

    def __enter__(self) -> Tracker:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            self.finish("ok")
        else:
            self.finish("failed", error=f"{exc_type.__name__}: {exc}")

    # -- what the job records ----------------------------------------------------------------

    @property
    def info(self) -> dict[str, str | None] | None:
        """``{"run_id", "dir", "mode", "project", "group"}`` of the W&B run (the record's
        ``wandb`` entry, so a report finds the group without reading the run's files), or
        ``None`` without a run."""
        if self.run is None:
            return None
        return {
            "run_id": self.run.id,
            "dir": os.fspath(self.run.dir).removesuffix("/files"),
            "mode": self.cfg.mode,
            "project": self.cfg.project,
            "group": self.cfg.group or self.job.group,
        }


def _init_when_free(wandb: Any, **kwargs: Any) -> Any:
    """``wandb.init(**kwargs)``, waiting up to :data:`RUN_IN_USE_WAIT_S` while W&B's service
    says the run is in use: a killed attempt's stream outlives its process by a few seconds
    (until the service sees it gone), and a re-run started at once would fail."""
    deadline = time.monotonic() + RUN_IN_USE_WAIT_S
    while True:
        try:
            return wandb.init(**kwargs)
        except Exception as exc:
            if "is in use" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
