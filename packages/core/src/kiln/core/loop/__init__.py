"""The loop: ``fit`` (``fit.py``) and its stages, ``setup``, ``train_step`` (``step.py``), what
follows each step on its periods (log, validate, checkpoint), and the pieces they use (data
order, optimizers, precision, compile, activation checkpointing, seeds, stopping on signals).

Nothing is imported here: each module is imported where it is used.
"""
