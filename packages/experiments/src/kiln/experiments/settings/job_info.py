"""What a Hydra job knows about itself, and the JSON file every job leaves behind.

Shared by ``kiln-train`` (``summary.json``) and ``kiln-bench`` (``bench.json``): both read
their identity from :class:`JobInfo`, describe the machine with :func:`machine_info`, name
their record with a :class:`RecordKind` and write it with :func:`write_job_json`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kiln.core.telemetry.records import Calibration, CopyPeak, LoadSample, Machine, MatmulPeak

PLACEMENT_KEYS = ("hydra", "launcher", "sweep", "logger", "paths")
"""Override keys that choose where or how a job runs, not what it computes: kept out of run
names (W&B and report) and of what identifies a run when a report pairs runs."""


@dataclass(frozen=True)
class RecordKind:
    """One kind of job record: the file a job leaves and how it says it failed."""

    name: str
    """``record["kind"]``: ``train`` or ``bench``."""
    file: str
    """The record's file in the job directory."""
    failed_status: str
    """``record["status"]`` of a job that raised."""
    reason_key: str
    """The record's key for the one-line reason of a failure."""


TRAIN = RecordKind("train", "summary.json", failed_status="failed", reason_key="error")
BENCH = RecordKind("bench", "bench.json", failed_status="error", reason_key="reason")
RECORD_KINDS = (TRAIN, BENCH)
FAILED_STATUSES = tuple(kind.failed_status for kind in RECORD_KINDS)
STOPPED = "stopped"
"""``record["status"]`` of a train job SIGTERM or Ctrl-C stopped at a step boundary with a
checkpoint: not failed, not finished (a re-run into its directory resumes it)."""


def override_key(override: str) -> str:
    """``"+trainer.devices=2"`` -> ``"trainer.devices"``."""
    return override.lstrip("+~").split("=", 1)[0]


def key_in(key: str, names: tuple[str, ...]) -> bool:
    """Whether config ``key`` is one of ``names`` or below one (``a.b``, ``a/b``)."""
    return any(key == n or key.startswith(n + ".") or key.startswith(n + "/") for n in names)


def identity_overrides(overrides: list[str], ignore: tuple[str, ...] = ()) -> list[str]:
    """``overrides`` without :data:`PLACEMENT_KEYS` (and ``ignore``): what the job computes."""
    return [o for o in overrides if not key_in(override_key(o), PLACEMENT_KEYS + ignore)]


@dataclass
class JobInfo:
    """Identity of one Hydra job (one run).

    Built from ``HydraConfig`` inside a job with :meth:`from_hydra`; a plain dataclass so it
    travels to worker processes.
    """

    output_dir: str
    """The job's own directory; everything the job writes goes below it."""
    overrides: list[str] = field(default_factory=list)
    """The job's task overrides (``hydra.overrides.task``), e.g. ``["precision=bf16-mixed"]``."""
    job_name: str = "train"
    """Hydra's job name (the entrypoint's name unless ``hydra.job.name`` is set)."""
    job_num: int = 0
    """Index of the job in its sweep (0 for a single run)."""
    sweep_dir: str | None = None
    """The multirun directory holding all job directories; ``None`` for a single run."""
    sweep_name: str | None = None
    """The chosen ``sweep=`` config, if any."""
    choices: dict[str, str] = field(default_factory=dict)
    """Which option each config group took (``hydra.runtime.choices``)."""
    hydra_files: dict[str, str] = field(default_factory=dict)
    """Hydra's ``.hydra/*.yaml`` of this run, written once it owns the job directory
    (written by :mod:`kiln.experiments.settings.job_files`)."""

    @classmethod
    def from_hydra(cls, task_cfg: Any = None) -> JobInfo:
        """Read the running job's identity from ``HydraConfig`` (call inside a Hydra job;
        ``task_cfg``: the job's config as Hydra gave it, for its ``.hydra`` files)."""
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        multirun = hc.mode == RunMode.MULTIRUN
        choices = {str(k): str(v) for k, v in hc.runtime.choices.items() if v is not None}
        return cls(
            output_dir=str(hc.runtime.output_dir),
            overrides=[str(o) for o in hc.overrides.task],
            job_name=str(hc.job.name),
            job_num=int(hc.job.num) if multirun and hc.job.get("num") is not None else 0,
            sweep_dir=str(Path(hc.sweep.dir).resolve()) if multirun else None,
            sweep_name=choices.get("sweep"),
            choices={k: v for k, v in choices.items() if not k.startswith("hydra/")},
            hydra_files=_hydra_files(task_cfg) if task_cfg is not None else {},
        )

    @property
    def run_name(self) -> str:
        """A readable name made from the overrides that change what is trained.

        ``precision=bf16-mixed compile=default`` -> ``"precision=bf16-mixed,compile=default"``;
        a job without such overrides is named after the experiment (or ``"default"``).
        """
        parts = identity_overrides(self.overrides)
        if parts:
            return ",".join(parts)
        return self.choices.get("experiment", "default")

    @property
    def group(self) -> str | None:
        """The sweep this job belongs to: ``<sweep name or job name>/<sweep dir name>``."""
        if self.sweep_dir is None:
            return None
        return f"{self.sweep_name or self.job_name}/{Path(self.sweep_dir).name}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def record(self, kind: RecordKind) -> dict[str, Any]:
        """The skeleton of this job's record: who it is, failed until the work says otherwise."""
        return {
            "kind": kind.name,
            "status": kind.failed_status,
            kind.reason_key: None,
            "overrides": self.overrides,
            "job_name": self.job_name,
            "job_num": self.job_num,
            "run_name": self.run_name,
            "output_dir": self.output_dir,
            "sweep_dir": self.sweep_dir,
        }


class JobMachine(Machine, total=False):
    """A job record's ``machine``: :class:`~kiln.core.telemetry.records.Machine`, the device
    as torch sees it, and the calibrations and load around training
    (:meth:`kiln.experiments.jobs.lifecycle.Lifecycle.measured`)."""

    device: str
    """The first GPU's name, or ``cpu``."""
    device_count: int
    matmul_peak: MatmulPeak
    """This machine's own matmul peak at the run's precision (``measured_peak``)."""
    copy_peak: CopyPeak
    """This machine's own memory bandwidth (``measured_bandwidth``)."""
    calibration_before: Calibration
    load_start: LoadSample
    calibration_after: Calibration
    load_end: LoadSample


def machine_info() -> JobMachine:
    """The machine a job runs on: :func:`kiln.core.telemetry.machine.describe_machine` (host,
    CPU, GPUs, versions, SLURM job) plus ``device`` (the first GPU's name, or ``cpu``) and
    ``device_count`` as torch sees them (``CUDA_VISIBLE_DEVICES`` applied). The job adds its
    load and calibration (:meth:`kiln.experiments.jobs.lifecycle.Lifecycle.measured`)."""
    import torch

    from kiln.core.telemetry.machine import describe_machine

    cuda = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "device_count": torch.cuda.device_count() if cuda else 0,
        **describe_machine(),
    }


def _hydra_files(task_cfg: Any) -> dict[str, str]:
    """What Hydra writes into a job's ``.hydra`` (the job's config, Hydra's, the overrides),
    as it would write them, read inside the running Hydra job."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    hydra = OmegaConf.to_container(HydraConfig.get(), resolve=False)
    hydra["output_subdir"] = ".hydra"  # type: ignore[index]  # where the files are
    hydra_cfg = OmegaConf.create({"hydra": hydra})
    return {
        "config.yaml": OmegaConf.to_yaml(task_cfg),
        "hydra.yaml": OmegaConf.to_yaml(hydra_cfg),
        "overrides.yaml": OmegaConf.to_yaml(hydra_cfg.hydra.overrides.task),
    }
