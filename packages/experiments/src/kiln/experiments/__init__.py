"""kiln.experiments."""
