"""``python -m opgraph`` runs the CLI."""

from opgraph.cli.app import main

main()
