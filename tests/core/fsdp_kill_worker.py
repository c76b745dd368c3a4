"""Run by test_fsdp_checkpoint: ``fsdp_kill_worker.py DIR STEP`` trains the sharded toy on 2
gloo ranks and SIGKILLs both once every rank has written its shards of step STEP's
checkpoint, before the staged directory is renamed into place."""

import os
import signal
import sys
from pathlib import Path

from test_fsdp_checkpoint import STEPS, sharded_run

from kiln.core import launch


def killed_run(root: Path, step: int) -> None:
    import torch.distributed as dist

    from kiln.core.checkpoints import save

    def cut_off(write):  # writes the staged directory a save renames into place
        def write_then_die(state, *, checkpoint_id, **kw):
            written = write(state, checkpoint_id=checkpoint_id, **kw)
            if f"step-{step:08d}" in Path(checkpoint_id).name:
                if hasattr(written, "result"):  # an asynchronous save
                    written.result()
                dist.barrier()  # every rank's shards are on disk
                os.kill(os.getpid(), signal.SIGKILL)
            return written

        return write_then_die

    # this worker process only, whichever way the run saves
    save.save, save.async_save = cut_off(save.save), cut_off(save.async_save)
    sharded_run(root, STEPS)


if __name__ == "__main__":
    launch(killed_run, 2, Path(sys.argv[1]), int(sys.argv[2]))
