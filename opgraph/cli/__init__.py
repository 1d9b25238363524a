"""The ``opgraph`` command line. Each subcommand lives in its own module under ``commands/``."""
