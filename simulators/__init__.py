"""SimPy schedulers that run an op graph on engines and return a Timeline."""
