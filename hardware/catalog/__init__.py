"""The device catalog: one TOML file per device, with the sources of its numbers (package data)."""
