"""Which data configs a model trains on: a model and data of different tasks are refused in
the config stage, naming the data configs that fit and the experiments that set both.

A model's task trains on the data class of its module's ``tiny_data()``
(:func:`kiln.models.registry.task_data_class`); a data config fits when its ``_target_`` is
that class or a subclass. Data of no registered task (a user's own module) is left to the
model's ``attach`` checks.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml


def _config_files(group: str) -> list[Path]:
    from kiln.experiments.settings.compose import config_dir

    return sorted((Path(config_dir()) / group).glob("*.yaml"))


def _read(path: Path) -> dict[str, Any]:
    try:
        return _parsed(path, path.stat().st_mtime_ns)
    except OSError:
        return {}


@functools.lru_cache(maxsize=256)
def _parsed(path: Path, mtime_ns: int) -> dict[str, Any]:
    """A config file's YAML, once per version of it (a refusal reads every data config)."""
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _class(target: Any) -> type | None:
    from hydra.utils import get_object

    try:
        found = get_object(str(target))
    except Exception:
        return None
    return found if isinstance(found, type) else None


def data_configs_for(data_class: type) -> list[str]:
    """The shipped ``data`` configs whose ``_target_`` is ``data_class`` or a subclass."""
    fits = []
    for path in _config_files("data"):
        found = _class(_read(path).get("_target_"))
        if found is not None and issubclass(found, data_class):
            fits.append(path.stem)
    return fits


def experiments_for(model: str, task: str) -> list[str]:
    """The shipped experiments for ``model`` (``experiment=<e>``), else those of its task
    (``experiment=<e> model=<model>``)."""
    from kiln.models.registry import get_model_entry

    own, same_task = [], []
    for path in _config_files("experiment"):
        overrides = {}
        for item in _read(path).get("defaults") or []:
            if isinstance(item, dict):
                overrides.update({str(k).split("/")[-1]: v for k, v in item.items()})
        option = overrides.get("model")
        name = _read(path.parent.parent / "model" / f"{option}.yaml").get("name", option)
        if name == model:
            own.append(f"experiment={path.stem}")
            continue
        try:
            if name is not None and get_model_entry(str(name)).task == task:
                same_task.append(f"experiment={path.stem} model={model}")
        except ValueError:
            continue
    return own or same_task


def check_model_fits_data(model: dict[str, Any] | None, data: dict[str, Any] | None) -> None:
    """Refuse a model and a data module of different tasks.

    Raises:
        ValueError: One line naming both, the data configs that fit the model and the
            experiments that set both.
    """
    from kiln.models.registry import get_model_entry, list_models, task_data_class

    if not model or not data or "_target_" not in data or "name" not in model:
        return
    try:
        wanted = task_data_class(model["name"])
    except ValueError:
        return  # an unknown model: the config stage refuses it by name
    data_class = _class(data["_target_"])
    if data_class is None or wanted is None or issubclass(data_class, wanted):
        return
    tasks = {}  # the tasks whose data this is: a user's own data module has none
    for name in list_models():
        fitting = task_data_class(name)
        if fitting is not None and issubclass(data_class, fitting):
            tasks[get_model_entry(name).task] = None
    if not tasks:
        return
    task = get_model_entry(model["name"]).task
    configs = data_configs_for(wanted)
    data_fix = (
        f"data configs that fit it: {', '.join(f'data={c}' for c in configs)}"
        if configs
        else f"it needs a {wanted.__name__}"
    )
    experiments = experiments_for(model["name"], task)
    both = f"; or an experiment that sets both: {', '.join(experiments)}" if experiments else ""
    raise ValueError(
        f"model={model['name']} ({task}) does not train on {_data_option()} "
        f"({data_class.__name__}, {' or '.join(tasks)} data): {data_fix}{both}"
    )


def _data_option() -> str:
    """``data=<option>`` as this job chose it, where Hydra knows."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return f"data={HydraConfig.get().runtime.choices['data']}"
    except Exception:
        return "this data"
