"""One job's life: its record, lock, stages and console tables, the sweep scanner, and a
trained model rebuilt from a checkpoint."""
