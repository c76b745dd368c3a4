"""``kiln-export``: a trained model as its own library's files (no kiln needed to load it)."""
