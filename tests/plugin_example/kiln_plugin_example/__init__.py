"""An example kiln plugin package (tests only; kiln never imports it)."""
