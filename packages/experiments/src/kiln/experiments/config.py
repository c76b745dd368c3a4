"""Where kiln's Hydra configs live (``configs/``), for every entry point and the tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

CONFIG_DIR_ENV = "KILN_CONFIG_DIR"


def config_dir() -> str:
    """The ``configs/`` directory: ``$KILN_CONFIG_DIR``, else the repository's (editable install).

    Raises:
        FileNotFoundError: Neither holds ``train.yaml``.
    """
    candidates = []
    if os.environ.get(CONFIG_DIR_ENV):
        candidates.append(Path(os.environ[CONFIG_DIR_ENV]))
    else:
        # packages/experiments/src/kiln/experiments/config.py -> the repository root
        candidates += [Path(__file__).resolve().parents[5] / "configs", Path.cwd() / "configs"]
    for candidate in candidates:
        if (candidate / "train.yaml").is_file():
            return str(candidate.resolve())
    raise FileNotFoundError(
        f"no train.yaml in {', '.join(map(str, candidates))}; set {CONFIG_DIR_ENV} to kiln's "
        "configs/ directory"
    )


def run_hydra_app(task: Callable[[Any], Any], config_name: str, register: Callable[[], None]):
    """Run ``task`` as a Hydra app over kiln's configs: the entry points' shared ``main``.

    Loads the ``kiln.plugins`` entry points first (their models, data modules, callbacks),
    then registers the command's typed schema.
    """
    import hydra

    from kiln.models.plugins import load_plugins

    load_plugins()
    register()
    return hydra.main(version_base="1.3", config_path=config_dir(), config_name=config_name)(task)()
