"""Hardware specs, the device catalog and cost models."""
