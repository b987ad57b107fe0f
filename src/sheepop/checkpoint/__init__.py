"""A run directory's checkpoint: its format (safetensors + JSON), the checks before a read, and
the save that commits all files together or none."""
