"""Runnable examples: ``python -m kiln.models.examples.<name> --help``."""
