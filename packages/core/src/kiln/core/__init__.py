"""kiln.core."""
