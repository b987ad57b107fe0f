"""The configuration: its sections and fields, where values come from (presets, TOML, `--set`,
flags), their checks, the layer kinds and the size rule."""
