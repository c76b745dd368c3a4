"""SLURM: preemption, requeue, the batch shell's part."""
