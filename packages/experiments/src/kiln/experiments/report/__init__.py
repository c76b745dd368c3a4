"""``kiln-report``: the entry point (:mod:`.cli`), reading a sweep (:mod:`.load`), its train and
bench tables (:mod:`.train`, :mod:`.bench`), rendering (:mod:`.render`, :mod:`.plots`) and
logging to W&B (:mod:`.wandb_run`)."""
