"""Hydra search-path plugin: installed kiln plugins' config folders join kiln's.

Hydra finds it by scanning ``hydra_plugins``; it appends each folder that
:func:`kiln.experiments.settings.plugin_configs.plugin_config_dirs` finds, after kiln's own (a
plugin cannot shadow kiln's configs). ``kiln-train model=<plugin model>`` then needs no
``hydra.searchpath``.
"""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

from kiln.experiments.settings.plugin_configs import plugin_config_dirs


class KilnPluginConfigs(SearchPathPlugin):
    """Appends the installed kiln plugins' config folders to Hydra's search path."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        for folder in plugin_config_dirs():
            search_path.append(provider="kiln-plugin", path=f"file://{folder}")
