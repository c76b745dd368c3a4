"""``kiln-eval``: a trained model's metrics on a data split, logged to its W&B run."""
