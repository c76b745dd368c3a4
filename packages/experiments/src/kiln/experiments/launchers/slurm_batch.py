"""The batch shell's part in a SLURM job's preemption (``launcher=slurm``).

A site may signal the batch shell alone (``#SBATCH --signal=B:USR2@90``, ``scancel --batch``)
or every process of the job (``scancel --full``). A bash script dies of an untrapped USR2
(the job then ends ``FAILED``), and runs a trap only once its foreground command ended, so
kiln's launcher puts :func:`batch_setup`'s lines first in every batch script: they trap USR2
and TERM, run the job step (submitit's ``srun`` line) in the background while the shell
waits, and pass a signal to the step's tasks (``scancel --signal``: the steps, not this
shell). A USR2 is also written to the job's signal file (:data:`SIGNAL_FILE_ENV`), which
every task reads once its handler is in place (:func:`kiln.experiments.launchers.slurm.start_job`):
a USR2 that came before the step existed, or while a task's interpreter started, is kept
for it. Each task starts with USR2 and TERM ignored (:func:`task_command`) until then, so
such a signal never kills it.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

SIGNAL_FILE_ENV = "KILN_SLURM_SIGNAL_FILE"
"""The environment variable naming this attempt's signal file (one signal name a line)."""

# ${kiln_id}: submitit's name for the job's folder (%j: <job id>, or <array id>_<index>)
_SHELL = r"""
# kiln (kiln.experiments.launchers.slurm_batch): a USR2 or TERM to this shell goes to the job step
kiln_id=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}
kiln_id=${kiln_id:-$SLURM_JOB_ID}
export KILN_SLURM_SIGNAL_FILE=@FOLDER@/${kiln_id}_kiln_signal
rm -f "$KILN_SLURM_SIGNAL_FILE"  # a requeued attempt starts with none
kiln_step=
kiln_passing=()
kiln_signal() {
    if [[ -n $kiln_step ]]; then
        echo "kiln: the batch shell got SIG$1: passed to the job step" >&2
    else
        echo "kiln: the batch shell got SIG$1 before the job step: kept for it" >&2
    fi
    [[ $1 != @SIGNAL@ ]] || echo "$1" >>"$KILN_SLURM_SIGNAL_FILE"
    if [[ -n $kiln_step ]]; then  # in the background: scancel waits while the job ends
        scancel --signal="$1" "$SLURM_JOB_ID" 2>/dev/null &
        kiln_passing+=($!)
    fi
}
trap 'kiln_signal @SIGNAL@' @SIGNAL@
trap 'kiln_signal TERM' TERM
srun() {  # in the background: the traps run while the step runs
    command srun "$@" &
    kiln_step=$!
    local rc
    while true; do
        wait "$kiln_step"
        rc=$?
        kill -0 "$kiln_step" 2>/dev/null || break  # else a trap interrupted the wait
    done
    # a scancel still waiting (the job is being requeued) would hold it until KillWait
    kill "${kiln_passing[@]}" 2>/dev/null
    kiln_step=
    kiln_passing=()
    return "$rc"
}
"""


_IGNORING = 'trap "" USR2 TERM && exec "$0" "$@"'


def signal_folder(submitit_folder: str) -> str:
    """The job's own submitit folder as the batch shell names it (``%j`` -> ``$kiln_id``)."""
    head, sep, tail = submitit_folder.partition("%j")
    return shlex.quote(head) + ('"$kiln_id"' + shlex.quote(tail) if sep else "")


def batch_setup(submitit_folder: str, preempt_signal: str = "USR2") -> list[str]:
    """The lines kiln puts first in every batch script (before the user's ``setup``).

    Args:
        submitit_folder: submitit's folder of the job (``hydra.launcher.submitit_folder``,
            with ``%j``); the signal file goes there.
        preempt_signal: The signal that requeues the job (submitit's, without ``SIG``).
    """
    text = _SHELL.replace("@FOLDER@", signal_folder(submitit_folder))
    return text.replace("@SIGNAL@", preempt_signal).strip().splitlines()


def task_command(python: str = sys.executable) -> str:
    """What ``srun`` starts in place of ``python``: the interpreter, with USR2 and TERM
    ignored until :func:`kiln.experiments.launchers.slurm.start_job` handles them (an ignored signal
    is kept across ``exec``; a USR2 in that moment is in the signal file)."""
    module = "kiln.experiments.launchers.slurm"
    return f"/bin/sh -c {shlex.quote(_IGNORING)} {shlex.quote(python)} -u -m {module}"


def kept_signals() -> list[str]:
    """The signal names the batch shell kept for this attempt's tasks (none outside SLURM)."""
    path = os.environ.get(SIGNAL_FILE_ENV)
    if not path:
        return []
    try:
        return Path(path).read_text().split()
    except OSError:  # none came
        return []
