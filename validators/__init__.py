"""Replay of ops on a device, numeric checks, coverage and sweeps."""
