"""Where kiln's Hydra configs live, for every entry point and the tests.

They ship inside this package (``kiln/experiments/configs``, Hydra's
``pkg://kiln.experiments.configs``), so an installed wheel finds them without any setting;
the repository's top-level ``configs`` is a symlink to that folder. ``$KILN_CONFIG_DIR``
replaces them with another folder.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

CONFIG_DIR_ENV = "KILN_CONFIG_DIR"
CONFIG_PACKAGE = "kiln.experiments.configs"


def config_dir() -> str:
    """kiln's config folder on disk: ``$KILN_CONFIG_DIR``, else the packaged one.

    Raises:
        FileNotFoundError: The folder holds no ``train.yaml``.
    """
    custom = os.environ.get(CONFIG_DIR_ENV)
    candidate = Path(custom) if custom else Path(__file__).resolve().parent.parent / "configs"
    if not (candidate / "train.yaml").is_file():
        where = f"${CONFIG_DIR_ENV}={custom}" if custom else "the kiln-experiments package"
        raise FileNotFoundError(
            f"no train.yaml in {candidate} ({where}); {CONFIG_DIR_ENV} must name a folder "
            "holding kiln's config groups (a copy of kiln/experiments/configs), or be unset"
        )
    return str(candidate.resolve())


def config_path() -> str:
    """What the entry points give ``hydra.main``: ``pkg://kiln.experiments.configs``, or
    the ``$KILN_CONFIG_DIR`` folder when it is set."""
    return config_dir() if os.environ.get(CONFIG_DIR_ENV) else f"pkg://{CONFIG_PACKAGE}"


def run_hydra_app(task: Callable[[Any], Any], config_name: str, register: Callable[[], None]):
    """Run ``task`` as a Hydra app over kiln's configs: the entry points' shared ``main``.

    Loads the ``kiln.plugins`` entry points first (their models, data modules, callbacks),
    then registers the command's typed schema.
    """
    import sys

    import hydra

    from kiln.experiments.settings.plugin_configs import missing_model_hint
    from kiln.experiments.settings.startup_gc import collection_held
    from kiln.models.plugins import load_plugins

    with collection_held():  # until a job's measured work (kiln.experiments.settings.startup_gc)
        load_plugins()
        register()
        hint = missing_model_hint(sys.argv[1:], config_dir())
        app = hydra.main(version_base="1.3", config_path=config_path(), config_name=config_name)
        try:
            return app(task)()
        except SystemExit as exit_:
            if exit_.code not in (0, None) and hint:  # after Hydra's "Could not find 'model/x'"
                print(hint, file=sys.stderr)
            raise
