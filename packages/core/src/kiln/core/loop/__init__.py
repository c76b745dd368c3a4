"""The loop: ``fit`` (``fit.py``) and its stages, ``setup``, ``resume``, ``train_step``
(``step.py``), what follows each step on its periods (log, validate, checkpoint), and the
pieces they use (data order, optimizers, precision, compile, activation checkpointing, seeds).

Nothing is imported here: import a name from its module (``kiln.core`` exports only what
a user of ``fit`` needs).
"""
