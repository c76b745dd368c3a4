"""kiln.models."""
