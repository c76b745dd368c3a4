"""The ``TrainerConfig`` the tests train with, in one place (importable from every test
folder: pytest puts ``tests/`` on the path for its ``conftest.py``)."""

from __future__ import annotations

from typing import Any

from kiln.core import TrainerConfig

TEST_TRAINER: dict[str, Any] = dict(
    accelerator="cpu", progress=False, log_every_n_steps=1, max_steps=4
)
"""On the CPU, no progress bar, a log row every step, 4 steps."""


def trainer_config(**overrides: Any) -> TrainerConfig:
    """:data:`TEST_TRAINER` with ``overrides`` (any ``TrainerConfig`` field)."""
    return TrainerConfig(**{**TEST_TRAINER, **overrides})
