"""Coverage expectation data files (TOML); a package so that they ship with the wheel."""
