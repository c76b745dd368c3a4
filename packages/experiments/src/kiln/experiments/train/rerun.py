"""A ``kiln-train`` job re-run into its own directory: what it resumes from, whether the
config may change, whether it is already done, and the record of its attempts.

Every job checkpoints into ``<job dir>/checkpoints`` with ``trainer.resume=auto`` (see
docs/checkpoints.md). Before ``fit``, :func:`check_resume` reads the stored config of the
checkpoint the job resumes from (the newest, or the one ``trainer.resume=<path>`` names) and
refuses a change to what the run computes (:data:`FROZEN_KEYS`); ``max_steps``,
``max_epochs``, logging, validation cadence and the logger may change, and the number of
devices with the accumulation when the global batch stays the same; other intra-op threads
per rank than the checkpoint's (``trainer.threads_per_rank``) resume with a warning.
``<job dir>/attempts.json`` lists each attempt: when it started, from which step, how it
ended (an attempt that left no end was killed: SIGKILL, out of memory, node failure;
``refused``: it failed before training, and left the job's record as it was; ``skipped``:
a finished job had nothing left to train). A checkpoint past ``trainer.max_steps`` is
refused (:func:`check_steps_left`).
"""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

from kiln.core.config import check_global_batch
from kiln.experiments.settings.dotted import flatten, select
from kiln.experiments.settings.job_files import write_job_json
from kiln.experiments.settings.job_info import TRAIN

ATTEMPTS_FILE = "attempts.json"

FROZEN_KEYS = (
    "model",
    "data",
    "optimizer",
    "scheduler",
    "trainer.seed",
    "trainer.precision",
    "trainer.gradient_clip_norm",
)
"""What a resumed job may not change: the checkpoint's weights, data order and optimizer
state belong to these (a changed optimizer or scheduler is refused, never half-applied).
``trainer.devices``, ``trainer.num_nodes`` and ``trainer.accumulate_grad_batches`` may change
together when the global batch stays the same (:func:`global_batch_problem`)."""
RESUME_SWITCHES = ("data.allow_changed",)
"""Keys inside :data:`FROZEN_KEYS` that say what a resume may do, not what the run computes
(:mod:`kiln.experiments.train.data_identity`)."""


def _world(cfg: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(processes, micro-batch size, accumulation) of a config: its global batch's factors."""
    devices, nodes = select(cfg, "trainer.devices") or 1, select(cfg, "trainer.num_nodes") or 1
    return (
        devices * nodes,
        select(cfg, "data.batch_size"),
        select(cfg, "trainer.accumulate_grad_batches"),
    )


WORLD_KEYS = ("trainer.devices", "trainer.num_nodes", "trainer.accumulate_grad_batches")


def global_batch_problem(path: Path, saved: dict[str, Any], resolved: dict[str, Any]) -> str | None:
    """Why the job cannot resume on its world size (processes x micro-batch x accumulation
    is not the checkpoint's global batch), naming both and the accumulation that keeps it;
    ``None`` when it can (kiln.core then resumes on the new world)."""
    before, now = _world(saved), _world(resolved)
    if before == now or not all(isinstance(v, int) for v in (*before, *now)):
        return None
    where = f"{path} was written by a run on {before[0]} processes, this job has {now[0]}"
    try:
        check_global_batch(where, before, now)
    except ValueError as error:
        return str(error)
    return None


class ResumeConfigError(ValueError):
    """A job re-run into its directory changed what its checkpoint was trained with."""


def _product(cfg: dict[str, Any]) -> Any:
    factors = _world(cfg)
    return None if None in factors else factors[0] * factors[1] * factors[2]


def config_changes(saved: dict[str, Any], resolved: dict[str, Any]) -> list[str]:
    """``"key: saved -> now"`` for every :data:`FROZEN_KEYS` value that differs, and every
    :data:`WORLD_KEYS` one when the global batch changes."""
    changes = []
    world = _world(saved) != _world(resolved) and _product(saved) != _product(resolved)
    for key in FROZEN_KEYS + (WORLD_KEYS if world else ()):
        old, new = flatten({key: select(saved, key)}), flatten({key: select(resolved, key)})
        for name in sorted(old.keys() | new.keys()):
            if old.get(name) != new.get(name) and name not in RESUME_SWITCHES:
                changes.append(f"{name}: {old.get(name)!r} -> {new.get(name)!r}")
    return changes


def latest_checkpoint_meta(checkpoint_dir: str | None) -> tuple[Path, dict[str, Any]] | None:
    """The newest intact checkpoint in ``checkpoint_dir`` and its metadata, or ``None``: the
    one ``fit`` resumes from (a damaged one, e.g. a flipped byte or a truncated shard, is
    skipped as ``fit`` skips it, so the attempt records the step it really starts from)."""
    from kiln.core import read_checkpoint_meta
    from kiln.core.checkpoints.lookup import checkpoint_candidates, damage

    if checkpoint_dir is None or not Path(checkpoint_dir).is_dir():
        return None
    for path in checkpoint_candidates(checkpoint_dir):
        if damage(path) is not None:
            continue
        try:
            return path, read_checkpoint_meta(path)
        except Exception:
            continue
    return None


def missing_note(checkpoint_dir: str | None, found: Path | None) -> str | None:
    """What a job resuming from ``checkpoint_dir`` should be told when checkpoints its
    ``run.json`` lists are gone (deleted by hand): which, and the newest intact one
    (``found``) it resumes from instead; ``None`` when none is gone."""
    from kiln.core.checkpoints.lookup import missing_checkpoints

    if checkpoint_dir is None or not Path(checkpoint_dir).is_dir():
        return None
    try:
        gone = missing_checkpoints(checkpoint_dir)
    except Exception:  # a run.json that cannot be read: the claim names it
        return None
    if not gone:
        return None
    if found is None:
        newest = "no intact checkpoint is left: the job starts from step 0"
    else:
        newest = f"the newest intact checkpoint is step {_step_of(found)} ({found})"
    return f"{', '.join(str(p) for p in gone)} is missing: {newest}"


def _step_of(path: Path) -> int:
    return int(path.name.removeprefix("step-").removesuffix(".ckpt"))


def _say_if_missing(checkpoint_dir: str | None, found: Path | None) -> None:
    note = missing_note(checkpoint_dir, found)
    if note is not None:
        print(f"kiln-train: {note}", flush=True)


def explicit_checkpoint_meta(resume: str) -> dict[str, Any]:
    """The metadata of the checkpoint ``trainer.resume=<path>`` names, once it is known to be
    an intact kiln checkpoint.

    Raises:
        ValueError: ``resume`` is empty.
        FileNotFoundError: There is no such file.
        IsADirectoryError: It is a directory (a job dir, a checkpoint dir): the message names
            its newest checkpoint.
        DamagedCheckpointError: It is damaged (checksum, CRC-32, truncated) or not kiln's.
    """
    from kiln.core import DamagedCheckpointError, read_checkpoint_meta
    from kiln.core.checkpoints.lookup import check_not_a_plain_directory, damage

    if not resume.strip():  # `trainer.resume=` on the command line: Path("") is the cwd
        raise ValueError(
            "trainer.resume is empty: give auto (the job's newest intact checkpoint), null "
            "(start fresh) or a checkpoint file (<job dir>/checkpoints/step-<N>.ckpt)"
        )
    path = Path(resume)
    if not path.exists():
        raise FileNotFoundError(f"trainer.resume={resume!r}: no such checkpoint file")
    try:  # a job dir or its checkpoints/: name the newest checkpoint to pass instead
        check_not_a_plain_directory(path)
    except IsADirectoryError as error:
        raise IsADirectoryError(f"trainer.resume={resume!r}: {error}") from None
    problem = damage(path)
    if problem is not None:
        raise DamagedCheckpointError(f"trainer.resume={resume!r}: checkpoint is damaged: {problem}")
    meta = read_checkpoint_meta(path)
    if meta.get("global_step") is None:
        raise DamagedCheckpointError(
            f"trainer.resume={resume!r} is not a kiln checkpoint (it holds no global_step): "
            "give a step-<N>.ckpt that kiln-train wrote"
        )
    return meta


def check_resume(resolved: dict[str, Any]) -> tuple[int, Path | None]:
    """The step this job resumes from and its checkpoint (``0, None`` for a fresh start),
    after checking the checkpoint and the config: the same check for ``resume=auto`` and an
    explicit ``trainer.resume=<path>``.

    Raises:
        ResumeConfigError: The checkpoint was written with other values of
            :data:`FROZEN_KEYS` (the message names each key with both values), or is a
            one-file (``torch.save``) checkpoint resumed under FSDP.
        FileNotFoundError: An explicit checkpoint does not exist.
        DamagedCheckpointError: An explicit checkpoint is damaged or not kiln's.
    """
    trainer = resolved["trainer"]
    resume = trainer.get("resume")
    if resume is None:
        return 0, None
    if resume == "auto":
        found = latest_checkpoint_meta(trainer.get("checkpoint_dir"))
        _say_if_missing(trainer.get("checkpoint_dir"), found[0] if found else None)
        if found is None:
            return 0, None
        path, meta = found
    else:
        path, meta = Path(resume), explicit_checkpoint_meta(resume)
    _check_layout(path, resolved)
    saved = meta.get("config") or {}
    changes = config_changes(saved, resolved)
    if changes:
        problem = global_batch_problem(path, saved, resolved)
        # the world-size fix first (it is the one value to set), as kiln.core's fit says it
        raise ResumeConfigError(
            (f"{problem}. " if problem else "")
            + f"this job resumes from {path}, which was trained with other values of keys a "
            f"resumed run cannot change: {'; '.join(changes)}. Re-run with the checkpoint's "
            "values, or train into a new directory (another hydra.run.dir / hydra.sweep.dir); "
            "max_steps, max_epochs, logging, validation cadence and the logger may change, "
            "and trainer.devices with trainer.accumulate_grad_batches when the global batch "
            "stays the same"
        )
    if meta.get("world_size") in (None, _world(resolved)[0]):  # else the world size says it
        _say_if_threads_differ(path, meta.get("threads_per_rank"), resolved)
    return int(meta.get("global_step") or 0), path


def threads_change(path: Path, saved: int | None, resolved: dict[str, Any]) -> str | None:
    """Why a resume will not be bit-identical to a run that never stopped: the checkpoint's
    ranks computed with ``saved`` intra-op threads and this job's get another count
    (``trainer.threads_per_rank``, or its default on this node and world size); ``None``
    when the counts agree or the checkpoint predates the record."""
    from kiln.core import TrainerConfig
    from kiln.core.distributed.threads import threads_per_rank

    devices, nodes = (select(resolved, f"trainer.{k}") or 1 for k in ("devices", "num_nodes"))
    chosen = select(resolved, "trainer.threads_per_rank")
    now = threads_per_rank(TrainerConfig(devices=devices, num_nodes=nodes, threads_per_rank=chosen))
    if saved is None or saved == now:
        return None
    return (
        f"{path} was trained with {saved} intra-op thread(s) per rank, this job computes with "
        f"{now} (trainer.threads_per_rank={chosen!r}): it resumes, but float sums now add in "
        f"another order, so it will not end bit-identical to a run that never stopped; set "
        f"trainer.threads_per_rank={saved} to keep the checkpoint's"
    )


def _say_if_threads_differ(path: Path, saved: int | None, resolved: dict[str, Any]) -> None:
    # a warning, not a refusal: a requeue onto a node with other cores must go on (a resume
    # on another world size, which changes the default count, rounds otherwise anyway)
    change = threads_change(path, saved, resolved)
    if change is not None:
        warnings.warn(change, stacklevel=3)


def check_resume_without_dir(resume: Any) -> None:
    """Refuse an explicit ``trainer.resume=<path>`` with ``trainer.checkpoint_dir=null``
    (which turns checkpoints off, and with them the resume): it would train from step 0.

    Raises:
        ValueError: Names both keys and the two ways out.
    """
    if resume is None or resume == "auto":
        return
    raise ValueError(
        f"trainer.resume={resume!r} with trainer.checkpoint_dir=null: a job without a "
        "checkpoint directory resumes nothing and would train from step 0. Set "
        "trainer.checkpoint_dir (e.g. the default, <job dir>/checkpoints) to resume from "
        "that checkpoint, or drop trainer.resume to start fresh without checkpoints"
    )


def check_steps_left(from_step: int, checkpoint: Path | None, max_steps: int | None) -> None:
    """Refuse a job whose checkpoint is already past ``trainer.max_steps`` (a finished job
    re-run with fewer steps): it cannot train back, and its record must stay as it is.

    Raises:
        ValueError: Names the checkpoint's step, ``max_steps`` and what to do instead.
    """
    if checkpoint is None or max_steps is None or from_step <= max_steps:
        return
    raise ValueError(
        f"trainer.max_steps={max_steps} is below the step this job resumes from: {checkpoint} "
        f"holds step {from_step}. A run cannot train back: give trainer.max_steps >= "
        f"{from_step} to continue it, or train into a new directory (another hydra.run.dir) "
        "to run fewer steps"
    )


def _check_layout(path: Path, resolved: dict[str, Any]) -> None:
    """A one-file (``torch.save``) checkpoint into an FSDP run fails here (as ``fit`` would
    once the workers started), saying which strategy resumes it. Every other checkpoint
    resumes under any strategy.

    Raises:
        ResumeConfigError: A one-file checkpoint and ``trainer.strategy=fsdp``.
    """
    from kiln.core.checkpoints.lookup import is_legacy

    if is_legacy(path) and select(resolved, "trainer.strategy") == "fsdp":
        raise ResumeConfigError(
            f"checkpoint {path} is one file, written by an earlier kiln release under DDP or "
            "on one process: resume it with trainer.strategy=ddp (or auto); its next "
            "checkpoint resumes under any strategy, trainer.strategy=fsdp included"
        )


def check_claim(resolved: dict[str, Any], checkpoint: Path | None) -> None:
    """Refuse now, before any W&B run opens, what ``fit``'s claim of the checkpoint directory
    would refuse (another run's checkpoints, a lost ``run.json`` nothing rebuilds).

    Raises:
        CheckpointDirError: The directory cannot hold this run; the message says why.
    """
    from kiln.core import read_checkpoint_meta
    from kiln.core.checkpoints.rundir import plan_claim

    trainer = resolved["trainer"]
    if trainer.get("checkpoint_dir") is None:
        return
    meta = read_checkpoint_meta(checkpoint) if checkpoint is not None else {}
    plan_claim(
        trainer["checkpoint_dir"],
        trainer.get("resume"),
        meta.get("run_id"),
        checkpoint,
        meta.get("global_step"),
    )


def backfill(tracker: Any, checkpoint: Path) -> int:
    """Log the training and validation rows of ``checkpoint``'s histories that the job's W&B
    run lacks (an attempt killed by SIGKILL may have logged rows its W&B process never
    wrote), each by its kind and step (``tracker.log_missing``: a kill between a step's
    training row and its validation row loses only the latter); returns how many. The run
    then continues after the checkpoint's step."""
    from kiln.core import read_checkpoint_meta

    saved = read_checkpoint_meta(checkpoint)  # its histories with its plain values
    rows = [*saved.get("history", []), *saved.get("validation_history", [])]
    return tracker.log_missing(rows)


def history_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The training and validation rows of a job's record (``summary.json``): what its W&B
    run must hold, each once."""
    return [*(record.get("history") or []), *(record.get("validation_history") or [])]


def finished_record(job_dir: str, resolved: dict[str, Any]) -> dict[str, Any] | None:
    """The job's ``summary.json`` when it already ended ``ok`` with this very config."""
    path = Path(job_dir) / TRAIN.file
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if record.get("status") == "ok" and record.get("config") == resolved:
        return record
    return None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _where() -> dict[str, Any]:
    """Where this attempt runs: the writing rank's host and, under SLURM, the job id and every
    node of the job (a node failure names the nodes the attempt had)."""
    import socket

    from kiln.core.telemetry.machine import expand_hostlist

    where: dict[str, Any] = {"host": socket.gethostname()}
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if nodelist:
        where["slurm_job_id"] = os.environ.get("SLURM_JOB_ID")
        where["nodes"] = expand_hostlist(nodelist)
    return where


def begin_attempt(job_dir: str) -> list[dict[str, Any]]:
    """Add this attempt to ``attempts.json`` (marking an earlier one that left no end as
    ``killed``) and return the list; its ``from_step`` is set once the resume is checked.
    Each attempt names its ``host`` and, under SLURM, its ``slurm_job_id`` and ``nodes``."""
    path = Path(job_dir) / ATTEMPTS_FILE
    try:
        attempts = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        attempts = []
    for attempt in attempts:
        if attempt.get("ended") is None:
            attempt["ended"] = "killed"
    attempts.append(
        {"started_at": _now(), "from_step": None, "pid": os.getpid(), **_where(), "ended": None}
    )
    write_job_json(path, attempts)
    return attempts


def set_from_step(job_dir: str, attempts: list[dict[str, Any]], step: int) -> None:
    """Record the step this (the last) attempt resumes from."""
    attempts[-1]["from_step"] = step
    write_job_json(Path(job_dir) / ATTEMPTS_FILE, attempts)


def end_attempt(
    job_dir: str, attempts: list[dict[str, Any]], ended: str, step: int, **details: Any
) -> None:
    """Record how this (the last) attempt ended: ``ok``, ``failed``, ``refused``, ``skipped``,
    ``SIGTERM``, ``SIGINT``, ``requeued`` (``details``: e.g. the error of a refused attempt)."""
    attempts[-1].update(ended=ended, ended_at=_now(), at_step=step, **details)
    write_job_json(Path(job_dir) / ATTEMPTS_FILE, attempts)
