"""The version of kiln's three packages (kiln-core, kiln-models, kiln-experiments): their
``pyproject.toml`` files read it from here, so one line sets all three."""

__version__ = "0.1.0"
