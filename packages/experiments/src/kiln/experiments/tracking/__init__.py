"""Experiment tracking: the job's W&B run (:mod:`.tracker`), its tags, wandb's Fabric logger,
and a reader of offline ``.wandb`` files (:mod:`.wandb_files`)."""
